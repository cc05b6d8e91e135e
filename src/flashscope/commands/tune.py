"""``flashscope tune``: interleaved, L2-flushed A/B timing of forward configs against the
default and the peers, the one-knob and transplant search steps, the adoption rule that
writes the tuned files, and the offline tools around them (:mod:`flashscope.tune`).

Files: ``ab --out DIR`` writes ``DIR/<cell>.json`` (the A/B result, what ``--json``
prints) and ``<cell>.csv`` (its rows); ``cells --out DIR`` one such JSON per cell as each
ends, and ``summary.json``/``summary.csv``; ``adopt`` and ``compare-sass`` write
``adopt.*``/``compare-sass.*`` under ``--out``; ``convert`` writes ``DIR/<target>.json``
(or the file itself, with ``--force``)."""

from __future__ import annotations

import argparse

from ..errors import FlashscopeError
from . import common

HELP = "A/B-time configs, search around the tuned defaults, adopt the winners"
DESCRIPTION = """\
Interleaved, L2-flushed A/B timing of forward configs against the default and the peers,
the one-knob and transplant search steps, the adoption rule that writes the tuned files.

on a GPU:  ab (one shape), cells (many cells, one worker process per GPU)
anywhere:  adopt (A/B results -> tuned entries), convert (format-1 tuned file -> format 2),
           compare-sass (two Nsight Compute source pages), offline (AMD defaults chosen
           from compiled code objects: spills, occupancy cliffs, a stated model)
guide:     docs/tune.md"""
VARIANTS = ("NAME=SPEC;... with SPEC +K=V,... (on the problem's default), FAMILY:K=V,... "
            "(sm90-fwd, triton-fwd), cudnn, fa4 or another bench provider; the first "
            "variant is the base of every ratio")


def register(sub) -> None:
    p = sub.add_parser("tune", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = p.add_subparsers(dest="tune_command", metavar="SUBCOMMAND")
    for add in (_ab, _cells, _adopt, _convert, _compare, _offline):
        add(tsub)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(p) -> int:
    p.print_help()
    return 0


def _timing(q, rounds: int) -> None:
    common.add_dtype(q, help="bf16 or fp16 (default bf16)")
    q.add_argument("--rounds", type=common.integer(1), default=rounds,
                   help=f"interleaved rounds (default {rounds})")
    q.add_argument("--reps", type=common.integer(1), default=10,
                   help="timed launches per burst, after one warm-up (default 10)")
    q.add_argument("--no-flush", action="store_true",
                   help="do not evict the L2 before every launch (the default evicts it, "
                        "as the bench harness does)")
    q.add_argument("--seed", type=common.integer(0), default=0,
                   help="seed of the round orders")
    q.add_argument("--tuned", metavar="DIR", help="tuned files to read the defaults from "
                                                  "(default: the package's)")
    q.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: Triton's interpreter, the portable kernel only (tests, tiny "
                        "shapes; never adopted)")


def _ab(tsub) -> None:
    q = tsub.add_parser("ab", help="A/B of variants on one shape (GPU)",
                        description="Validate, then time variants on one shape in "
                                    "interleaved bursts; print each one's median time, "
                                    "TFLOP/s and median (IQR) ratio to the first.")
    q.add_argument("--shape", required=True, metavar="B,H,N,D[,Nk[,Hkv]]")
    common.add_causal(q, both=False)
    common.add_variant(q, mask_only=True, title="the rest of the mask (the cell's name "
                                              "carries it: w<L>_<R>, br, s<C>)")
    q.add_argument("--variants", required=True, help=VARIANTS)
    _timing(q, 20)
    common.add_output(q, out_help="write DIR/<cell>.json (the A/B result) and <cell>.csv")
    q.set_defaults(func=run_ab)


def _cells(tsub) -> None:
    q = tsub.add_parser("cells", help="A/Bs of many cells, one worker per GPU (GPU)",
                        description="For each cell: the default (d=+), --variants, "
                                    "--extra, --neighbours, --transplants and the peers, "
                                    "validated and timed in interleaved bursts; each cell "
                                    "on one GPU, the cells spread over all of them.")
    q.add_argument("--cells",
                   help="comma list of d<D><c|n><N>k (standard suite, e.g. d64c1k) or "
                        "BxHxNqxD[xNk[xHkv]]<c|n>")
    q.add_argument("--suite", metavar="NAME",
                   help="every shape of a bench suite of dense forward shapes as cells: "
                        "standard or models (instead of --cells)")
    q.add_argument("--variants", default="", help="variants for every cell: " + VARIANTS)
    q.add_argument("--extra", default="", help="CELL:NAME=SPEC;... variants of one cell")
    q.add_argument("--neighbours", action="store_true",
                   help="every config one knob from each cell's default that the rules "
                        "accept")
    q.add_argument("--transplants", action="store_true",
                   help="the other tuned entries of the cell's kernel, dtype and head dim")
    q.add_argument("--peers", default="cudnn",
                   help="comma list of cudnn, fa4 (named n, f), or none (default cudnn)")
    q.add_argument("--resume", action="store_true", help="skip the cells already in --out")
    q.add_argument("--devices", help="GPU ids to use (default: every visible one)")
    q.add_argument("--jobs", type=common.integer(0), default=0,
                   help="processes of the offline compiles first (default: one per core)")
    _timing(q, 12)
    common.add_output(q, out_help="DIR/<cell>.json per cell as it ends, DIR/summary.json "
                                  "and summary.csv (required)",
                      force_help="time every cell again into --out")
    q.set_defaults(func=run_cells)


def _adopt(tsub) -> None:
    q = tsub.add_parser("adopt", help="adopt A/B winners into the tuned files (offline)",
                        description="Apply the adoption rule to a folder of A/B results "
                                    "and write the winners through the tuned files' one "
                                    "writer (docs/tune.md gives the rule).")
    q.add_argument("ab_dir", metavar="AB_DIR")
    q.add_argument("--confirm", action="append", default=[], metavar="DIR",
                   help="another A/B run of the same cells that must agree (repeatable)")
    q.add_argument("--max-ratio", type=common.number(0, strict=True), default=0.995,
                   help="largest median ratio to the default adopted (default 0.995)")
    q.add_argument("--q3-below", type=common.number(1), default=1.0,
                   help="bound on each reading's third quartile (default 1; above 1 only "
                        "with two or more --confirm runs)")
    q.add_argument("--pooled", action="store_true",
                   help="the rule on every reading's rounds pooled (sign test) instead of "
                        "bounds per reading; needs --confirm")
    q.add_argument("--alpha", type=common.number(0, strict=True), default=0.01,
                   help="--pooled: the sign test's level (default 0.01)")
    q.add_argument("--tuned", metavar="DIR", help="tuned files to update (default: the "
                                                  "package's)")
    q.add_argument("--dry-run", action="store_true", help="decide, write no tuned file")
    common.add_output(q, out_help="write DIR/adopt.json (the verdicts) and adopt.csv")
    q.set_defaults(func=run_adopt)


def _convert(tsub) -> None:
    q = tsub.add_parser("convert", help="a format-1 tuned file -> format 2 (offline)")
    q.add_argument("file", metavar="FILE")
    common.add_output(q, csv=False, out_help="write DIR/<target>.json (default: FILE "
                                             "itself, which needs --force)")
    q.set_defaults(func=run_convert)


def _compare(tsub) -> None:
    q = tsub.add_parser("compare-sass", help="two ncu source pages: opcodes and stalls "
                                             "(offline)")
    q.add_argument("a", metavar="A", help="ncu --page source --csv export (.csv or .csv.gz)")
    q.add_argument("b", metavar="B")
    q.add_argument("--top", type=common.integer(1), default=16,
                   help="opcodes shown (default 16)")
    common.add_output(q, out_help="write DIR/compare-sass.json and compare-sass.csv")
    q.set_defaults(func=run_compare)


def _offline(tsub) -> None:
    from ..tune.offline import AMD_TARGETS, HEAD_DIMS, MAX_ROUNDS

    q = tsub.add_parser("offline", help="choose AMD defaults from offline readings (no GPU)",
                        description="For each AMD target, head dim, dtype and mask: compile "
                                    "the default and its one- and two-knob neighbours, "
                                    "reject spills and configs just past an occupancy "
                                    "cliff, rank the rest by the model, and search again "
                                    "from the winner until it stays (docs/report.md: AMD "
                                    "defaults and their neighbours).")
    common.add_target(q, default=",".join(AMD_TARGETS))
    common.add_head_dim(q, default=",".join(map(str, HEAD_DIMS)))
    common.add_dtype(q, default="bf16,fp16")
    common.add_causal(q, default="both")
    q.add_argument("--rounds", type=common.integer(1), default=MAX_ROUNDS,
                   help=f"rounds of the search at most (default {MAX_ROUNDS})")
    q.add_argument("--no-seed", action="store_true",
                   help="start every cell from its current default, not from the choice "
                        "of its relative (bf16, no mask, the padded head dim)")
    q.add_argument("--jobs", type=common.integer(0), default=2,
                   help="compile processes (default 2; 0: one per core)")
    q.add_argument("--write", action="store_true",
                   help="write the choices the defaults table does not already give as "
                        "tuned entries (never over a measured entry)")
    q.add_argument("--tuned", metavar="DIR", help="tuned files to read the defaults from and "
                                                  "write to (default: the package's)")
    common.add_output(q, out_help="write DIR/offline.json (every candidate and verdict) and "
                                  "offline.csv (one row per cell)")
    q.set_defaults(func=run_offline)


# -- GPU subcommands -------------------------------------------------------------------------

def _settings(args):
    from ..tune.ab import Settings

    args.dtype = common.one(args.dtype, "--dtype", "dtype")
    return Settings(args.rounds, args.reps, not args.no_flush, args.seed)


def _device_target(args) -> "str | None":
    """The GPU's target; refused at once when no GPU is visible (``--device cpu``:
    None)."""
    from ..testing.interpreter import choose_device

    if choose_device(args.device, f"tune {args.tune_command}") == "cpu":
        return None
    import torch

    from ..launch import device_target

    target = device_target(torch.device("cuda"))
    if target is None:
        raise FlashscopeError(f"tune {args.tune_command}: {torch.cuda.get_device_name()} "
                              "is not in flashscope's target tables (flashscope targets)")
    return target


def run_ab(args) -> int:
    from ..progress import Progress
    from ..tune.ab import run_ab as time_cell
    from ..tune.cells import shape_cell
    from ..tune.results import document
    from ..tune.variants import parse_variants

    settings = _settings(args)
    cell = shape_cell(args.shape, common.one(args.causal, "--causal", "mask"), args.dtype,
                      **common.variant_kw(args))
    specs = parse_variants(args.variants)
    common.prepare(args, name=cell.name)
    _device_target(args)
    with Progress(f"{cell.name}: rounds", settings.rounds) as bar:
        def log(text):
            bar.note(text)
            if ": round " in text:
                bar.advance()

        res = time_cell(cell, specs, settings, device=args.device, data_dir=args.tuned,
                        log=log)
    common.emit(args, document(res), rows=res["rows"], render=lambda con: _ab_table(con, res),
                name=cell.name)
    return 0


def _ab_table(con, res: dict) -> None:
    m = res["meta"]
    mask = "".join(f" {k} {m[k]}" for k in ("window", "align", "softcap") if k in m)
    t = common.table("variant", "time (ms)", "TFLOP/s", f"/ {res['rows'][0]['name']}",
                     "IQR", "config", left=("variant", "config"),
                     title=f"{m['cell']} ({m['shape']}{' causal' if m['causal'] else ''}"
                           f"{mask}, "
                           f"{m['dtype']}) on {m['device']}"
                           f"{', L2 flushed' if m['flush'] else ''}: median of "
                           f"{m['rounds']} rounds of {m['reps']}")
    for r in res["rows"]:
        t.add_row(r["name"], f"{r['ms']:.4f}", f"{r['tflops']:.1f}", f"{r['ratio']:.4f}",
                  f"{r['ratio_q1']:.4f}-{r['ratio_q3']:.4f}", r.get("label", r["provider"]))
    for name, why in res["dropped"].items():
        t.add_row(name, "-", "-", "-", "-", f"dropped: {why}")
    common.show(con, t)


def run_cells(args) -> int:
    from ..progress import Progress
    from ..tune.batch import cell_specs, parse_extra, run_cells as time_cells
    from ..tune.cells import parse_cells, suite_cells
    from ..tune.variants import parse_variants

    settings = _settings(args)
    if not args.out:
        raise FlashscopeError("tune cells: --out DIR is required (one result file per cell)")
    if args.resume and args.force:
        raise FlashscopeError("--resume and --force: give one or the other")
    if (args.cells is None) == (args.suite is None):
        raise FlashscopeError("tune cells: give --cells or --suite (one of them)")
    if args.suite is not None and args.device == "cpu":
        raise FlashscopeError("--suite needs a GPU: its shapes run thousands of tokens, which "
                              "Triton's CPU interpreter would take days over; name small "
                              "cells with --cells on the CPU")
    cells = parse_cells(args.cells, args.dtype) if args.cells is not None \
        else suite_cells(args.suite.strip(), args.dtype)
    common_specs = parse_variants(args.variants)
    extra = parse_extra(args.extra, cells)
    peers = [] if args.peers.strip() == "none" else [
        p.strip() for p in args.peers.split(",") if p.strip()]
    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices \
        else None
    args.out_dir = common.check_out_dir(args.out, (), force=True)  # cells: --resume/--force
    target = _device_target(args)
    plan = {c.name: (c, cell_specs(c, target, common=common_specs, extra=extra.get(c.name),
                                   neighbours=args.neighbours, transplants=args.transplants,
                                   peers=peers, data_dir=args.tuned)) for c in cells}
    executor = None
    if args.device == "cpu":
        from ..sweep.executors import SerialExecutor

        executor = SerialExecutor()
    with Progress("cells", len(plan)) as bar:
        def log(row):
            bar.note(f"{row['cell']}: " + (f"FAILED: {row['error']}" if "error" in row
                                           else f"done on GPU {row['gpu']} ({row['device']})"))
            bar.advance()

        summary = time_cells(plan, args.out, settings, target=target, devices=devices,
                             executor=executor, device=args.device, data_dir=args.tuned,
                             resume=args.resume, force=args.force, jobs=args.jobs, log=log)
    rows = [{"cell": r["cell"], "model": r.get("model"), "gpu": r.get("gpu"), "variant": n,
             "ratio": ratio, "tflops": r.get("tflops", {}).get(n),
             "best": n == r.get("best"), "regret": r.get("regret"), "error": r.get("error")}
            for r in summary["cells"] for n, ratio in r.get("ratios", {"-": None}).items()]
    common.emit(args, summary, rows=rows, render=lambda con: _cells_table(con, summary),
                name="summary")
    return 1 if summary["cells"] and all("error" in r for r in summary["cells"]) else 0


#: more variants than this and the cells table shows each cell's best config, not them all
_WIDE = 6


def _cells_table(con, summary: dict) -> None:
    """One row per cell: the default's TFLOP/s, each variant's time over the default's (or,
    with more than :data:`_WIDE` variants, only the peers'), the fastest flashscope config
    and the default's regret (its time over that config's)."""
    names = []
    for r in summary["cells"]:
        names += [n for n in r.get("ratios", {}) if n not in names]
    if len(names) > _WIDE:
        names = [n for n in names if any(n in _peer_names(r) for r in summary["cells"])]
    t = common.table("cell", "GPU", "d TFLOP/s", *names, "best config", "regret",
                     left=("cell", "best config"),
                     title="time / d's, median of rounds; regret: d's time / the best "
                           "config's")
    for r in summary["cells"]:
        cell = f"{r['cell']} ({r['model']})" if r.get("model") else r["cell"]
        if "error" in r:
            t.add_row(cell, "", f"FAILED: {r['error']}", *["" for _ in names], "", "")
            continue
        rat = r["ratios"]
        best = r.get("best")
        t.add_row(cell, str(r.get("gpu") or ""), f"{r['tflops'].get('d', 0):.1f}",
                  *(f"{rat[n]:.3f}" if n in rat else "-" for n in names),
                  "-" if best is None else f"{best}: {r.get('best_label') or ''}".strip(),
                  "-" if r.get("regret") is None else f"{r['regret']:.3f}")
    common.show(con, t)


def _peer_names(row: dict) -> set:
    """The variant names of a summary row that are not flashscope configs."""
    return set(row.get("ratios", {})) - set(row.get("configs", ()))


# -- offline subcommands ---------------------------------------------------------------------

def run_adopt(args) -> int:
    from ..tune.adopt import Rule, adopt

    rule = Rule(args.max_ratio, args.q3_below, args.alpha if args.pooled else None,
                tuple(args.confirm))
    common.prepare(args, name="adopt")
    verdicts = adopt(args.ab_dir, rule, data_dir=args.tuned, dry_run=args.dry_run)
    doc = {"dry_run": args.dry_run, "verdicts": [v.as_dict() for v in verdicts]}
    rows = [{"cell": v.cell, "action": v.action, "line": v.line, **v.stats}
            for v in verdicts]

    def render(con):
        for v in verdicts:
            con.print(v.line, highlight=False, markup=False)
        if args.dry_run:
            con.print("dry run: no tuned file written")
    common.emit(args, doc, rows=rows, render=render, name="adopt")
    return 0


def run_convert(args) -> int:
    from ..outfiles import json_text
    from ..tuned import convert, read_json

    source = common.check_input_file(args.file, "tune convert")
    data = convert(read_json(source), str(source))
    if args.out:
        name = f"{data['target']}.json"
        path = common.check_out_dir(args.out, (name,), args.force).file(name)
    elif args.force:
        path = source
    else:
        raise FlashscopeError(f"tune convert: {source} would be replaced by its conversion; "
                              "pass --force to convert it in place, or --out DIR")
    common.write_atomic(path, json_text(data))
    common.emit(args, data, write=False, render=lambda con: con.print(
        f"wrote {path}: {len(data['entries'])} entries, format 2"))
    return 0


def run_compare(args) -> int:
    from ..tune.sass import compare

    common.prepare(args, name="compare-sass")
    res = compare(args.a, args.b, args.top)
    common.emit(args, res, rows=res["opcode_diff"], render=lambda con: _sass_tables(con, res),
                name="compare-sass")
    return 0


def _sass_tables(con, res: dict) -> None:
    a, b = res["a"], res["b"]
    ta, tb = a["instructions"], b["instructions"]
    con.print(f"warp instructions executed, millions: A {ta / 1e6:.1f}, B {tb / 1e6:.1f} "
              f"({(ta - tb) / 1e6:+.1f})", highlight=False)
    t = common.table("opcode", "A (M)", "B (M)", "A - B (M)", left=("opcode",),
                     title="largest differences")
    for d in res["opcode_diff"]:
        t.add_row(d["opcode"], f"{d['a'] / 1e6:.1f}", f"{d['b'] / 1e6:.1f}",
                  f"{d['a_minus_b'] / 1e6:+.1f}")
    common.show(con, t)
    s = common.table("stall reason", "A", "B", "A - B", left=("stall reason",),
                     title="share of warp-stall samples")
    order = sorted(res["stall_diff"], key=lambda k: -max(a["stall_reasons"].get(k, 0),
                                                         b["stall_reasons"].get(k, 0)))
    for k in order[:10]:
        s.add_row(k, common.pct(a["stall_reasons"].get(k, 0)),
                  common.pct(b["stall_reasons"].get(k, 0)), f"{res['stall_diff'][k]:+.1%}")
    common.show(con, s)
    for side, name in ((a, "A"), (b, "B")):
        top = common.table("share", "address", "SASS", "reasons", left=("address", "SASS",
                                                                        "reasons"),
                           title=f"{name} ({side['path']}): most stalled instructions")
        for x in side["top_stalls"][:6]:
            top.add_row(common.pct(x["share"]), x["address"], x["sass"],
                        ", ".join(f"{k} {v}" for k, v in x["reasons"].items()))
        common.show(con, top)


def run_offline(args) -> int:
    import triton

    from ..families.base import check_head_dim
    from ..progress import Progress
    from ..tune import offline, offline_data

    for d in args.head_dim:
        check_head_dim(d)
    todo = offline.cells([t.name for t in args.target], args.head_dim, args.dtype,
                         args.causal)
    common.prepare(args, name="offline")
    read = offline.offline_reader(args.jobs)
    with Progress("cells", len(todo)) as bar:
        def log(ch):
            bar.note(f"{ch.cell.name}: {ch.chosen.config.label}")
            bar.advance()

        choices = offline.choose_cells(todo, read, data_dir=args.tuned,
                                       max_rounds=args.rounds, seeded=not args.no_seed,
                                       log=log)
    written, notes = (offline_data.write(choices, triton.__version__, args.tuned) if args.write
                      else ([], []))
    doc = {"triton": triton.__version__, "model": list(offline.TERMS),
           "choices": [ch.as_dict() for ch in choices],
           "rule_rows": [{"target": t, "head_dim": d, "causal": c, "config": cfg.label,
                          "config_fields": cfg.as_dict()}
                         for t, d, c, cfg in offline_data.rule_rows(choices)],
           "written": [str(p) for p in written], "notes": notes}
    rows = [_offline_row(ch) for ch in choices]
    common.emit(args, doc, rows=rows, name="offline",
                render=lambda con: _offline_table(con, choices, written, notes))
    return 0


def _offline_row(ch) -> dict:
    r = ch.chosen.as_dict()
    return {"target": ch.cell.target, "head_dim": ch.cell.head_dim, "dtype": ch.cell.dtype,
            "causal": ch.cell.causal, "start": ch.start.label, "chosen": r["config"],
            "vgprs": r["vgprs"], "spills": r["spills"], "lds_bytes": r["lds_bytes"],
            "waves_per_simd": r["waves_per_simd"], "workgroups": r["workgroups"],
            "occupancy": r["occupancy"],
            "room_before_loss": (r["cliff"] or {}).get("room_before_loss"),
            "read": ch.read, "rounds": len(ch.rounds), "clean": ch.clean,
            "converged": ch.converged}


def _offline_table(con, choices, written, notes) -> None:
    t = common.table("cell", "start", "chosen", "VGPRs", "spills", "waves/SIMD",
                     "occupancy", "room", "read", left=("cell", "start", "chosen"),
                     title="Defaults chosen offline (room: VGPRs before a workgroup is "
                           "lost; read: configs compiled and read)")
    for ch in choices:
        r = _offline_row(ch)
        flag = "" if ch.clean and ch.converged else (
            " (least bad: none clean)" if not ch.clean else " (not settled)")
        t.add_row(ch.cell.name, r["start"], r["chosen"] + flag, str(r["vgprs"]),
                  str(r["spills"]), str(r["waves_per_simd"]), common.pct(r["occupancy"]),
                  "-" if r["room_before_loss"] is None else str(r["room_before_loss"]),
                  str(r["read"]))
    common.show(con, t)
    for n in notes:
        con.print(n, highlight=False, markup=False)
    for p in written:
        con.print(f"wrote {p}", highlight=False, markup=False)
