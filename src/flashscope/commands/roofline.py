"""``flashscope roofline``: attention FLOPs and minimum bytes for a shape, the ceilings
(a labelled table, given numbers, or measured on this GPU), each kernel's point from ncu
counters or given times, and a verdict checked against the counters. A plot with --plot.
"""

from __future__ import annotations

import json

from . import common


def register(sub):
    p = sub.add_parser(
        "roofline", help="attention roofline: FLOPs, min bytes, ceilings, verdict vs counters",
        description="fwd FLOPs = 4*B*H*Nq*Nk*D (x0.5 causal), bwd = 2.5x fwd (recomputation); "
                    "min bytes: fwd reads Q,K,V and writes O,LSE; bwd reads Q,K,V,O,dO,LSE and "
                    "writes dQ,dK,dV. Verdict: side of the ridge, checked against DRAM "
                    "throughput, tensor-pipe and issue activity when --counters is given.")
    p.add_argument("--shape", default="4,16,4096,128", help="B,H,N,D (default %(default)s)")
    p.add_argument("--nk", type=common.integer(1), help="key length (default: N)")
    p.add_argument("--hkv", type=common.integer(1), help="key/value heads (default: H)")
    common.add_causal(p, both=False)
    p.add_argument("--direction", choices=("fwd", "bwd", "fwd+bwd"), default="fwd")
    p.add_argument("--dtype", default="bf16", type=common.argtype(_element_bytes, "dtype"),
                   help="bf16, fp16 or fp32 (torch names too): bytes per element "
                        "(default bf16)")
    p.add_argument("--ceilings", default="h100-measured",
                   help="named ceilings: h100-measured (anchors.md), h100-datasheet")
    p.add_argument("--peak-tflops", type=common.number(0, strict=True),
                   help="compute ceiling, TFLOP/s (with --peak-bandwidth)")
    p.add_argument("--peak-bandwidth", type=common.number(0, strict=True),
                   help="memory ceiling, TB/s")
    p.add_argument("--measure", action="store_true",
                   help="measure the ceilings on this GPU (bf16 GEMM 8192^3, D2D copy)")
    p.add_argument("--counters", action="append", default=[], metavar="FILE",
                   help="ncu CSV or 'flashscope profile' JSON: one point per kernel, verdict "
                        "checked against its counters (repeatable)")
    p.add_argument("--time", action="append", default=[], metavar="NAME=MS",
                   help="a kernel's measured time in ms (repeatable)")
    common.add_output(p, plot=True)
    p.set_defaults(func=run)


def _element_bytes(text) -> tuple:
    """``--dtype`` -> (name, bytes per element)."""
    from ..errors import FlashscopeError

    s = str(text).strip().lower().removeprefix("torch.")
    if s in ("fp32", "float32", "float"):
        return "fp32", 4
    try:
        (name,) = common.parse_dtypes(s)
    except (FlashscopeError, ValueError):
        raise FlashscopeError(f"expected bf16, fp16 or fp32, got {text!r}") from None
    return {"bfloat16": "bf16", "float16": "fp16"}[name], 2


def _ceilings(args):
    from ..errors import FlashscopeError
    from ..roofline import Ceilings, get_ceilings, measure_ceilings

    if args.measure:
        from ..testing.interpreter import choose_device

        choose_device("cuda", "--measure")  # refuses at once where no GPU is visible
        return measure_ceilings()
    if (args.peak_tflops is None) != (args.peak_bandwidth is None):
        raise FlashscopeError("--peak-tflops and --peak-bandwidth go together")
    if args.peak_tflops is not None:
        return Ceilings("given", args.peak_tflops * 1e12, args.peak_bandwidth * 1e12,
                        "given on the command line")
    return get_ceilings(args.ceilings)


def _counter_rows(path):
    from ..errors import ParseError
    from ..profile.ncu_csv import decode, read_ncu_csv
    from ..profile.session import check_counter_rows, provider_of

    p = common.check_input_file(path, "--counters")
    if p.suffix == ".json":
        try:
            data = json.loads(decode(p.read_bytes(), str(p)))
        except OSError as e:
            raise ParseError(f"--counters {p}: cannot read ({e.strerror})") from None
        except (ValueError, RecursionError) as e:
            raise ParseError(f"--counters {p}: invalid JSON "
                             f"({getattr(e, 'msg', 'nested too deeply')})") from None
        rows = data.get("kernels") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise ParseError(f"--counters {p}: expected 'flashscope profile --json' output "
                             "(an object with 'kernels')")
        return check_counter_rows(rows, f"--counters {p}")
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


def _times(specs) -> list:
    import math

    from ..errors import FlashscopeError

    out = []
    for spec in specs:
        name, _, ms = spec.partition("=")
        try:
            t = float(ms)
        except ValueError:
            t = float("nan")
        if not name.strip() or not math.isfinite(t) or t <= 0:
            raise FlashscopeError(f"--time {spec!r}: expected NAME=MILLISECONDS, a finite "
                                  "time > 0")
        out.append((name.strip(), t))
    return out


def run(args) -> int:
    from ..errors import FlashscopeError
    from ..roofline import Point, attention_flops, attention_min_bytes, plot, verdict
    from .profile import parse_shape

    B, H, N, D = parse_shape(args.shape)
    Nk = N if args.nk is None else args.nk
    Hkv = H if args.hkv is None else args.hkv
    if H % Hkv:
        raise FlashscopeError(f"--hkv {Hkv}: expected a divisor of H ({H})")
    causal = common.one(args.causal, "--causal")
    dtype, elt = args.dtype
    times = _times(args.time)
    for path in args.counters:
        common.check_input_file(path, "--counters")
    common.prepare(args, plot=True, extra=["roofline.png"])
    c = _ceilings(args)
    flops = attention_flops(B, H, N, Nk, D, causal, args.direction)
    nbytes = attention_min_bytes(B, H, N, Nk, D, Hkv, elt, args.direction)
    results = []
    seen = {}
    for path in args.counters:
        for row in _counter_rows(path):
            ms = row.get("duration")
            p = Point(_label(row, seen), flops, nbytes, ms * 1e-3 if ms else None)
            results.append(verdict(p, c, row))
    for name, t in times:
        results.append(verdict(Point(name, flops, nbytes, t * 1e-3), c))
    if not results:
        results.append(verdict(Point("minimum", flops, nbytes), c))
    out = {"shape": dict(B=B, H=H, Hkv=Hkv, Nq=N, Nk=Nk, D=D), "causal": causal,
           "direction": args.direction, "dtype": dtype,
           "ceilings": dict(name=c.name, tflops=c.flops / 1e12, tbs=c.bandwidth / 1e12,
                            ridge=c.ridge, source=c.source),
           "flops": flops, "min_bytes": nbytes, "intensity": flops / nbytes,
           "kernels": results}
    plots = [args.plot] if args.plot else []
    if args.out_dir is not None:
        plots.append(args.out_dir.file("roofline.png"))
    for path in plots:
        pts = [Point(r["kernel"], flops, nbytes,
                     flops / r["achieved_flops"] if r["achieved_flops"] else None)
               for r in results]
        plot(pts, c, path, title=f"B={B} H={H} N={N} D={D} {dtype} {args.direction}"
                                 f"{' causal' if causal else ''}")
    rows = [{k: v for k, v in r.items() if k != "counters"}
            | {"counters_bound": (r["counters"] or {}).get("bound")} for r in results]
    common.emit(args, out, rows=rows, render=lambda con: _print(con, out))
    return 0


def _print(con, out):
    c = out["ceilings"]
    con.print(f"{out['direction']} FLOPs {out['flops']:.4g}, minimum bytes "
              f"{out['min_bytes']:.4g} B, intensity {out['intensity']:.1f} FLOP/B")
    con.print(f"ceilings '{c['name']}': {c['tflops']:.0f} TFLOP/s, {c['tbs']:.2f} TB/s, ridge "
              f"{c['ridge']:.1f} FLOP/B ({c['source']})")
    t = common.table("kernel", "time (ms)", "TFLOP/s", "of roof", "roofline", "counters",
                     "verdict", left=("kernel", "verdict"))
    for r in out["kernels"]:
        ach = r["achieved_flops"]
        t.add_row(r["kernel"], f"{r['flops'] / ach * 1e3:.3f}" if ach else
                  f">= {r['min_time_ms']:.3f}", f"{ach / 1e12:.0f}" if ach else "-",
                  common.pct(r["fraction_of_roof"], 0) if ach else "-", r["roofline_bound"],
                  r["counters"]["bound"] if r["counters"] else "-",
                  ("" if r["agree"] is not False else "DISAGREE: ") + r["note"])
    common.show(con, t)
