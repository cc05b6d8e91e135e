"""``flashscope profile``: hardware counters (Nsight Compute) for flashscope's forward and
SDPA's backends, acceptance gates pass/fail per kernel, and how well each counter predicts
speed across configs (Spearman's rho, with n).

On a GPU it runs ncu itself; ``--ncu-csv FILE`` reads ncu CSV output recorded earlier, and
``--from-csv DIR`` a whole ``--out DIR`` recording with its providers and configs (both work
anywhere).

The default gates are the occupancy plan's thresholds (achieved occupancy >= 20%, eligible
warps per scheduler >= 2, issue slots busy >= 60%, theoretical occupancy >= 33%): a
hypothesis about what makes a kernel fast, not a verdict. On an H100 the fastest kernel
measured (cuDNN's) fails all four; the correlation table says how well each gate and
counter predicts speed on the kernels at hand.
"""

from __future__ import annotations

import json

from . import common

DEFAULT_SHAPE = "4,16,4096,128"


def register(sub):
    p = sub.add_parser(
        "profile", help="ncu counters, occupancy gates and their rank correlation with speed",
        description="Occupancy, limiters, eligible warps, issue and tensor-pipe activity, DRAM "
                    "throughput per kernel (ncu --clock-control none), gates pass/fail, and "
                    "Spearman's rho between each counter and TFLOP/s across kernels.")
    p.add_argument("--shape", default=DEFAULT_SHAPE, help="B,H,N,D (default %(default)s)")
    common.add_dtype(p, default="bf16", help="bf16 or fp16 (one; default bf16)")
    common.add_causal(p, both=False)
    p.add_argument("--providers", default="flashscope,cudnn,flash,efficient",
                   help="comma-separated: flashscope, cudnn, flash, efficient")
    p.add_argument("--configs", default="",
                   help="flashscope configs separated by ';', each KEY=VALUE,... "
                        "(e.g. 'BLOCK_M=128,num_warps=8;BLOCK_M=64,num_warps=4')")
    p.add_argument("--ncu-csv", action="append", default=[], metavar="FILE",
                   help="read this ncu --csv output instead of running ncu (repeatable)")
    p.add_argument("--from-csv", metavar="DIR",
                   help="re-read a recording made with --out DIR (its ncu_<i>_<provider>.csv "
                        "files, configs from its jobs.json or profile.json)")
    p.add_argument("--gate", action="append", default=[], metavar="METRIC>=VALUE",
                   help="acceptance gate; replaces the default gate on the same metric "
                        "(defaults, the occupancy plan's: achieved_occupancy>=20, "
                        "eligible_warps>=2, issue_active>=60, theoretical_occupancy>=33)")
    p.add_argument("--speed", metavar="FILE",
                   help="sweep results (JSON/CSV rows with config and tflops or ms) to use as "
                        "speed instead of ncu's durations")
    p.add_argument("--ncu", default="ncu", help="ncu executable (default %(default)s)")
    common.add_output(p)
    lines = p.add_argument_group("per source line (--lines)")
    lines.add_argument("--lines", action="store_true",
                       help="warp stalls by reason and instructions executed per source line "
                            "of one flashscope launch (ncu's source page), beside its "
                            "registers, spills and instruction mix")
    lines.add_argument("--source-page", metavar="FILE", action="append", default=[],
                       help="replay a recorded source page (ncu --page source --csv "
                            "--print-source sass; .csv or .csv.gz) instead of running ncu; "
                            "with --page-alone repeatable, the pages side by side")
    lines.add_argument("--binary", metavar="PATH",
                       help="with --source-page: the recorded kernel's binary (its Triton "
                            "cache folder, a .cubin or a flashscope cache entry); default: "
                            "the config built offline for --target at --shape")
    lines.add_argument("--page-alone", action="store_true",
                       help="with --source-page: read the page without a binary (another "
                            "library's kernel): stall samples by reason and by opcode, and "
                            "the --top instructions (default 20), not by source line; two "
                            "or more pages: their shares by opcode and reason side by side")
    common.add_target(lines, help="with --source-page and no --binary: the GPU it was "
                      "recorded on (default sm90)")
    lines.add_argument("--kernel", default="fwd",
                       help="the kernel to record and build, as inspect names them: fwd "
                            "(default: the forward the launch runs), sm90-fwd, triton-fwd, "
                            "sm90-bwd, bwd_dkdv, bwd_dq, bwd_preprocess (a backward kernel: "
                            "its family's backward runs, --configs its config)")
    lines.add_argument("--kernel-name", default="",
                       help="the kernel of a page that holds several (part of its name)")
    lines.add_argument("--top", type=common.integer(0), default=0, metavar="N",
                       help="with --lines: the N lines with the most stall samples (with "
                            "--page-alone: instructions)")
    p.set_defaults(func=run)


def parse_shape(text: str, arg: str = "--shape"):
    from ..errors import FlashscopeError

    try:
        vals = tuple(int(x) for x in str(text).split(","))
    except ValueError:
        vals = ()
    if len(vals) != 4 or min(vals) < 1 or max(vals) >= 2 ** 31:
        raise FlashscopeError(f"{arg} {text!r}: expected four positive integers B,H,N,D "
                              "(each below 2^31)")
    return vals


def _gates(specs):
    from ..profile.gates import DEFAULT_GATES, parse_gate

    given = [parse_gate(s) for s in specs]
    return tuple(g for g in DEFAULT_GATES if g.metric not in {x.metric for x in given}) \
        + tuple(given)


def run(args) -> int:
    from pathlib import Path

    from ..errors import FlashscopeError
    from ..profile import runner, session

    if args.lines or args.source_page or args.page_alone:
        from .profile_lines import run_lines

        return run_lines(args)
    shape = parse_shape(args.shape)
    dtype = {"bfloat16": "bf16", "float16": "fp16"}[common.one(args.dtype, "--dtype",
                                                               "dtype")]
    causal = common.one(args.causal, "--causal")
    gates = _gates(args.gate)
    providers = [x.strip() for x in args.providers.split(",") if x.strip()]
    for name in providers:
        runner.get_provider(name)
    configs = [c.strip() for c in args.configs.split(";") if c.strip()]
    for c in configs:
        session.config_key(c)  # reject a bad config before any profiling
    if args.ncu_csv and args.from_csv:
        raise FlashscopeError("--ncu-csv and --from-csv: give one or the other")
    for f in args.ncu_csv:
        common.check_input_file(f, "--ncu-csv")
    if args.speed:
        common.check_input_file(args.speed, "--speed")
    offline = bool(args.ncu_csv or args.from_csv)
    common.prepare(args, extra=[] if offline else ["jobs.json", "ncu_*.csv"])
    if offline:
        rows = (session.rows_from_dir(args.from_csv, shape, causal) if args.from_csv
                else session.rows_from_csv(args.ncu_csv, shape, causal))
    else:
        runner.find_ncu(args.ncu)  # ncu itself says when it finds no GPU
        rows = []
        jobs = [(p, "") for p in providers if p != "flashscope" or not configs]
        if "flashscope" in providers:
            jobs += [("flashscope", c) for c in configs]
        out = args.out_dir
        from ..progress import Progress

        with Progress("ncu", len(jobs)) as bar:
            for i, (prov, cfg) in enumerate(jobs):
                k, text = runner.profile_one(prov, shape, dtype, causal, cfg, args.ncu)
                rows.append(runner.row_for(k, prov, cfg, shape, causal))
                if out is not None:  # keep ncu's own CSV: the parser's test data
                    common.write_atomic(out.file(f"ncu_{i:02d}_{prov}.csv"), text)
                bar.advance()
        if out is not None:
            common.write_atomic(out.file("jobs.json"), json.dumps({"jobs": [
                {"file": f"ncu_{i:02d}_{p}.csv", "provider": p, "config": c}
                for i, (p, c) in enumerate(jobs)]}, indent=1))
    for r in rows:
        r["config_key"] = session.config_key(r["config"]) if r.get("config") else ""
    speed = session.load_speed(Path(args.speed), shape, causal) if args.speed else None
    result = session.summarize(rows, gates, speed)
    result.update(shape=dict(zip("BHND", shape)), causal=causal, dtype=dtype,
                  source="csv" if offline else "ncu")
    csv_rows = [{**{k: v for k, v in r.items() if k != "gates"},
                 "gates_failed": _failed(r["gates"]), "gates_all": r["gates"]["all"]}
                for r in result["kernels"]]
    common.emit(args, result, rows=csv_rows, render=lambda con: _print(con, result))
    return 0


def _failed(g) -> list:
    return [name for name, ok in g.items() if name != "all" and ok is False]


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def gates_note(gates) -> str:
    """What the gates are, said where their results are shown."""
    return ("Gates: " + ", ".join(gates) + ". These are the occupancy plan's thresholds, a "
            "hypothesis about what makes a kernel fast rather than a verdict: on an H100 the "
            "fastest kernel measured (cuDNN's) fails all four. The last table says how well "
            "each gate and counter predicts speed here.")


def _print(con, result):
    s = result["shape"]
    t = common.table("kernel", "config", "time (ms)", "TFLOP/s", "occ. % th./ ach.",
                     "elig. warps", "issue %", "tensor %", "DRAM %", "regs", "gates failed",
                     title=f"ncu counters, B={s['B']} H={s['H']} N={s['N']} D={s['D']} "
                           f"{result['dtype']}{' causal' if result['causal'] else ''} "
                           f"(source: {result['source']}; occupancy theoretical/achieved; "
                           "eligible warps per scheduler; registers per thread; --json for "
                           "block limits and shared memory)",
                     left=("kernel", "config"))
    for r in result["kernels"]:
        g = r["gates"]
        shown = ("none" if g["all"] is True else "n/a" if g["all"] is None
                 else f"{len(_failed(g))} of {len(g) - 1}")
        t.add_row(r["provider"] if r["provider"] != "other" else r["kernel"],
                  common.label({"key": r["config_key"]}) if r.get("config_key") else "",
                  _fmt(r.get("duration"), ".3f"), _fmt(r.get("tflops"), ".0f"),
                  f"{_fmt(r.get('theoretical_occupancy'))}/ "
                  f"{_fmt(r.get('achieved_occupancy'))}",
                  _fmt(r.get("eligible_warps"), ".2f"), _fmt(r.get("issue_active")),
                  _fmt(r.get("tensor_pipe")), _fmt(r.get("dram_throughput")),
                  _fmt(r.get("registers"), ".0f"), shown)
    c = common.table("predictor", "rho", "n",
                     title=f"Does the counter predict speed? Spearman's rho vs TFLOP/s "
                           f"({result['speed_source']}); rho > 0: more is faster",
                     left=("predictor",))
    for row in result["correlation"]:
        c.add_row(row["predictor"], _fmt(row["rho"], "+.2f") if row["rho"] is not None
                  else "undefined (n<3 or constant)", str(row["n"]))
    common.show(con, t)
    con.print(gates_note(result["gates"]))
    common.show(con, c)
