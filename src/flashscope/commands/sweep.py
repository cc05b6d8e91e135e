"""``flashscope sweep``: config sweeps offline or on the GPU, Pareto fronts, guided search,
tuned data files.

Writes into ``--out DIR``: ``results.jsonl`` (one record per point, appended as it
finishes), ``summary.json`` (counts, best config and Pareto fronts per problem, evolve
traces; what ``--json`` prints), ``summary.csv`` (one row per problem) and ``pareto.png``.
``--compare EXHAUSTIVE.jsonl EVOLVE.jsonl`` instead writes ``compare.json``: how close
evolve came to the exhaustive optimum, with what fraction of the evaluations, measured and
replayed against the exhaustive table.

One sweep at a time writes a folder (a second is refused while the first holds the
results file's lock), and a sweep killed at any moment keeps every finished record and
leaves no worker process behind; ``--resume`` continues it.

``--kernel bwd_dkdv|bwd_dq`` sweeps a backward kernel offline (axes BLOCK_M1, BLOCK_N1,
BLOCK_M2, BLOCK_N2, num_warps, num_stages, maxnreg, waves_per_eu), exhaustively.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import FlashscopeError
from . import common

HELP = "sweep configs offline or on the GPU; Pareto fronts, evolve search, tuned files"

#: Points one sweep may list (problems x axis values, before pruning): the built-in spaces
#: hold tens per problem; a space past this would run for weeks on the CPU.
MAX_POINTS = 100_000


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
    common.add_target(g, default=None, help="override the space's targets, e.g. "
                                            "sm90,gfx942 or H100")
    common.add_dtype(g, default=None, help="override the space's dtypes: bf16,fp16")
    common.add_head_dim(g, default=None, help="override the space's head dims, e.g. 64,128")
    common.add_causal(g, default=None, help="override the space's causal flags: no, yes "
                                            "or both (--causal alone: yes)")
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
    g.add_argument("--budget", type=common.integer(0), default=0,
                   help="evolve: new evaluations per problem")
    g.add_argument("--seed", type=common.integer(0), default=0, help="evolve: random seed")
    g.add_argument("--history", action="append", default=[], metavar="JSONL",
                   help="evolve: earlier results whose scores are known (repeatable)")
    g = p.add_argument_group("running")
    g.add_argument("--out", default="sweep-out",
                   help="output folder (default sweep-out; its parent must exist)")
    g.add_argument("--resume", action="store_true",
                   help="continue the sweep in --out, skipping finished points")
    g.add_argument("--executor", default="local", choices=("local", "gpus", "ray"),
                   help="local process pool (default), one worker per GPU, or Ray "
                        "(pip install \"flashscope[ray]\")")
    g.add_argument("--address", help="Ray cluster address (ray.init's address)")
    g.add_argument("--devices", help="GPU ids for --executor gpus (default: all visible)")
    g.add_argument("--jobs", type=common.integer(0), default=0,
                   help="local worker processes (default 0: one per core)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("results")
    g.add_argument("--write-tuned", nargs="?", const="", default=None, metavar="DIR",
                   help="write the best GPU configs as tuned data files (default: the "
                        "package's data/tuned)")
    g.add_argument("--no-plot", action="store_true", help="skip pareto.png")
    g.add_argument("--compare", nargs=2, metavar=("EXHAUSTIVE", "EVOLVE"),
                   help="compare an evolve results file with an exhaustive one")
    common.add_output(g, out=False,  # --out is the sweep's folder, above
                      force_help="replace a summary, plot or comparison already in --out, "
                                 "and --write-tuned entries for the same problem")
    p.set_defaults(func=run)


def _read_space(path, kernel):
    """``--space FILE`` through the hardened JSON reader, then the space's own checks; a
    value of a type no check expects (a list where a name belongs) names the file."""
    from ..errors import ConfigError
    from ..sweep.space import parse_space

    data = common.read_json(path, "--space")
    try:
        return parse_space(data, f"--space {path}", kernel)
    except (TypeError, ValueError, OverflowError, AttributeError) as e:
        if isinstance(e, FlashscopeError):
            raise
        raise ConfigError(f"--space {path}: a value of the wrong type ({e})") from None


def build_space(args):
    from ..sweep.space import default_space, parse_space, restrict

    targets = [t.name for t in args.target] if args.target else None
    dtypes = list(args.dtype) if args.dtype else None
    head_dims = list(args.head_dim) if args.head_dim else None
    causal = list(args.causal) if args.causal else None
    kernel = getattr(args, "kernel", "fwd")
    if args.space:
        space = restrict(_read_space(args.space, kernel), targets=targets, dtypes=dtypes,
                         head_dims=head_dims, causal=causal)
    else:
        space = default_space(targets or ["sm90"], dtypes or ["bfloat16"],
                              head_dims or [64, 128], causal or [False, True], kernel)
    # re-check overridden problem keys through the parser's rules
    for b in space.blocks:
        parse_space({"targets": list(b.targets), "dtypes": list(b.dtypes),
                     "head_dims": list(b.head_dims), "causal": list(b.causal),
                     **{k: list(v) for k, v in b.axes.items()}}, "space", kernel)
    points = sum(len(b.targets) * len(b.dtypes) * len(b.head_dims) * len(b.causal)
                 * math.prod(len(v) for v in b.axes.values()) for b in space.blocks)
    if points > MAX_POINTS:
        raise FlashscopeError(f"space: {points:,} points (problems x axis values) is more "
                              f"than a sweep can finish (at most {MAX_POINTS:,}); give "
                              "fewer values per axis or use --search evolve with a budget")
    return space


def _shapes(args) -> tuple:
    out = []
    for s in args.shapes:
        out.extend(x.strip() for x in s.replace(" ", ";").split(";") if x.strip())
    return tuple(out)


def _check_out(args, out: Path) -> None:
    """Before any work: --out is a writable folder (or can be made), and the files a sweep
    replaces are replaced only with --resume or --force."""
    results = out / "results.jsonl"
    if not args.resume and results.is_file() and results.stat().st_size > 0:
        raise FlashscopeError(f"--out: {results} already holds results; pass --resume to "
                              "continue that sweep or choose another --out")
    names = [] if args.resume or args.force else ["summary.json", "summary.csv",
                                                   "pareto.png"]
    common.check_out_dir(out, names)
    for path in args.history:
        common.check_input_file(path, "--history")
    if args.write_tuned:
        common.check_out_dir(args.write_tuned, [], flag="--write-tuned")


def run(args) -> int:
    out = Path(args.out)
    if args.compare:
        return _compare(args, out)
    from ..sweep.run import SweepRequest, run_sweep

    if args.gpu and args.kernel.startswith("bwd"):
        raise FlashscopeError(f"--gpu with --kernel {args.kernel}: GPU sweeps time the "
                              "forward kernels; read backward configs offline")
    space = build_space(args)
    shapes = _shapes(args)
    if args.gpu and not args.shapes:
        raise FlashscopeError("--gpu needs --shapes B,H,N,D (e.g. 4,32,4096,64)")
    if args.gpu and not args.head_dim and not args.space:
        from ..sweep.evaluate import parse_gpu_shape
        from ..sweep.space import restrict

        space = restrict(space, head_dims=sorted({parse_gpu_shape(s)[3] for s in shapes}))
    if args.write_tuned is not None and not args.gpu:
        raise FlashscopeError("--write-tuned needs --gpu: tuned files hold measured configs")
    _check_out(args, out)
    if args.gpu and args.executor != "ray":
        _check_device(space)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()] \
        if args.devices else None
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
        from ..sweep.evaluate import odd_shape_check
        from ..sweep.store import read_records
        from ..sweep.tuned import write_tuned

        check = odd_shape_check if args.no_odd_shapes else None
        paths = write_tuned(read_records(results_path), args.write_tuned or None, check=check,
                            source=f"flashscope sweep --gpu --search {summary['search']}, "
                                   f"{time_stamp()}", force=args.force)
        summary["tuned_files"] = [str(p) for p in paths]
    rows = [_job_row(j) for j in summary["jobs"]]
    common.write_atomic(out / "summary.json", common.json_text(summary))
    common.write_atomic(out / "summary.csv", common.csv_text(rows))
    common.emit(args, summary, rows=rows, render=lambda con: _print(con, summary))
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
                              f"targets {', '.join(sorted(targets))}; pass --target {dev}")


def _job_row(j) -> dict:
    b = j["best"] or {}
    return {"job": j["job"], "target": j.get("target"), "dtype": j.get("dtype"),
            "head_dim": j.get("head_dim"), "causal": j.get("causal"), "shape": j.get("shape"),
            "feasible": j["feasible"], "pruned": j["pruned"], "ok": j["ok"],
            "failed": j["failed"], "best_config": b.get("config_key"),
            "best_ms": b.get("ms"), "best_tflops": b.get("tflops"),
            "best_registers": b.get("registers"), "best_occupancy": b.get("occupancy")}


def _print(con, summary) -> None:
    gpu = summary["kind"] == "gpu"
    t = common.table("problem", "feasible", "pruned", "ok", "failed", "best",
                     "time (ms)" if gpu else "regs per thread",
                     "TFLOP/s" if gpu else "occupancy",
                     title=f"{summary['kind']} sweep ({summary['search']}), "
                           f"{summary['new_records']} new records, {summary['seconds']} s",
                     left=("problem", "best"))
    for j in summary["jobs"]:
        b = j["best"] or {}
        if gpu:
            m1 = f"{b['ms']:.4f}" if "ms" in b else "-"
            m2 = f"{b['tflops']:.1f}" if "tflops" in b else "-"
        else:
            m1 = str(b.get("registers", "-"))
            m2 = common.pct(b.get("occupancy"))
        t.add_row(j["job"], str(j["feasible"]), str(j["pruned"]), str(j["ok"]),
                  str(j["failed"]), b.get("label", b.get("config_key", "-")), m1, m2)
    common.show(con, t)
    for path in summary.get("tuned_files", []):
        con.print(f"tuned: {path}")
    con.print(f"results: {summary['out']}")


def _compare(args, out: Path) -> int:
    from ..sweep.run import compare_searches, replay_evolve
    from ..sweep.store import read_records

    for f in args.compare:
        common.check_input_file(f, "--compare")
    common.check_out_dir(out, ["compare.json"], args.force)
    ex, evo = (read_records(f) for f in args.compare)
    rows = compare_searches(ex, evo)
    if not rows:
        raise FlashscopeError("--compare: no job has measured records in both files")
    budgets = {r["evolve_evaluations"] for r in rows}
    replay = replay_evolve(ex, max(budgets)) if max(budgets) else []
    doc = {"measured": rows, "replayed": replay}
    out.mkdir(exist_ok=True)
    common.write_atomic(out / "compare.json", common.json_text(doc))

    def render(con):
        t = common.table("problem", "shape", "exhaustive best", "evals", "evolve best",
                         "evals", "fraction", "choice/opt", "rank",
                         left=("problem", "shape", "exhaustive best", "evolve best"))
        for r in rows:
            t.add_row(f"{r['target']} {r['dtype']} D={r['head_dim']} "
                      f"{'causal' if r['causal'] else 'full'}", str(r["shape"]),
                      r["exhaustive_best"], str(r["exhaustive_evaluations"]),
                      str(r.get("evolve_best", "-")), str(r["evolve_evaluations"]),
                      str(r.get("fraction_of_evaluations", "-")),
                      str(r.get("evolve_choice_over_optimum", "-")),
                      f"{r.get('evolve_choice_rank', '-')}/{r.get('ranked', '-')}")
        common.show(con, t)
        con.print(f"compare: {out / 'compare.json'}")
    common.emit(args, doc, rows=rows, render=render)
    return 0
