"""``flashscope profile``: hardware counters (Nsight Compute) for flashscope's forward and
SDPA's backends, acceptance gates pass/fail per kernel, and how well each counter predicts
speed across configs (Spearman's rho, with n).

On a GPU it runs ncu itself; ``--csv FILE`` reads ncu CSV output recorded earlier, and
``--from-csv DIR`` a whole ``--out DIR`` recording with its providers and configs (both work
anywhere).
"""

from __future__ import annotations

import json

DEFAULT_SHAPE = "4,16,4096,128"


def register(sub):
    p = sub.add_parser(
        "profile", help="ncu counters, occupancy gates and their rank correlation with speed",
        description="Occupancy, limiters, eligible warps, issue and tensor-pipe activity, DRAM "
                    "throughput per kernel (ncu --clock-control none), gates pass/fail, and "
                    "Spearman's rho between each counter and TFLOP/s across kernels.")
    p.add_argument("--shape", default=DEFAULT_SHAPE, help="B,H,N,D (default %(default)s)")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--providers", default="flashscope,cudnn,flash,efficient",
                   help="comma-separated: flashscope, cudnn, flash, efficient")
    p.add_argument("--configs", default="",
                   help="flashscope configs separated by ';', each KEY=VALUE,... "
                        "(e.g. 'BLOCK_M=128,num_warps=8;BLOCK_M=64,num_warps=4')")
    p.add_argument("--csv", action="append", default=[], metavar="FILE",
                   help="read this ncu --csv output instead of running ncu (repeatable)")
    p.add_argument("--from-csv", metavar="DIR",
                   help="re-read a recording made with --out DIR (its ncu_<i>_<provider>.csv "
                        "files, configs from its jobs.json or profile.json)")
    p.add_argument("--gate", action="append", default=[], metavar="METRIC>=VALUE",
                   help="acceptance gate; replaces the default gate on the same metric "
                        "(defaults: achieved_occupancy>=20, eligible_warps>=2, "
                        "issue_active>=60, theoretical_occupancy>=33)")
    p.add_argument("--speed", metavar="FILE",
                   help="sweep results (JSON/CSV rows with config and tflops or ms) to use as "
                        "speed instead of ncu's durations")
    p.add_argument("--ncu", default="ncu", help="ncu executable (default %(default)s)")
    p.add_argument("--out", metavar="DIR", help="write profile.json, profile.csv and ncu's raw CSV output here")
    p.add_argument("--json", action="store_true", help="print JSON")
    lines = p.add_argument_group("per source line (--lines)")
    lines.add_argument("--lines", action="store_true",
                       help="warp stalls by reason and instructions executed per source line "
                            "of one flashscope launch (ncu's source page), beside its "
                            "registers, spills and instruction mix")
    lines.add_argument("--source-page", metavar="FILE",
                       help="replay a recorded source page (ncu --page source --csv "
                            "--print-source sass; .csv or .csv.gz) instead of running ncu")
    lines.add_argument("--binary", metavar="PATH",
                       help="with --source-page: the recorded kernel's binary (its Triton "
                            "cache folder, a .cubin or a flashscope cache entry); default: "
                            "the config built offline for --target at --shape")
    lines.add_argument("--target", default="sm90",
                       help="with --source-page and no --binary: the GPU it was recorded on")
    lines.add_argument("--kernel-name", default="",
                       help="the kernel of a page that holds several (part of its name)")
    lines.add_argument("--top", type=int, default=0, metavar="N",
                       help="with --lines: the N lines with the most stall samples")
    p.set_defaults(func=run)


def parse_shape(text: str, arg: str = "--shape"):
    from ..errors import FlashscopeError

    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != 4 or min(vals) < 1:
        raise FlashscopeError(f"{arg} {text!r}: expected four positive integers B,H,N,D")
    return vals


def _gates(specs):
    from ..profile.gates import DEFAULT_GATES, parse_gate

    given = [parse_gate(s) for s in specs]
    return tuple(g for g in DEFAULT_GATES if g.metric not in {x.metric for x in given}) \
        + tuple(given)


def run(args) -> int:
    from ..profile import runner, session

    if args.lines or args.source_page:
        from .profile_lines import run_lines

        return run_lines(args)
    shape = parse_shape(args.shape)
    gates = _gates(args.gate)
    providers = [x.strip() for x in args.providers.split(",") if x.strip()]
    for name in providers:
        runner.get_provider(name)
    configs = [c.strip() for c in args.configs.split(";") if c.strip()]
    for c in configs:
        session.config_key(c)  # reject a bad config before any profiling
    if args.csv and args.from_csv:
        from ..errors import FlashscopeError

        raise FlashscopeError("--csv and --from-csv: give one or the other")
    if args.from_csv:
        rows = session.rows_from_dir(args.from_csv, shape, args.causal)
    elif args.csv:
        rows = session.rows_from_csv(args.csv, shape, args.causal)
    else:
        rows = []
        jobs = [(p, "") for p in providers if p != "flashscope" or not configs]
        if "flashscope" in providers:
            jobs += [("flashscope", c) for c in configs]
        for i, (prov, cfg) in enumerate(jobs):
            k, text = runner.profile_one(prov, shape, args.dtype, args.causal, cfg, args.ncu)
            rows.append(runner.row_for(k, prov, cfg, shape, args.causal))
            if args.out:  # keep ncu's own CSV: the parser's test data and the evidence
                from pathlib import Path

                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / f"ncu_{i:02d}_{prov}.csv").write_text(text)
        if args.out:
            from pathlib import Path

            (Path(args.out) / "jobs.json").write_text(json.dumps({"jobs": [
                {"file": f"ncu_{i:02d}_{p}.csv", "provider": p, "config": c}
                for i, (p, c) in enumerate(jobs)]}, indent=1))
    for r in rows:
        r["config_key"] = session.config_key(r["config"]) if r.get("config") else ""
    speed = session.load_speed(args.speed, shape, args.causal) if args.speed else None
    result = session.summarize(rows, gates, speed)
    result.update(shape=dict(zip("BHND", shape)), causal=args.causal, dtype=args.dtype,
                  source="csv" if args.csv or args.from_csv else "ncu")
    if args.out:
        _write(result, args.out)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0


def _write(result, out_dir):
    import csv
    from pathlib import Path

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "profile.json").write_text(json.dumps(result, indent=2))
    rows = result["kernels"]
    cols = [c for c in rows[0] if c != "gates"] + ["gates_all"]
    with open(d / "profile.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({**{c: r.get(c) for c in cols if c != "gates_all"},
                        "gates_all": r["gates"]["all"]})


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def _print(result):
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:
        con = Console(width=200)
    s = result["shape"]
    t = Table(title=f"ncu counters, B={s['B']} H={s['H']} N={s['N']} D={s['D']} "
                    f"{result['dtype']}{' causal' if result['causal'] else ''} "
                    f"(source: {result['source']})")
    for col in ("kernel", "config", "ms", "TFLOP/s", "theor %", "achv %", "lim r/s/w/b",
                "elig/sch", "issue %", "tensor %", "DRAM %", "regs", "smem B", "gates"):
        t.add_column(col, justify="left" if col in ("kernel", "config") else "right")
    for r in result["kernels"]:
        lim = "/".join(_fmt(r.get(k), ".0f") for k in
                       ("limit_registers", "limit_shared_mem", "limit_warps", "limit_blocks"))
        smem = sum(r.get(k) or 0 for k in ("smem_static", "smem_dynamic", "smem_driver"))
        g = r["gates"]
        n_failed = sum(1 for name, ok in g.items() if name != "all" and ok is False)
        verdict = {True: "[green]pass[/]", None: "n/a"}.get(
            g["all"], f"[red]fail {n_failed}/{len(g) - 1}[/]")
        t.add_row(r["provider"] if r["provider"] != "other" else r["kernel"][:40],
                  r.get("config_key") or "", _fmt(r.get("duration"), ".3f"),
                  _fmt(r.get("tflops"), ".0f"), _fmt(r.get("theoretical_occupancy")),
                  _fmt(r.get("achieved_occupancy")), lim, _fmt(r.get("eligible_warps"), ".2f"),
                  _fmt(r.get("issue_active")), _fmt(r.get("tensor_pipe")),
                  _fmt(r.get("dram_throughput")), _fmt(r.get("registers"), ".0f"),
                  f"{smem:,.0f}", verdict)
    con.print(t)
    c = Table(title=f"Does the counter predict speed? Spearman's rho vs TFLOP/s "
                    f"({result['speed_source']}); rho > 0: more is faster")
    c.add_column("predictor")
    c.add_column("rho", justify="right")
    c.add_column("n", justify="right")
    for row in result["correlation"]:
        c.add_row(row["predictor"], _fmt(row["rho"], "+.2f") if row["rho"] is not None
                  else "undefined (n<3 or constant)", str(row["n"]))
    con.print(c)
