"""``flashscope sweep``: config sweeps offline or on the GPU, Pareto fronts, guided search,
tuned data files.

Writes into ``--out DIR``: ``results.jsonl`` (one record per point, appended as it
finishes), ``summary.json`` (counts, best config and Pareto fronts per problem, evolve
traces) and ``pareto.png``. ``--compare EXHAUSTIVE.jsonl EVOLVE.jsonl`` instead writes
``compare.json``: how close evolve came to the exhaustive optimum, with what fraction of
the evaluations, measured and replayed against the exhaustive table.

``--kernel bwd_dkdv|bwd_dq`` sweeps a backward kernel offline (axes BLOCK_M1, BLOCK_N1,
BLOCK_M2, BLOCK_N2, num_warps, num_stages, maxnreg, waves_per_eu), exhaustively.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import FlashscopeError

HELP = "sweep configs offline or on the GPU; Pareto fronts, evolve search, tuned files"


def register(sub) -> None:
    p = sub.add_parser("sweep", help=HELP, description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("space")
    g.add_argument("--space", metavar="FILE", help="JSON space (keys: targets, dtypes, "
                   "head_dims, causal, and the kernel family's knobs, e.g. BLOCK_M, "
                   "BLOCK_N, num_warps, num_stages, Q_IN_REGS, maxnreg, waves_per_eu; or "
                   "{\"spaces\": [...]}); default: built-in")
    g.add_argument("--kernel", default="fwd",
                   choices=("fwd", "triton-fwd", "sm90-fwd", "bwd_dkdv", "bwd_dq"),
                   help="kernel to sweep (default fwd: the portable forward); sm90-fwd: the "
                        "Hopper forward (axes: BLOCK_M, BLOCK_N, num_stages and its "
                        "switches); a backward space's keys are BLOCK_M1, BLOCK_N1, "
                        "BLOCK_M2, BLOCK_N2, num_warps, num_stages, maxnreg, waves_per_eu "
                        "(offline, exhaustive)")
    g.add_argument("--targets", help="override the space's targets, e.g. sm90,gfx942")
    g.add_argument("--dtypes", help="override dtypes: bf16,fp16")
    g.add_argument("--head-dims", help="override head dims, e.g. 64,128")
    g.add_argument("--causal", choices=("both", "true", "false"),
                   help="override the causal flags")
    g = p.add_argument_group("what to measure")
    g.add_argument("--gpu", action="store_true",
                   help="time each config on the GPU (validated, bench harness)")
    g.add_argument("--shapes", action="append", default=[], metavar="B,H,N,D",
                   help="GPU shapes (repeat, or separate with ';'); each pairs with the "
                        "space's problems of its head dim")
    g.add_argument("--no-odd-shapes", action="store_true",
                   help="GPU: validate each config on the timed shape only (faster: no "
                        "extra compile per config); --write-tuned then checks the winners "
                        "on the odd shapes before writing them")
    g.add_argument("--search", default="exhaustive", choices=("exhaustive", "evolve"))
    g.add_argument("--budget", type=int, default=0,
                   help="evolve: new evaluations per problem")
    g.add_argument("--seed", type=int, default=0, help="evolve: random seed")
    g.add_argument("--history", action="append", default=[], metavar="JSONL",
                   help="evolve: earlier results whose scores are known (repeatable)")
    g = p.add_argument_group("running")
    g.add_argument("--out", default="sweep-out", help="output directory (default sweep-out)")
    g.add_argument("--resume", action="store_true",
                   help="continue the sweep in --out, skipping finished points")
    g.add_argument("--executor", default="local", choices=("local", "gpus", "ray"),
                   help="local process pool (default), one worker per GPU, or Ray")
    g.add_argument("--address", help="Ray cluster address (ray.init's address)")
    g.add_argument("--devices", help="GPU ids for --executor gpus (default: all visible)")
    g.add_argument("--jobs", type=int, default=0, help="local worker processes (0: cores)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("results")
    g.add_argument("--write-tuned", nargs="?", const="", default=None, metavar="DIR",
                   help="write the best GPU configs as tuned data files (default: the "
                        "package's data/tuned)")
    g.add_argument("--no-plot", action="store_true", help="skip pareto.png")
    g.add_argument("--compare", nargs=2, metavar=("EXHAUSTIVE", "EVOLVE"),
                   help="compare an evolve results file with an exhaustive one")
    p.set_defaults(func=run)


def _csv(text, what, conv=str):
    vals = [x.strip() for x in str(text).split(",") if x.strip()]
    if not vals:
        raise FlashscopeError(f"--{what}: expected a comma-separated list, got {text!r}")
    try:
        return [conv(v) for v in vals]
    except ValueError:
        raise FlashscopeError(f"--{what}: {text!r} is not a list of integers") from None


def build_space(args):
    from ..bench.suite import parse_dtype
    from ..sweep.space import default_space, load_space, restrict

    targets = _csv(args.targets, "targets") if args.targets else None
    dtypes = [parse_dtype(d) for d in _csv(args.dtypes, "dtypes")] if args.dtypes else None
    head_dims = _csv(args.head_dims, "head-dims", int) if args.head_dims else None
    causal = {"both": [False, True], "true": [True], "false": [False], None: None}[args.causal]
    kernel = getattr(args, "kernel", "fwd")
    if args.space:
        space = restrict(load_space(args.space, kernel), targets=targets, dtypes=dtypes,
                         head_dims=head_dims, causal=causal)
    else:
        space = default_space(targets or ["sm90"], dtypes or ["bfloat16"],
                              head_dims or [64, 128], causal or [False, True], kernel)
    # re-check overridden problem keys through the parser's rules
    from ..sweep.space import parse_space

    for b in space.blocks:
        parse_space({"targets": list(b.targets), "dtypes": list(b.dtypes),
                     "head_dims": list(b.head_dims), "causal": list(b.causal),
                     **{k: list(v) for k, v in b.axes.items()}}, "space", kernel)
    return space


def _shapes(args) -> tuple:
    out = []
    for s in args.shapes:
        out.extend(x.strip() for x in s.replace(" ", ";").split(";") if x.strip())
    return tuple(out)


def run(args) -> int:
    from rich.console import Console

    console = Console()
    out = Path(args.out)
    if args.compare:
        return _compare(args, out, console)
    from ..sweep.run import SweepRequest, run_sweep

    if args.gpu and args.kernel.startswith("bwd"):
        raise FlashscopeError(f"--gpu with --kernel {args.kernel}: GPU sweeps time the "
                              "forward kernels; read backward configs offline")
    space = build_space(args)
    shapes = _shapes(args)
    if args.gpu and not args.shapes:
        raise FlashscopeError("--gpu needs --shapes B,H,N,D (e.g. 4,32,4096,64)")
    if args.gpu and not args.head_dims and not args.space:
        from ..sweep.evaluate import parse_gpu_shape
        from ..sweep.space import restrict

        space = restrict(space, head_dims=sorted({parse_gpu_shape(s)[3] for s in shapes}))
    if args.jobs < 0:
        raise FlashscopeError(f"--jobs {args.jobs}: expected 0 (all cores) or more")
    if args.write_tuned is not None and not args.gpu:
        raise FlashscopeError("--write-tuned needs --gpu: tuned files hold measured configs")
    if args.gpu and args.executor != "ray":
        _check_device(space)
    devices = _csv(args.devices, "devices") if args.devices else None
    req = SweepRequest(space=space, out=out / "results.jsonl", gpu=args.gpu, shapes=shapes,
                       search=args.search, budget=args.budget, seed=args.seed,
                       resume=args.resume, executor=args.executor, jobs=args.jobs,
                       address=args.address, devices=devices, history=tuple(args.history),
                       progress=not args.no_progress, odd_shapes=not args.no_odd_shapes)
    summary = run_sweep(req)
    results_path = out / "results.jsonl"
    if not args.no_plot:
        from ..sweep.plot import plot_pareto
        from ..sweep.store import read_records

        png = plot_pareto(read_records(results_path), out / "pareto.png", summary["kind"])
        summary["plot"] = str(png) if png else None
    if args.write_tuned is not None:
        from ..sweep.store import read_records
        from ..sweep.tuned import write_tuned

        from ..sweep.evaluate import odd_shape_check

        check = odd_shape_check if args.no_odd_shapes else None
        paths = write_tuned(read_records(results_path), args.write_tuned or None, check=check,
                            source=f"flashscope sweep --gpu --search {summary['search']}, "
                                   f"{time_stamp()}")
        summary["tuned_files"] = [str(p) for p in paths]
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    _print(console, summary)
    return 0


def time_stamp() -> str:
    import time

    return time.strftime("%Y-%m-%d")


def _check_device(space) -> None:
    import torch

    from ..api import device_target

    if not torch.cuda.is_available():
        raise FlashscopeError("--gpu: no CUDA/ROCm device visible")
    dev = device_target(torch.device("cuda"))
    targets = {p.target for p in space.problems()}
    if dev is None or targets != {dev}:
        raise FlashscopeError(f"--gpu: the device is {dev or 'unknown'} but the space "
                              f"targets {', '.join(sorted(targets))}; pass --targets {dev}")


def _print(console, summary) -> None:
    from rich.table import Table

    gpu = summary["kind"] == "gpu"
    t = Table("problem", "feasible", "pruned", "ok", "failed", "best",
              "ms" if gpu else "regs", "TFLOP/s" if gpu else "occupancy",
              title=f"{summary['kind']} sweep ({summary['search']}), "
                    f"{summary['new_records']} new records, {summary['seconds']} s")
    for j in summary["jobs"]:
        b = j["best"] or {}
        if gpu:
            m1 = f"{b['ms']:.4f}" if "ms" in b else "-"
            m2 = f"{b['tflops']:.1f}" if "tflops" in b else "-"
        else:
            m1 = str(b.get("registers", "-"))
            m2 = f"{b['occupancy']:.3f}" if "occupancy" in b else "-"
        t.add_row(j["job"], str(j["feasible"]), str(j["pruned"]), str(j["ok"]),
                  str(j["failed"]), b.get("label", b.get("config_key", "-")), m1, m2)
    console.print(t)
    for path in summary.get("tuned_files", []):
        console.print(f"tuned: {path}")
    console.print(f"results: {summary['out']}")


def _compare(args, out: Path, console) -> int:
    from rich.table import Table

    from ..sweep.run import compare_searches, replay_evolve
    from ..sweep.store import read_records

    for f in args.compare:
        if not Path(f).is_file():
            raise FlashscopeError(f"--compare {f}: no such file")
    ex, evo = (read_records(f) for f in args.compare)
    rows = compare_searches(ex, evo)
    if not rows:
        raise FlashscopeError("--compare: no job has measured records in both files")
    budgets = {r["evolve_evaluations"] for r in rows}
    replay = replay_evolve(ex, max(budgets)) if max(budgets) else []
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps({"measured": rows, "replayed": replay},
                                                 indent=1) + "\n")
    t = Table("problem", "shape", "exhaustive best", "evals", "evolve best", "evals",
              "fraction", "choice/opt", "rank")
    for r in rows:
        t.add_row(f"{r['target']} {r['dtype']} D={r['head_dim']} "
                  f"{'causal' if r['causal'] else 'full'}", str(r["shape"]),
                  r["exhaustive_best"], str(r["exhaustive_evaluations"]),
                  str(r.get("evolve_best", "-")), str(r["evolve_evaluations"]),
                  str(r.get("fraction_of_evaluations", "-")),
                  str(r.get("evolve_choice_over_optimum", "-")),
                  f"{r.get('evolve_choice_rank', '-')}/{r.get('ranked', '-')}")
    console.print(t)
    console.print(f"compare: {out / 'compare.json'}")
    return 0
