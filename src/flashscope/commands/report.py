"""``flashscope report``: registers, budget model, ablations and occupancy cliffs of the
forward kernel across configs and targets, compiled offline (no GPU), as a terminal summary,
JSON, PNG plots and one self-contained HTML page.

With no arguments: targets sm90, sm80, gfx942, gfx1100; head dim 128 (bf16, non-causal); the
base config m128n64w8s2q1 and its single-knob ablation variants; output in a new folder
``flashscope-report-YYYYmmdd-HHMMSS`` under the current directory.

``--kernel bwd``: the dK/dV and dQ kernels of each target's default backward config and of
its one-knob ablations (BLOCK_M1/N1/M2/N2, num_warps, head dim), measured only.
"""

from __future__ import annotations


def register(sub):
    p = sub.add_parser("report", help="register budget, ablations and occupancy cliffs of "
                                      "the attention kernel across configs and GPUs")
    p.add_argument("--kernel", default="fwd", choices=("fwd", "bwd"),
                   help="fwd (default): the forward kernel; bwd: the dK/dV and dQ kernels "
                        "of the default backward config and its ablations (measured only)")
    p.add_argument("--targets", default="sm90,sm80,gfx942,gfx1100",
                   help="comma-separated targets (default: sm90,sm80,gfx942,gfx1100)")
    p.add_argument("--configs", metavar="FILE",
                   help="JSON list of configs, e.g. [{\"BLOCK_M\": 128, \"BLOCK_N\": 64, "
                        "\"num_warps\": 8}]; the first is the ablation base")
    p.add_argument("--head-dims", help="comma-separated head dims (default: 128)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--causal", action="store_true", help="build the causal kernel")
    p.add_argument("--ablate", default="all", metavar="KNOBS",
                   help="knobs to ablate around the base: Q_IN_REGS,BLOCK_M,BLOCK_N,"
                        "num_warps,HEAD_DIM (default all), or none; with --kernel bwd: "
                        "BLOCK_M1,BLOCK_N1,BLOCK_M2,BLOCK_N2,num_warps,HEAD_DIM")
    p.add_argument("--out", metavar="DIR", help="output folder (default: a new "
                   "flashscope-report-YYYYmmdd-HHMMSS); must be absent or empty")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out DIR")
    p.add_argument("--json", action="store_true", help="print the JSON summary to stdout")
    p.add_argument("--jobs", type=int, default=0,
                   help="compile worker processes (default: one per CPU core)")
    p.add_argument("--lines", action="store_true",
                   help="registers, spills and instructions per source line of every kernel "
                        "(lines.json and a section of report.html with the source, a heat "
                        "strip of live registers and the budget checked line by line)")
    p.set_defaults(func=run)


def _out_dir(args):
    import time
    from pathlib import Path

    from ..errors import FlashscopeError

    if args.out is None:
        out = Path(f"flashscope-report-{time.strftime('%Y%m%d-%H%M%S')}")
    else:
        out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise FlashscopeError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise FlashscopeError(f"--out {out}: directory exists and is not empty (a previous "
                              "report?); pick another folder or pass --force")
    return out


def run(args) -> int:
    import json
    import sys

    from rich.console import Console

    from ..errors import FlashscopeError
    from ..report import collect, make_spec, write_report
    from ..report.render_terminal import render

    if args.jobs < 0:
        raise FlashscopeError(f"--jobs {args.jobs}: expected 0 (one per core) or more")
    if getattr(args, "kernel", "fwd") == "bwd":
        if getattr(args, "lines", False):
            raise FlashscopeError("--lines goes with --kernel fwd (the budget it checks is "
                                  "the forward's)")
        return _run_bwd(args)
    spec = make_spec(args.targets, args.configs, args.head_dims, args.dtype, args.causal,
                     args.ablate)
    out = _out_dir(args)
    report = _with_progress(collect, spec, args.jobs)
    lines = None
    if getattr(args, "lines", False):
        from ..report.lines import collect_lines

        lines = collect_lines(report, args.jobs)
        report.timings.update(lines.timings)
    files = write_report(report, out, lines)
    if args.json:
        summary = {"out": str(out), "files": files, "timings": report.timings,
                   "model": report.model_summary(),
                   "rows": [{"config": r.config.key, "head_dim": r.head_dim,
                             "target": r.target, "error": r.error,
                             **(r.comparison or {}),
                             "occupancy": r.occ.occupancy if r.occ else None}
                            for r in report.main_rows()],
                   "near_cliffs": [c for c in report.cliffs if c["near"]]}
        json.dump(summary, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    render(report, Console(), out_dir=out)
    if lines is not None:
        checks = [c["ok"] for v in lines.views.values() for c in v.checks]
        Console().print(f"per source line: {len(lines.views)} kernels, register checks "
                        f"{sum(checks)}/{len(checks)} ok ({files['lines']}, {files['html']})"
                        + (f"; {len(lines.errors)} without a view" if lines.errors else ""))
    return 0


def _run_bwd(args) -> int:
    import json
    import sys

    from rich.console import Console

    from ..errors import FlashscopeError
    from ..report.backward import collect_bwd, make_bwd_spec
    from ..report.backward_out import render_bwd, write_bwd_report

    if args.configs:
        raise FlashscopeError("--configs applies to --kernel fwd; the backward report starts "
                              "from each target's default backward config")
    spec = make_bwd_spec(args.targets, args.head_dims, args.dtype, args.causal, args.ablate)
    out = _out_dir(args)
    report = _with_progress(collect_bwd, spec, args.jobs)
    files = write_bwd_report(report, out)
    if args.json:
        summary = {"out": str(out), "files": files, "kernel": "bwd",
                   "timings": report.timings, "model": report.as_dict()["model"],
                   "rows": [{"kernel": r.kernel, "config": r.config.key,
                             "head_dim": r.head_dim, "target": r.target, "error": r.error,
                             "registers": r.record.registers if r.record else None,
                             "spills": r.spills if r.record else None,
                             "shared_bytes": r.record.shared_bytes if r.record else None,
                             "occupancy": r.occ.occupancy if r.occ else None,
                             "limiter": list(r.occ.limiter) if r.occ else None}
                            for r in report.main_rows()],
                   "near_cliffs": [c for c in report.cliffs if c["near"]]}
        json.dump(summary, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    render_bwd(report, Console(width=160), out_dir=out)
    return 0


def _with_progress(collect, spec, jobs: int):
    """``collect(spec, jobs=, progress=)`` under a transient progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("compiling", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("compile", total=None)
        return collect(spec, jobs=jobs, progress=lambda done, total: bar.update(
            task, completed=done, total=total))
