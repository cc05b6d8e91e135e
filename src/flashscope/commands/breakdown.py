"""``flashscope breakdown``: where a transformer's time goes, by kernel bucket (GEMM,
attention, normalization, elementwise/bias, memory copy/fill, other), and the Amdahl
ceiling: the end-to-end speedup if attention cost nothing, T / (T - T_attention).

Sources: a model it builds and profiles with torch.profiler (random weights; presets or
sizes given; run with SDPA and with flashscope's attention), a recorded Chrome trace, a
rocprofv3 kernel trace (+ stats, agent info; with per-kernel occupancy), or an ncu CSV.
Without a GPU the model runs on the CPU and CPU operators are bucketed by the same rules.
"""

from __future__ import annotations

import json
import os


def register(sub):
    p = sub.add_parser("breakdown", help="where a model's time goes: time per kernel bucket "
                                         "and the Amdahl ceiling for attention")
    p.add_argument("--preset", default="lc0-encoder",
                   help="lc0-encoder (15x768, 24 heads, 64 tokens, batch 192) or decoder-long")
    for k in ("layers", "width", "heads", "seq", "batch", "ffn"):
        p.add_argument(f"--{k}", type=int, help=f"override the preset's {k}")
    p.add_argument("--attention", choices=("sdpa", "flashscope", "both"), default="both")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if visible")
    p.add_argument("--iters", type=int, default=3, help="profiled forward passes")
    p.add_argument("--trace", action="append", default=[], metavar="JSON",
                   help="read a recorded torch.profiler Chrome trace instead of running")
    p.add_argument("--rocprof", metavar="CSV", help="rocprofv3 *_kernel_trace.csv")
    p.add_argument("--stats", metavar="CSV", help="rocprofv3 *_kernel_stats.csv (times from "
                                                  "here when given)")
    p.add_argument("--agent-info", metavar="CSV", help="rocprofv3 *_agent_info.csv (target)")
    p.add_argument("--target", help="AMD target for occupancy, e.g. gfx1100")
    p.add_argument("--ncu-csv", metavar="CSV", help="ncu CSV with gpu__time_duration.sum")
    p.add_argument("--out", metavar="DIR", help="write breakdown.json (and traces) here")
    p.add_argument("--json", action="store_true", help="print JSON")
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
        target = args.target or (read_agent_target(args.agent_info) if args.agent_info
                                 else None)
        if target is not None:
            target = get_target(target).name
        r["target"] = target
        r["kernels"] = kernel_occupancy(dispatches, target) if dispatches else []
        results.append(r)
    if args.ncu_csv:
        results.append(summarize(read_ncu_events(args.ncu_csv), f"ncu csv {args.ncu_csv}"))
    return results


def _run_model(args) -> list:
    from ..breakdown.model import get_preset, with_overrides

    spec = with_overrides(get_preset(args.preset), layers=args.layers, width=args.width,
                          heads=args.heads, seq=args.seq, batch=args.batch, ffn=args.ffn)
    if args.iters < 1:
        from ..errors import FlashscopeError

        raise FlashscopeError("--iters: expected a positive integer")
    import tempfile

    import torch

    from ..testing.interpreter import choose_device

    device = choose_device(args.device)
    from ..breakdown import summarize
    from ..breakdown.model import build
    from ..breakdown.torch_trace import read_trace, record

    kinds = ("sdpa", "flashscope") if args.attention == "both" else (args.attention,)
    out_dir = args.out or tempfile.mkdtemp(prefix="flashscope-breakdown-")
    os.makedirs(out_dir, exist_ok=True)
    results = []
    for kind in kinds:
        model = build(spec, kind, device=device, dtype=torch.bfloat16)
        x = torch.randn(spec.batch, spec.seq, spec.width, device=device, dtype=torch.bfloat16)
        trace = os.path.join(out_dir, f"trace_{args.preset}_{kind}_{device}.json")
        record(model, x, trace, warmup=1 if device == "cpu" else 2, iters=args.iters)
        events, ev_kind = read_trace(trace)
        r = summarize(events, f"torch.profiler, {kind} attention, on {device}"
                              + (" (CPU: CPU ops bucketed by self time, no GPU kernels)"
                                 if ev_kind == "cpu" else ""))
        r.update(attention=kind, device=device, model=spec.__dict__, preset=args.preset,
                 trace=trace, iters=args.iters)
        results.append(r)
    return results


def run(args) -> int:
    files = args.trace or args.rocprof or args.stats or args.ncu_csv
    results = _from_files(args) if files else _run_model(args)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "breakdown.json"), "w") as f:
            json.dump(results, f, indent=2)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print(results)
    return 0


def _limiter(v) -> str:
    if v is None:
        return "-"
    return ", ".join(v) if isinstance(v, (list, tuple)) else str(v)


def _print(results):
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:
        con = Console(width=200)
    for r in results:
        t = Table(title=r["source"])
        for col in ("bucket", "ms", "calls", "share", "top names"):
            t.add_column(col, justify="left" if col in ("bucket", "top names") else "right")
        for b in r["buckets"]:
            t.add_row(b["bucket"], f"{b['seconds'] * 1e3:.3f}", str(b["calls"]),
                      f"{b['share']:.1%}", "; ".join(n[:50] for n in b["top"]))
        con.print(t)
        ceil = r["amdahl_ceiling"]
        con.print(f"total {r['total_seconds'] * 1e3:.3f} ms; attention {r['attention_share']:.1%}"
                  f"; Amdahl ceiling if attention cost nothing: "
                  f"{'unbounded' if ceil == float('inf') else f'{ceil:.3f}x'}")
        if r.get("kernels"):
            k = Table(title=f"AMD kernels, occupancy on {r.get('target') or '?'}")
            for col in ("kernel", "calls", "ms", "threads", "VGPR", "AGPR", "LDS B",
                        "occupancy", "limiter", "note"):
                k.add_column(col)
            for g in r["kernels"][:15]:
                occ = g["occupancy"] or {}
                k.add_row(g["name"][:50], str(g["calls"]), f"{g['seconds'] * 1e3:.3f}",
                          str(g["threads"]), str(g["vgprs"]), str(g["agprs"]), str(g["lds"]),
                          f"{occ['occupancy']:.0%}" if "occupancy" in occ else "-",
                          _limiter(occ.get("limiter")), g.get("note", ""))
            con.print(k)
