"""``flashscope roofline``: attention FLOPs and minimum bytes for a shape, the ceilings
(a labelled table, given numbers, or measured on this GPU), each kernel's point from ncu
counters or given times, and a verdict checked against the counters. PNG with --plot.
"""

from __future__ import annotations

import json


def register(sub):
    p = sub.add_parser(
        "roofline", help="attention roofline: FLOPs, min bytes, ceilings, verdict vs counters",
        description="fwd FLOPs = 4*B*H*Nq*Nk*D (x0.5 causal), bwd = 2.5x fwd (recomputation); "
                    "min bytes: fwd reads Q,K,V and writes O,LSE; bwd reads Q,K,V,O,dO,LSE and "
                    "writes dQ,dK,dV. Verdict: side of the ridge, checked against DRAM "
                    "throughput, tensor-pipe and issue activity when --counters is given.")
    p.add_argument("--shape", default="4,16,4096,128", help="B,H,N,D (default %(default)s)")
    p.add_argument("--nk", type=int, help="key length (default: N)")
    p.add_argument("--hkv", type=int, help="key/value heads (default: H)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--direction", choices=("fwd", "bwd", "fwd+bwd"), default="fwd")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--ceilings", default="h100-measured",
                   help="named ceilings: h100-measured (anchors.md), h100-datasheet")
    p.add_argument("--peak-tflops", type=float, help="compute ceiling, TFLOP/s (with "
                                                     "--peak-bandwidth)")
    p.add_argument("--peak-bandwidth", type=float, help="memory ceiling, TB/s")
    p.add_argument("--measure", action="store_true",
                   help="measure the ceilings on this GPU (bf16 GEMM 8192^3, D2D copy)")
    p.add_argument("--counters", action="append", default=[], metavar="FILE",
                   help="ncu CSV or 'flashscope profile' JSON: one point per kernel, verdict "
                        "checked against its counters (repeatable)")
    p.add_argument("--time", action="append", default=[], metavar="NAME=MS",
                   help="a kernel's measured time in ms (repeatable)")
    p.add_argument("--plot", metavar="PNG", help="write the roofline plot here")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _ceilings(args):
    from ..errors import FlashscopeError
    from ..roofline import Ceilings, get_ceilings, measure_ceilings

    if args.measure:
        return measure_ceilings()
    if (args.peak_tflops is None) != (args.peak_bandwidth is None):
        raise FlashscopeError("--peak-tflops and --peak-bandwidth go together")
    if args.peak_tflops is not None:
        if args.peak_tflops <= 0 or args.peak_bandwidth <= 0:
            raise FlashscopeError("--peak-tflops/--peak-bandwidth: expected positive numbers")
        return Ceilings("given", args.peak_tflops * 1e12, args.peak_bandwidth * 1e12,
                        "given on the command line")
    return get_ceilings(args.ceilings)


def _counter_rows(path):
    from pathlib import Path

    from ..errors import ParseError
    from ..profile.ncu_csv import decode, read_ncu_csv
    from ..profile.session import provider_of

    p = Path(path)
    if p.suffix == ".json":
        try:
            data = json.loads(decode(p.read_bytes(), str(p)))
        except OSError as e:
            raise ParseError(f"--counters {p}: cannot read ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise ParseError(f"--counters {p}: invalid JSON ({e.msg})") from None
        rows = data.get("kernels") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise ParseError(f"--counters {p}: expected 'flashscope profile --json' output "
                             "(an object with 'kernels')")
        return rows
    rows = []
    for k in read_ncu_csv(p):
        d = k.as_dict()
        d["provider"] = provider_of(k.name)
        rows.append(d)
    return rows


def _label(row, seen):
    base = row.get("provider") or "kernel"
    if base == "other":
        base = str(row.get("kernel", "kernel"))[:24]
    if row.get("config_key"):
        base += f" {row['config_key']}"
    seen[base] = seen.get(base, 0) + 1
    return base if seen[base] == 1 else f"{base} #{seen[base]}"


def run(args) -> int:
    from ..errors import FlashscopeError
    from ..roofline import Point, attention_flops, attention_min_bytes, plot, verdict
    from .profile import parse_shape

    B, H, N, D = parse_shape(args.shape)
    Nk = args.nk or N
    Hkv = args.hkv or H
    if Nk < 1 or Hkv < 1 or H % Hkv:
        raise FlashscopeError(f"--nk/--hkv: expected positive values with H ({H}) divisible "
                              f"by Hkv ({Hkv})")
    elt = {"bf16": 2, "fp16": 2, "fp32": 4}[args.dtype]
    c = _ceilings(args)
    flops = attention_flops(B, H, N, Nk, D, args.causal, args.direction)
    nbytes = attention_min_bytes(B, H, N, Nk, D, Hkv, elt, args.direction)
    results = []
    seen = {}
    for path in args.counters:
        for row in _counter_rows(path):
            ms = row.get("duration")
            p = Point(_label(row, seen), flops, nbytes, ms * 1e-3 if ms else None)
            results.append(verdict(p, c, row))
    for spec in args.time:
        name, _, ms = spec.partition("=")
        try:
            t = float(ms)
            if t <= 0:
                raise ValueError
        except ValueError:
            raise FlashscopeError(f"--time {spec!r}: expected NAME=MILLISECONDS > 0") from None
        results.append(verdict(Point(name, flops, nbytes, t * 1e-3), c))
    if not results:
        results.append(verdict(Point("minimum", flops, nbytes), c))
    out = {"shape": dict(B=B, H=H, Hkv=Hkv, Nq=N, Nk=Nk, D=D), "causal": args.causal,
           "direction": args.direction, "dtype": args.dtype,
           "ceilings": dict(name=c.name, tflops=c.flops / 1e12, tbs=c.bandwidth / 1e12,
                            ridge=c.ridge, source=c.source),
           "flops": flops, "min_bytes": nbytes, "intensity": flops / nbytes,
           "kernels": results}
    if args.plot:
        pts = [Point(r["kernel"], flops, nbytes,
                     flops / r["achieved_flops"] if r["achieved_flops"] else None)
               for r in results]
        plot(pts, c, args.plot, title=f"B={B} H={H} N={N} D={D} {args.dtype} {args.direction}"
                                      f"{' causal' if args.causal else ''}")
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
    return 0


def _print(out):
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:
        con = Console(width=200)
    c = out["ceilings"]
    con.print(f"{out['direction']} FLOPs {out['flops']:.4g}, minimum bytes "
              f"{out['min_bytes']:.4g}, intensity {out['intensity']:.1f} FLOP/B")
    con.print(f"ceilings '{c['name']}': {c['tflops']:.0f} TFLOP/s, {c['tbs']:.2f} TB/s, ridge "
              f"{c['ridge']:.1f} FLOP/B ({c['source']})")
    t = Table()
    for col in ("kernel", "ms", "TFLOP/s", "% of roof", "roofline", "counters", "verdict"):
        t.add_column(col, justify="left" if col in ("kernel", "verdict") else "right")
    for r in out["kernels"]:
        ach = r["achieved_flops"]
        t.add_row(r["kernel"], f"{r['flops'] / ach * 1e3:.3f}" if ach else
                  f">= {r['min_time_ms']:.3f}", f"{ach / 1e12:.0f}" if ach else "-",
                  f"{r['fraction_of_roof']:.0%}" if ach else "-", r["roofline_bound"],
                  r["counters"]["bound"] if r["counters"] else "-",
                  ("" if r["agree"] is not False else "[yellow]DISAGREE[/] ") + r["note"])
    con.print(t)
