"""``flashscope breakdown``: where a transformer's time goes, by kernel bucket (GEMM,
attention, normalization, elementwise/bias, memory copy/fill, other), and the Amdahl
ceiling: the end-to-end speedup if attention cost nothing, T / (T - T_attention).

Sources: a model it builds and profiles with torch.profiler (random weights; presets or
sizes given; run with SDPA and with flashscope's attention), a recorded Chrome trace, a
rocprofv3 kernel trace (+ stats, agent info; with per-kernel occupancy), or an ncu CSV.
Without a GPU the model runs on the CPU and CPU operators are bucketed by the same rules.
"""

from __future__ import annotations

import math
import os

from . import common

#: Seconds Triton's interpreter takes per (query tile, key tile) of flashscope's forward on
#: 2 CPU cores (bf16, D = 32, 64-token tiles: 0.40 s for 24 heads x 1 tile, 1.81 s for 96),
#: and how long a CPU breakdown may run before it is refused.
INTERPRETER_S_PER_TILE = 0.018
INTERPRETER_LIMIT_S = 300.0
_TILE = 64


def register(sub):
    p = sub.add_parser("breakdown", help="where a model's time goes: time per kernel bucket "
                                         "and the Amdahl ceiling for attention",
                       description=__doc__)
    p.add_argument("--preset", default="lc0-encoder",
                   help="lc0-encoder (15x768, 24 heads, 64 tokens, batch 192) or decoder-long")
    for k in ("layers", "width", "heads", "seq", "batch", "ffn"):
        p.add_argument(f"--{k}", type=common.integer(1), help=f"override the preset's {k}")
    p.add_argument("--attention", choices=("sdpa", "flashscope", "both"), default="both")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if visible")
    p.add_argument("--iters", type=common.integer(1), default=3,
                   help="profiled forward passes")
    p.add_argument("--trace", action="append", default=[], metavar="JSON",
                   help="read a recorded torch.profiler Chrome trace instead of running")
    p.add_argument("--rocprof", metavar="CSV", help="rocprofv3 *_kernel_trace.csv")
    p.add_argument("--stats", metavar="CSV", help="rocprofv3 *_kernel_stats.csv (times from "
                                                  "here when given)")
    p.add_argument("--agent-info", metavar="CSV", help="rocprofv3 *_agent_info.csv (target)")
    common.add_target(p, default=None, help="AMD target for occupancy, e.g. gfx1100 or "
                                            "MI300X (one)")
    p.add_argument("--ncu-csv", metavar="CSV", help="ncu CSV with gpu__time_duration.sum")
    common.add_output(p)
    p.set_defaults(func=run)


def _from_files(args) -> list:
    from ..breakdown import summarize
    from ..breakdown.ncu_export import read_ncu_events
    from ..breakdown.rocprof import (kernel_occupancy, read_agent_target, read_kernel_trace,
                                     read_stats)
    from ..breakdown.torch_trace import read_trace
    from ..targets import get_target

    results = []
    for path in args.trace:
        events, kind = read_trace(path)
        r = summarize(events, f"torch.profiler trace {path} ({kind} "
                              f"{'kernels' if kind == 'gpu' else 'ops, self time'})")
        results.append(r)
    if args.rocprof or args.stats:
        dispatches = read_kernel_trace(args.rocprof) if args.rocprof else []
        if args.stats:
            events = read_stats(args.stats)
            src = f"rocprofv3 stats {args.stats}"
        else:
            events = [(d["name"], d["seconds"]) for d in dispatches]
            src = f"rocprofv3 kernel trace {args.rocprof}"
        r = summarize(events, src)
        target = (common.one(args.target, "--target", "target").name if args.target
                  else read_agent_target(args.agent_info) if args.agent_info else None)
        if target is not None:
            target = get_target(target).name
        r["target"] = target
        r["kernels"] = kernel_occupancy(dispatches, target) if dispatches else []
        results.append(r)
    if args.ncu_csv:
        results.append(summarize(read_ncu_events(args.ncu_csv), f"ncu csv {args.ncu_csv}"))
    return results


def interpreter_seconds(spec, iters: int) -> float:
    """About how long flashscope's attention of ``spec`` takes in Triton's interpreter for
    one warm-up and ``iters`` profiled passes (:data:`INTERPRETER_S_PER_TILE`)."""
    n = math.ceil(spec.seq / _TILE)
    tiles = spec.batch * spec.heads * n * (n + 1) / 2 if spec.causal else \
        spec.batch * spec.heads * n * n
    return tiles * spec.layers * (iters + 1) * INTERPRETER_S_PER_TILE


def check_interpreter(spec, iters: int, preset: str, asked: bool = True) -> None:
    """Refuse a CPU run of flashscope's attention that cannot finish in
    :data:`INTERPRETER_LIMIT_S`, naming a batch (or a length) that would."""
    from ..errors import FlashscopeError

    est = interpreter_seconds(spec, iters)
    if est <= INTERPRETER_LIMIT_S:
        return
    fit = int(spec.batch * INTERPRETER_LIMIT_S / est)
    limit = f"{INTERPRETER_LIMIT_S / 60:.0f} minutes"
    hint = (f"--batch {fit} finishes in {limit}" if fit >= 1 else
            f"a shorter --seq or fewer --layers would finish in {limit}")
    where = "--device cpu" if asked else "no GPU is visible"
    raise FlashscopeError(
        f"{where}: flashscope's attention would run in Triton's interpreter, about "
        f"{est / 60:.0f} minutes for {preset} (batch {spec.batch}, {spec.heads} heads, "
        f"{spec.seq} tokens, {spec.layers} layers, {iters} + 1 passes); {hint}, or use "
        "--attention sdpa, or a GPU")


def _run_model(args) -> list:
    from ..breakdown.model import get_preset, with_overrides

    spec = with_overrides(get_preset(args.preset), layers=args.layers, width=args.width,
                          heads=args.heads, seq=args.seq, batch=args.batch, ffn=args.ffn)
    import tempfile

    from ..testing.interpreter import choose_device

    device = choose_device(args.device)
    if device == "cpu" and args.attention != "sdpa":
        check_interpreter(spec, args.iters, args.preset, asked=args.device == "cpu")
    import torch

    from ..breakdown import summarize
    from ..breakdown.model import build
    from ..breakdown.torch_trace import read_trace, record
    from ..progress import Progress

    kinds = ("sdpa", "flashscope") if args.attention == "both" else (args.attention,)
    out_dir = args.out_dir.file(".") if args.out_dir is not None else \
        tempfile.mkdtemp(prefix="flashscope-breakdown-")
    results = []
    with Progress("profiling", len(kinds)) as bar:
        for kind in kinds:
            model = build(spec, kind, device=device, dtype=torch.bfloat16)
            x = torch.randn(spec.batch, spec.seq, spec.width, device=device,
                            dtype=torch.bfloat16)
            trace = os.path.join(out_dir, f"trace_{args.preset}_{kind}_{device}.json")
            record(model, x, trace, warmup=1 if device == "cpu" else 2, iters=args.iters)
            events, ev_kind = read_trace(trace)
            r = summarize(events, f"torch.profiler, {kind} attention, on {device}"
                                  + (" (CPU: CPU ops bucketed by self time, no GPU kernels)"
                                     if ev_kind == "cpu" else ""))
            r.update(attention=kind, device=device, model=spec.__dict__, preset=args.preset,
                     trace=trace, iters=args.iters)
            results.append(r)
            bar.advance()
    return results


def run(args) -> int:
    files = args.trace or args.rocprof or args.stats or args.ncu_csv
    for flag, paths in (("--trace", args.trace), ("--rocprof", [args.rocprof]),
                        ("--stats", [args.stats]), ("--agent-info", [args.agent_info]),
                        ("--ncu-csv", [args.ncu_csv])):
        for path in paths:
            if path:
                common.check_input_file(path, flag)
    common.prepare(args, extra=[] if files else ["trace_*.json"])
    results = _from_files(args) if files else _run_model(args)
    rows = [{"source": r["source"], **b, "top": b["top"]} for r in results
            for b in r["buckets"]]
    common.emit(args, results, rows=rows, render=lambda con: _print(con, results))
    return 0


def _limiter(v) -> str:
    if v is None:
        return "-"
    return ", ".join(v) if isinstance(v, (list, tuple)) else str(v)


def _print(con, results):
    for r in results:
        t = common.table("bucket", "time (ms)", "calls", "share", "top names",
                         title=r["source"], left=("bucket", "top names"))
        for b in r["buckets"]:
            t.add_row(b["bucket"], f"{b['seconds'] * 1e3:.3f}", str(b["calls"]),
                      common.pct(b["share"]), "; ".join(b["top"]))
        common.show(con, t)
        ceil = r["amdahl_ceiling"]
        con.print(f"total {r['total_seconds'] * 1e3:.3f} ms; attention "
                  f"{common.pct(r['attention_share'])}; Amdahl ceiling if attention cost "
                  f"nothing: {'unbounded' if ceil == float('inf') else f'{ceil:.3f}x'}")
        if r.get("kernels"):
            k = common.table("kernel", "calls", "time (ms)", "threads", "VGPR", "AGPR",
                             "LDS (B)", "occupancy", "limiter", "note",
                             title=f"AMD kernels, occupancy on {r.get('target') or '?'}",
                             left=("kernel", "limiter", "note"))
            for g in r["kernels"][:15]:
                occ = g["occupancy"] or {}
                k.add_row(g["name"], str(g["calls"]), f"{g['seconds'] * 1e3:.3f}",
                          str(g["threads"]), str(g["vgprs"]), str(g["agprs"]), str(g["lds"]),
                          common.pct(occ.get("occupancy")), _limiter(occ.get("limiter")),
                          g.get("note", ""))
            common.show(con, k)
