"""``flashscope bench``: validate, then time attention providers on the standard suite or
given shapes; table in the terminal, JSON/CSV/PNG/markdown files on request."""

from __future__ import annotations

import argparse
import dataclasses

from ..bench.suite import SUITE_NAMES
from . import common

FORMULAS = """\
metrics:
  latency  median ms of triton.testing.do_bench (L2 flushed before every call), of
           do_bench_cudagraph with --cuda-graph, or with --hide-host (the default for
           --suite decode) of the GPU alone: the L2 flushed, then the GPU kept busy
           while the host queues each call
  tflops   FLOPs / latency, FLOPs = 4*B*H*Nq*Nk*D, x0.5 when causal,
           x2.5 for bwd (the backward alone), x3.5 for fwd+bwd
  speedup  baseline latency / provider latency, same case, same run
  gemm     % of the bf16 GEMM ceiling (8192^3, measured at the start of the run)
  copy     % of the device-to-device copy ceiling (bytes read + written, measured at the
           start): minimum bytes = read Q,K,V + write O,LSE (fwd); + dO,O and dQ,dK,dV (bwd)
  memory   peak MiB allocated during one call beyond the live inputs
  host     host microseconds per call (50 calls queued back to back; GPU only): above the
           latency, the GPU waits for the host and the latency measures the host
  error    worst relative error max|out-ref|/max|ref| over the validations

validation (before any timing counts; a failure shows the reason and no speed):
  fresh random inputs; float64 reference (float32 for large shapes); allocations poisoned
  with NaN so unwritten output is caught; bound per dtype (fp16 2e-3, bf16 1.6e-2; grads
  x2); inputs must be unchanged; a second call on new inputs after the reference ran
  (stale/cached results); odd shapes (N=127, Nq!=Nk, GQA); the last timed call's output
  is checked too.

standard suite: B*N = 16384, H*D = 2048, N in 512..16384, D in 64,128,256, causal and not.

decode suite (--suite decode): one decoding step, Nq query tokens for each of B sequences
against a full cache of Nk keys (causal, the queries at its end), Nq 1/4/16, B 1/8/64,
Nk 1k..128k, GQA 4:1 and 8:1. Providers: copy (a device-to-device copy of the cache's K and
V bytes), flashscope (dense cache), flashscope-paged (the same bytes as 16-key pages in
random order), fa2 (flash_attn_with_kvcache) or sdpa-flash, sdpa-cudnn, fa4.
  bandwidth  GB/s = K and V bytes of the cache (2*B*Nk*Hkv*D*e) / latency;
             copy: bytes read + written (twice that) / its latency
  copy       % of the copy bandwidth of the same case in the same run
"""


def _csv(text):
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


#: Files ``--out DIR`` holds.
OUT_FILES = ("bench.md", "bench.png", "bench.partial.jsonl")
#: under --out, each result row as its case finishes (a killed run keeps what it timed);
#: removed once the run's own files are written
PARTIAL = "bench.partial.jsonl"


def register(sub):
    p = sub.add_parser("bench", help="validate and time attention providers",
                       description=__doc__, epilog=FORMULAS,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list-baselines", action="store_true",
                   help="list the providers, whether each is available here, and why not")
    p.add_argument("--suite", nargs="?", const="standard", choices=SUITE_NAMES,
                   help="run a named suite (GPU only): standard (the default with a bare "
                        "--suite: B*N = 16384, H*D = 2048 over --head-dims and --lengths), "
                        "models (the attention shapes of real models), varlen (packed "
                        "batches of 64k tokens, mixed and equal lengths, beside a dense "
                        "twin), windows (sliding windows and logit caps, Mistral and "
                        "Gemma 2) or decode (decoding steps against a KV cache, the rows of "
                        "--head-dim; its own providers, see below); all but standard from "
                        "src/flashscope/data/suites/NAME.json")
    p.add_argument("--shape", action="append", default=[], metavar="B,H,N,D[,Nk[,Hkv]]",
                   help="a user shape (repeatable); with --suite decode a decoding step: "
                        "N query tokens against Nk cached keys a sequence")
    common.add_dtype(p, default="bf16")
    p.add_argument("--mode", default="fwd", help="comma list of fwd, bwd (the backward "
                                                 "alone), fwd+bwd")
    common.add_causal(p, default="both")
    common.add_head_dim(p, default=None, help="head dims, comma list: the standard suite's "
                                              "(default 64,128,256); with a suite held as a "
                                              "table its rows of these head dims (default all)")
    p.add_argument("--lengths", default=None, type=common.argtype(common.parse_int_list,
                                                                   "lengths"),
                   help="suite lengths N (comma list; default 512..16384); with --suite "
                        "decode the cache lengths Nk of its rows to run (default all)")
    p.add_argument("--only", help="comma list of providers to run")
    p.add_argument("--skip", help="comma list of providers to leave out")
    p.add_argument("--metrics", help="comma list of table columns: latency, tflops, "
                                     "speedup, gemm, copy, memory, host, error (default all)")
    p.add_argument("--baseline", help="provider the speedup is measured against "
                                      "(default: sdpa-cudnn, else the first available)")
    p.add_argument("--config", help="flashscope forward config, KEY=VALUE,... "
                                    "(e.g. BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=2);"
                                    " with --suite decode the decoding kernel's, or "
                                    "sm90-fwd:KEY=VALUE,... to run the rows on the sm_90 "
                                    "forward")
    p.add_argument("--cuda-graph", action="store_true", help="time with do_bench_cudagraph")
    p.add_argument("--hide-host", action=argparse.BooleanOptionalAction, default=None,
                   help="time the GPU only: it spins while the host queues each call "
                        "(default: on for --suite decode, off otherwise)")
    p.add_argument("--warmup-ms", type=common.number(0, strict=True), default=25.0,
                   help="warm-up time per measurement, ms > 0 (default 25)")
    p.add_argument("--rep-ms", type=common.number(0, strict=True), default=100.0,
                   help="timed repetitions per measurement, ms > 0 (default 100)")
    p.add_argument("--rounds", type=common.integer(1), default=1,
                   help="time every provider of a case this many times, in rounds of "
                        "shuffled (seeded) order, and keep the median (the GPU's clock "
                        "drifts over a run and follows the previous burst's power; a "
                        "fixed order biases the comparison)")
    p.add_argument("--no-ceilings", action="store_true",
                   help="skip measuring the GEMM and copy ceilings")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="cpu runs flashscope in Triton's interpreter (tests, tiny shapes)")
    common.add_output(p, plot=True)
    p.set_defaults(func=run)


def list_baselines(device, registry=None) -> list:
    from ..bench.providers import REGISTRY

    return [{"name": p.name, "available": p.available(device) is None,
             "why_not": p.available(device), "backward": p.has_backward, "gqa": p.gqa,
             "baseline": p.baseline, "layout": p.layout, "description": p.description}
            for p in (REGISTRY if registry is None else registry).values()]


def _baselines_table(con, rows, device):
    t = common.table("name", "available", "backward", "GQA", "baseline", "layout",
                     "description", title=f"providers on {device}",
                     left=("name", "available", "backward", "GQA", "baseline", "layout",
                           "description"))
    yes = {True: "yes", False: "no"}
    for r in rows:
        t.add_row(r["name"], "yes" if r["available"] else f"no: {r['why_not']}",
                  yes[r["backward"]], yes[r["gqa"]], yes[r["baseline"]], r["layout"],
                  r["description"])
    common.show(con, t)


def run(args) -> int:
    from ..errors import FlashscopeError
    from ..testing.interpreter import choose_device

    if args.suite and args.device == "cpu" and not args.list_baselines:
        raise FlashscopeError(SUITE_NEEDS_GPU)
    if not args.list_baselines and not args.suite and not args.shape:
        raise FlashscopeError("give --suite and/or --shape B,H,N,D[,Nk[,Hkv]] "
                              "(or --list-baselines)")
    if args.hide_host and args.cuda_graph:
        raise FlashscopeError("--hide-host, --cuda-graph: expected one timer, got both")
    common.prepare(args, meta=True, plot=True, extra=OUT_FILES)
    import torch

    device = torch.device(choose_device(args.device))
    decoding = args.suite == "decode"
    if args.list_baselines:
        from ..bench import decode

        rows = list_baselines(device, decode.DECODE if decoding else None)
        common.emit(args, rows, rows=rows,
                    render=lambda con: _baselines_table(con, rows, device))
        return 0
    if args.suite and device.type == "cpu":
        raise FlashscopeError(SUITE_NEEDS_GPU)

    from ..bench import decode, output, providers, suite
    from ..bench.harness import run_bench
    from ..bench.timing import Timer
    from ..outfiles import PartialLines
    from ..progress import Progress

    metrics = output.parse_metrics(args.metrics or (",".join(decode.METRICS) if decoding
                                                    else None))
    modes = [suite.parse_mode(m) for m in _csv(args.mode) or ["fwd"]]
    if decoding and modes != ["fwd"]:
        raise FlashscopeError(f"--mode {args.mode}: the decode suite times forward steps "
                              "only (--mode fwd)")
    lengths = args.lengths or suite.SUITE_LENGTHS
    cases = suite.user_cases(args.shape, dtypes=args.dtype, causal=args.causal, modes=modes)
    if decoding:
        cases = [decode.DecodeCase(**dataclasses.asdict(c)) for c in cases]
        for c in cases:
            if c.Nk % decode.PAGE_SIZE:
                raise FlashscopeError(f"--shape {c.shape}: Nk = {c.Nk}: the decode suite "
                                      f"reads the cache as {decode.PAGE_SIZE}-key pages too; "
                                      f"give a multiple of {decode.PAGE_SIZE}")
        cases += decode.suite_cases(dtypes=args.dtype, head_dims=args.head_dim,
                                    lengths=args.lengths)
    elif args.suite == "standard":
        cases += suite.standard_suite(dtypes=args.dtype,
                                      head_dims=args.head_dim or suite.SUITE_HEAD_DIMS,
                                      lengths=lengths, causal=args.causal, modes=modes)
    elif args.suite:
        cases += suite.table_suite(args.suite, dtypes=args.dtype, modes=modes,
                                   head_dims=args.head_dim)
    chosen = providers.select(_csv(args.only), _csv(args.skip),
                              registry=decode.DECODE if decoding else None)
    options = {}
    if args.config:  # checked here on the first case, then parsed per case on its default
        from ..api import device_target
        from ..families import Problem, config_from_text

        c = cases[0]
        problem = Problem(device_target(device) or "sm90", c.dtype, c.D, c.causal, c.Nq,
                          c.Nk, c.B * c.H)
        check = (lambda item: decode.decode_config(item, c, device)) if decoding else \
            (lambda item: config_from_text(item, problem))
        common.config_from(check, args.config, f"--config {args.config!r}")
        options["config"] = args.config

    ceilings = None
    if device.type == "cuda" and not args.no_ceilings and not decoding:
        from ..roofline import measure_ceilings

        with Progress("measuring the bf16 GEMM and copy ceilings"):
            ceilings = measure_ceilings("cuda")
    hide = decoding and not args.cuda_graph if args.hide_host is None else args.hide_host
    timer = Timer(device=device.type, cuda_graph=args.cuda_graph, hide_host=hide,
                  warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, rounds=args.rounds)

    out = args.out_dir
    partial = PartialLines(None if out is None else (lambda: out.file(PARTIAL)))
    with Progress("benchmark", len(cases) * len(chosen)) as bar:
        def log(r):
            if r.status != "ok":
                tail = f"{r.status}: {r.reason}"
            elif r.tflops is not None:
                tail = f"{r.tflops:.1f} TFLOP/s"
            else:  # decoding, and the copy it is measured against
                tail = f"{r.gbps:.0f} GB/s"
            bar.note(f"{r.case.label:<40} {r.provider:<15} {tail}")
            bar.advance()
            partial.add(r.row())

        results, base = run_bench(cases, chosen, device=device, timer=timer,
                                  baseline=args.baseline, options=options,
                                  ceilings=ceilings, log=log,
                                  runner=decode.DecodeRunner if decoding else None)
    meta = output.stamp(device, argv=args.argv, baseline=base, ceilings=ceilings,
                        timer=timer)
    doc = {"meta": meta, "results": [r.row() for r in results]}
    plots = [args.plot] if args.plot else []
    out = args.out_dir
    if out is not None:
        common.write_atomic(out.file("bench.md"), output.markdown(
            results, meta, metric="bandwidth" if decoding else "tflops"))
        plots.append(out.file("bench.png"))
    for path in plots:
        output.plot(path, results, meta)
    common.emit(args, doc, rows=doc["results"], meta=meta,
                render=lambda con: common.show(con, output.table(results, metrics,
                                                                 title=f"baseline: {base}")))
    partial.close()
    failed = [r for r in results if r.status in ("failed", "error")]
    return 1 if failed and not any(r.status == "ok" for r in results) else 0


SUITE_NEEDS_GPU = (
    "--suite needs a GPU: its cases run thousands of tokens (4*B*H*N^2*D = 2.2 TFLOP a "
    "case at N = 16384), which Triton's CPU interpreter would take days to finish; time "
    "small shapes on the CPU with --shape B,H,N,D instead")
