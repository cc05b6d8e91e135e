"""``flashscope bench``: validate, then time attention providers on the standard suite or
given shapes; table in the terminal, JSON/CSV/PNG/markdown files on request."""

from __future__ import annotations

import argparse
import os

FORMULAS = """\
metrics:
  latency  median ms of triton.testing.do_bench (L2 flushed before every call), or of
           do_bench_cudagraph with --cuda-graph
  tflops   FLOPs / latency, FLOPs = 4*B*H*Nq*Nk*D, x0.5 when causal,
           x2.5 for bwd (the backward alone), x3.5 for fwd+bwd
  speedup  baseline latency / provider latency, same case, same run
  gemm     % of the bf16 GEMM ceiling (8192^3, measured at the start of the run)
  copy     % of the device-to-device copy ceiling (bytes read + written, measured at the
           start): minimum bytes = read Q,K,V + write O,LSE (fwd); + dO,O and dQ,dK,dV (bwd)
  memory   peak MiB allocated during one call beyond the live inputs
  error    worst relative error max|out-ref|/max|ref| over the validations

validation (before any timing counts; a failure shows the reason and no speed):
  fresh random inputs; float64 reference (float32 for large shapes); allocations poisoned
  with NaN so unwritten output is caught; bound per dtype (fp16 2e-3, bf16 1.6e-2; grads
  x2); inputs must be unchanged; a second call on new inputs after the reference ran
  (stale/cached results); odd shapes (N=127, Nq!=Nk, GQA); the last timed call's output
  is checked too.

standard suite: B*N = 16384, H*D = 2048, N in 512..16384, D in 64,128,256, causal and not.
"""


def _csv(text):
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def register(sub):
    p = sub.add_parser("bench", help="validate and time attention providers",
                       description=__doc__, epilog=FORMULAS,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list-baselines", action="store_true",
                   help="list the providers, whether each is available here, and why not")
    p.add_argument("--suite", nargs="?", const="standard", choices=("standard", "models"),
                   help="run a named suite: standard (the default with a bare --suite: "
                        "B*N = 16384, H*D = 2048 over --head-dims and --lengths) or models "
                        "(the attention shapes of real models, from src/flashscope/data/"
                        "suites/models.json)")
    p.add_argument("--shape", action="append", default=[], metavar="B,H,N,D[,Nk[,Hkv]]",
                   help="a user shape (repeatable)")
    p.add_argument("--dtype", default="bf16", help="comma list of bf16, fp16 (default bf16)")
    p.add_argument("--mode", default="fwd", help="comma list of fwd, bwd, fwd+bwd")
    p.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    p.add_argument("--head-dims", default="64,128,256", help="suite head dims (comma list)")
    p.add_argument("--lengths", default=None, help="suite lengths N (comma list; "
                                                   "default 512..16384)")
    p.add_argument("--only", help="comma list of providers to run")
    p.add_argument("--skip", help="comma list of providers to leave out")
    p.add_argument("--metrics", help="comma list of table columns: latency, tflops, "
                                     "speedup, gemm, copy, memory, error (default all)")
    p.add_argument("--baseline", help="provider the speedup is measured against "
                                      "(default: sdpa-cudnn, else the first available)")
    p.add_argument("--config", help="flashscope forward config, KEY=VALUE,... "
                                    "(e.g. BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=2)")
    p.add_argument("--cuda-graph", action="store_true", help="time with do_bench_cudagraph")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every provider of a case this many times, in rounds of "
                        "shuffled (seeded) order, and keep the median (the GPU's clock "
                        "drifts over a run and follows the previous burst's power; a "
                        "fixed order biases the comparison)")
    p.add_argument("--no-ceilings", action="store_true",
                   help="skip measuring the GEMM and copy ceilings")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="cpu runs flashscope in Triton's interpreter (tests, tiny shapes)")
    p.add_argument("--json", metavar="FILE", help="write results as JSON")
    p.add_argument("--csv", metavar="FILE", help="write results as CSV")
    p.add_argument("--png", metavar="FILE", help="write TFLOP/s-vs-N charts")
    p.add_argument("--out", metavar="DIR", help="write bench.json, bench.csv, bench.png and "
                                               "bench.md (markdown table) into DIR")
    p.set_defaults(func=run, _parser=p)


def command_line(args) -> list:
    """The arguments that reproduce this run (options at non-default values, in the
    parser's order); written into every results file."""
    parser = args._parser
    argv = ["bench"]
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help",):
            continue
        value = getattr(args, action.dest, None)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
        elif isinstance(value, list):
            for v in value:
                argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    return argv


def _device(args):
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        from ..testing.interpreter import patch_bf16_dot

        patch_bf16_dot()
    return torch.device(args.device)


def list_baselines(device, console) -> None:
    from rich.table import Table

    from ..bench.providers import REGISTRY

    t = Table(title=f"providers on {device}")
    for col in ("name", "available", "backward", "GQA", "baseline", "layout", "description"):
        t.add_column(col, overflow="fold")
    for p in REGISTRY.values():
        why = p.available(device)
        t.add_row(p.name, "yes" if why is None else f"no: {why}",
                  "yes" if p.has_backward else "no", "yes" if p.gqa else "no",
                  "yes" if p.baseline else "no", p.layout, p.description)
    console.print(t)


def run(args) -> int:
    from pathlib import Path

    from rich.console import Console

    from ..errors import FlashscopeError

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    argv = command_line(args)
    device = _device(args)
    if args.list_baselines:
        list_baselines(device, console)
        return 0

    from ..bench import output, providers, suite
    from ..bench.harness import run_bench
    from ..bench.timing import Timer

    metrics = output.parse_metrics(args.metrics)
    dtypes = [suite.parse_dtype(d) for d in _csv(args.dtype) or ["bf16"]]
    modes = [suite.parse_mode(m) for m in _csv(args.mode) or ["fwd"]]
    causal = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    try:
        head_dims = [int(x) for x in _csv(args.head_dims)]
        lengths = [int(x) for x in _csv(args.lengths)] if args.lengths else suite.SUITE_LENGTHS
    except (TypeError, ValueError):
        raise FlashscopeError("--head-dims/--lengths: expected comma lists of integers, "
                              "e.g. 64,128") from None
    if any(x <= 0 for x in (*head_dims, *lengths)):
        raise FlashscopeError("--head-dims/--lengths: expected positive integers")
    if not args.suite and not args.shape:
        raise FlashscopeError("give --suite and/or --shape B,H,N,D[,Nk[,Hkv]] "
                              "(or --list-baselines)")
    cases = suite.user_cases(args.shape, dtypes=dtypes, causal=causal, modes=modes)
    if args.suite == "standard":
        cases += suite.standard_suite(dtypes=dtypes, head_dims=head_dims, lengths=lengths,
                                      causal=causal, modes=modes)
    elif args.suite:
        cases += suite.table_suite(args.suite, dtypes=dtypes, modes=modes)
    chosen = providers.select(_csv(args.only), _csv(args.skip))
    options = {}
    if args.config:  # parsed per case, on top of that case's default
        options["config"] = args.config

    ceilings = None
    if device.type == "cuda" and not args.no_ceilings:
        from ..roofline import measure_ceilings

        console.print("measuring the bf16 GEMM and copy ceilings ...", style="dim")
        ceilings = measure_ceilings("cuda")
    if args.rounds < 1:
        raise FlashscopeError(f"--rounds {args.rounds}: expected 1 or more")
    timer = Timer(device=device.type, cuda_graph=args.cuda_graph, warmup_ms=args.warmup_ms,
                  rep_ms=args.rep_ms, rounds=args.rounds)

    def log(r):
        tail = f"{r.tflops:.1f} TFLOP/s" if r.status == "ok" else f"{r.status}: {r.reason}"
        console.print(f"{r.case.label:<40} {r.provider:<15} {tail}", style="dim",
                      highlight=False)

    results, base = run_bench(cases, chosen, device=device, timer=timer,
                              baseline=args.baseline, options=options, ceilings=ceilings,
                              log=log)
    meta = output.stamp(device, argv=argv, baseline=base, ceilings=ceilings, timer=timer)
    console.print(output.table(results, metrics, title=f"baseline: {base}"))
    written = []
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        args.json = args.json or str(out / "bench.json")
        args.csv = args.csv or str(out / "bench.csv")
        args.png = args.png or str(out / "bench.png")
        md = out / "bench.md"
        md.write_text(output.markdown(results, meta))
        written.append(md)
    if args.json:
        written.append(output.write_json(args.json, meta, results))
    if args.csv:
        written.append(output.write_csv(args.csv, meta, results))
    if args.png:
        png = output.plot(args.png, results, meta)
        if png:
            written.append(png)
    for w in written:
        console.print(f"wrote {w}")
    failed = [r for r in results if r.status in ("failed", "error")]
    return 1 if failed and not any(r.status == "ok" for r in results) else 0
