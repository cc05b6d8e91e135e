"""``flashscope report``: registers, budget model, ablations and occupancy cliffs of the
forward kernel across configs and targets, compiled offline (no GPU), as a terminal summary,
JSON, CSV, PNG plots and one self-contained HTML page.

With no arguments: targets sm90, sm80, gfx942, gfx1100; head dim 128 (bf16, non-causal); the
base config m128n64w8s2q1 and its single-knob ablation variants; output in a new folder
``flashscope-report-YYYYmmdd-HHMMSS`` under the current directory.

``--neighbours``: each AMD target's default (per head dim) next to its one- and two-knob
neighbours as the offline choice judges them (``flashscope tune offline``): spills, just
past a cliff, or ranked lower by the model (20 to 50 more compiles per AMD target and head
dim, cached; left out by default so the report stays about a minute cold).

``--kernel bwd``: the dK/dV and dQ kernels of each target's default backward config and of
its one-knob ablations (BLOCK_M1/N1/M2/N2, num_warps, head dim), measured only.
``--kernel sm90-bwd``: the Hopper backward's one kernel (sm90 only) at its default and its
one-knob ablations (BLOCK_M, num_stages, DQ_SLOTS, head dim), measured only.
``--kernel decode``: the decoding attention (dense and paged) and its split merge at each
target's default for one decoding step, and its one-knob ablations (BLOCK_M, BLOCK_N,
num_warps, num_stages, head dim), measured only.
``--kernel decode-rows``: decoding's wide rows on the Hopper forward (sm90 only) at their
default and its one-knob ablations (BLOCK_N, num_stages, Q_IN_REGS, head dim), measured
only.
"""

from __future__ import annotations

from . import common

#: What each report writes into its folder (the JSON document lists them as "files").
FWD_FILES = {"json": "report.json", "csv": "report.csv", "html": "report.html",
             "budget": "budget.png", "staircase": "staircase.png"}


def family_files(family) -> dict:
    """What ``--kernel bwd|decode`` writes (:mod:`flashscope.report.backward`)."""
    from ..report.backward_out import registers_file

    return {"json": "report.json", "csv": "report.csv", "html": "report.html",
            "registers": registers_file(family), "staircase": "staircase.png"}


def register(sub):
    p = sub.add_parser("report", help="register budget, ablations and occupancy cliffs of "
                                      "the attention kernel across configs and GPUs",
                       description=__doc__)
    p.add_argument("--kernel", default="fwd",
                   choices=("fwd", "bwd", "sm90-bwd", "decode", "decode-rows"),
                   help="fwd (default): the forward kernel; bwd: the dK/dV and dQ kernels "
                        "of the default backward config and its ablations; sm90-bwd: the "
                        "Hopper backward (sm90); decode: the "
                        "decoding kernels (dense, paged, merge) of the default decoding "
                        "config and its ablations; decode-rows: decoding's wide rows on the "
                        "Hopper forward (sm90; all measured only)")
    common.add_target(p, default="sm90,sm80,gfx942,gfx1100")
    p.add_argument("--configs", metavar="FILE",
                   help="JSON list of configs, e.g. [{\"BLOCK_M\": 128, \"BLOCK_N\": 64, "
                        "\"num_warps\": 8}]; the first is the ablation base")
    common.add_head_dim(p, default="128")
    common.add_dtype(p, default="bf16", help="bf16 or fp16 (one; default bf16)")
    common.add_causal(p, both=False, help="build the causal kernel (default no)")
    common.add_variant(p)
    p.add_argument("--ablate", default="all", metavar="KNOBS",
                   help="knobs to ablate around the base: Q_IN_REGS,BLOCK_M,BLOCK_N,"
                        "num_warps,HEAD_DIM (default all), or none; with --kernel bwd: "
                        "BLOCK_M1,BLOCK_N1,BLOCK_M2,BLOCK_N2,num_warps,HEAD_DIM; with "
                        "--kernel sm90-bwd: BLOCK_M,num_stages,DQ_SLOTS,HEAD_DIM; with "
                        "--kernel decode: BLOCK_M,BLOCK_N,num_warps,num_stages,HEAD_DIM; "
                        "with --kernel decode-rows: BLOCK_N,num_stages,Q_IN_REGS,HEAD_DIM")
    common.add_output(p, out_help="output folder (default: a new "
                      "flashscope-report-YYYYmmdd-HHMMSS); its parent must exist, and files "
                      "of an earlier report are replaced only with --force")
    p.add_argument("--jobs", type=common.integer(0), default=0,
                   help="compile worker processes (default 0: one per CPU core)")
    p.add_argument("--neighbours", action="store_true",
                   help="add the AMD defaults' neighbourhoods and why each lost (20 to 50 "
                        "more compiles per AMD target and head dim, cached)")
    p.add_argument("--lines", action="store_true",
                   help="registers, spills and instructions per source line of every kernel "
                        "(lines.json and a section of report.html with the source, a heat "
                        "strip of live registers and the budget checked line by line)")
    p.set_defaults(func=run)


def _prepare(args, files):
    import time

    if args.out is None:
        args.out = f"flashscope-report-{time.strftime('%Y%m%d-%H%M%S')}"
    common.prepare(args, csv=False, extra=files.values())
    return args.out_dir


def _spec_args(args) -> dict:
    """The report's spec inputs as the library's spec builders take them."""
    return dict(targets=",".join(t.name for t in args.target),
                head_dims=",".join(map(str, args.head_dim)),
                dtype=common.one(args.dtype, "--dtype", "dtype"),
                causal=common.one(args.causal, "--causal"), ablate=args.ablate,
                variant=common.variant_kw(args))


def run(args) -> int:
    from ..errors import FlashscopeError
    from ..families.triton_fwd import TritonFwdConfig
    from ..report import collect, make_spec, write_report
    from ..report.render_terminal import render

    if args.page is not None and args.kernel not in ("decode", "decode-rows"):
        raise FlashscopeError(f"--page goes with --kernel decode or decode-rows (a paged "
                              f"cache's pages; the {args.kernel} kernels read none)")
    if args.page is not None and args.kernel == "decode-rows":
        from ..compile import check_rows_page

        check_rows_page(args.page)
    if args.varlen and args.kernel in ("decode", "decode-rows"):
        raise FlashscopeError("--varlen goes with --kernel fwd or bwd (a decoding step's "
                              "sequences have lengths of their own)")
    if args.kernel != "fwd":
        if args.lines:
            raise FlashscopeError("--lines goes with --kernel fwd (the budget it checks is "
                                  "the forward's)")
        return _run_family(args)
    if args.configs:  # every entry checked here, with its place, before the spec reads it
        common.read_configs(args.configs, TritonFwdConfig)
    kw = _spec_args(args)
    spec = make_spec(kw["targets"], args.configs, kw["head_dims"], kw["dtype"], kw["causal"],
                     kw["ablate"], kw["variant"], neighbours=args.neighbours)
    files = dict(FWD_FILES, **({"lines": "lines.json"} if args.lines else {}))
    out = _prepare(args, files)
    report = _collect(collect, spec, args.jobs)
    lines = None
    if args.lines:
        from ..report.lines import collect_lines

        lines = collect_lines(report, args.jobs)
        report.timings.update(lines.timings)
    doc = report.as_dict() | {"out": str(out), "files": _paths(out, files)}
    write_report(report, out.file("."), doc, lines=lines)
    rows = [_row(r) for r in report.main_rows()]
    common.write_atomic(out.file("report.csv"), common.csv_text(rows))

    def show(con):
        render(report, con, out_dir=out)
        if lines is not None:
            checks = [c["ok"] for v in lines.views.values() for c in v.checks]
            con.print(f"per source line: {len(lines.views)} kernels, register checks "
                      f"{sum(checks)}/{len(checks)} ok ({out.path / 'lines.json'})"
                      + (f"; {len(lines.errors)} without a view" if lines.errors else ""))

    common.emit(args, doc, rows=rows, write=False, render=show)
    return 0


def _paths(out, files) -> dict:
    return {k: str(out.path / n) for k, n in files.items()}


def _row(r) -> dict:
    """One CSV row of the report's table (forward or backward)."""
    rec, c = r.record, getattr(r, "comparison", None) or {}
    return {"kernel": getattr(r, "kernel", "fwd"), "config": common.label(r.config),
            "head_dim": r.head_dim, "target": r.target, "error": r.error,
            "refused": r.refused if rec is None else None,
            "registers": rec.registers if rec else None,
            "spills": r.spills if rec else None,
            "shared_bytes": rec.shared_bytes if rec else None,
            "predicted_registers": c.get("predicted"), "dominant": c.get("dominant"),
            "occupancy": r.occ.occupancy if r.occ else None,
            "limiter": list(r.occ.limiter) if r.occ else None}


def _run_family(args) -> int:
    from ..errors import FlashscopeError
    from ..report.backward import FAMILY_REPORTS, collect_bwd, make_bwd_spec
    from ..report.backward_out import render_bwd, write_bwd_report

    family = FAMILY_REPORTS[args.kernel]
    if args.configs:
        raise FlashscopeError(f"--configs applies to --kernel fwd; the {family.noun} report "
                              f"starts from each target's default {family.noun} config")
    kw = _spec_args(args)
    spec = make_bwd_spec(kw["targets"], kw["head_dims"], kw["dtype"], kw["causal"],
                         kw["ablate"], family, kw["variant"])
    files = family_files(family)
    out = _prepare(args, files)
    report = _collect(collect_bwd, spec, args.jobs)
    doc = report.as_dict() | {"out": str(out), "files": _paths(out, files)}
    write_bwd_report(report, out.file("."), doc)
    rows = [_row(r) for r in report.main_rows()]
    common.write_atomic(out.file("report.csv"), common.csv_text(rows))
    common.emit(args, doc, rows=rows, write=False,
                render=lambda con: render_bwd(report, con, out_dir=out))
    return 0


def _collect(collect, spec, jobs: int):
    """``collect(spec, jobs=, progress=)`` with compiles done/total and ETA on a terminal."""
    from ..progress import Progress

    with Progress("compiling") as bar:
        return collect(spec, jobs=jobs, progress=bar.update)
