"""``flashscope profile --lines``: one launch's warp stalls and executed instructions per
source line and per loop (:mod:`flashscope.profile.lines`), in the terminal, as JSON, or
into --out."""

from __future__ import annotations

import os

from . import common


def _artifact(target, shape, dtype: str, causal: bool, config: str, kernel: str = "fwd"):
    """The config built offline for ``target`` at ``shape`` (what the page is joined to
    when no --binary is given): ``config`` on top of the target's default, as a launch
    with that config text would run it; ``kernel`` as --kernel names it (a backward
    kernel: its family's config, as the recording's backward ran it)."""
    from .. import compile as fcompile
    from ..families import Problem, config_from_text
    from ..profile.lines import recorded_kernel

    B, H, N, D = shape
    family = recorded_kernel(kernel)[1] or None
    cfg = config_from_text(config, Problem(target.name, dtype, D, causal, N, N, B * H),
                           family)
    return fcompile.build(cfg, target, head_dim=D, dtype=dtype, causal=causal,
                          kernel=kernel if family else "fwd", problem=(B, H, H, N, N))


def run_lines(args) -> int:
    from ..errors import FlashscopeError
    from ..profile.lines import profile_lines, record, recorded_kernel
    from .profile import parse_shape

    shape = parse_shape(args.shape)
    dtype = common.one(args.dtype, "--dtype", "dtype")
    causal = common.one(args.causal, "--causal")
    target = common.one(args.target, "--target", "target")
    configs = [c.strip() for c in args.configs.split(";") if c.strip()]
    if len(configs) > 1:
        raise FlashscopeError("--lines profiles one launch: give one config in --configs")
    if args.ncu_csv or args.from_csv:
        raise FlashscopeError("--lines reads a source page (--source-page), not "
                              "--ncu-csv/--from-csv")
    for path in args.source_page:
        common.check_input_file(path, "--source-page")
    if args.page_alone:
        return _run_page_alone(args)
    if len(args.source_page) > 1:
        raise FlashscopeError("--source-page: --lines joins one page to its binary; give one "
                              "(several pages compare with --page-alone)")
    page_path = args.source_page[0] if args.source_page else ""
    if args.binary and not os.path.isdir(args.binary):
        common.check_input_file(args.binary, "--binary")
    recorded_kernel(args.kernel)  # an unknown or decoding --kernel is refused before any work
    common.prepare(args, extra=["source.csv", "lines.ncu-rep", "triton-cache"])
    config = configs[0] if configs else ""
    if page_path:
        if args.binary:
            view, page = profile_lines(page_path, binary=args.binary,
                                       kernel_name=args.kernel_name)
        else:
            view, page = profile_lines(page_path,
                                       artifact=_artifact(target, shape, dtype, causal, config,
                                                          args.kernel),
                                       kernel_name=args.kernel_name)
    else:
        import tempfile

        out = str(args.out_dir.path) if args.out_dir else tempfile.mkdtemp(
            prefix="flashscope-lines-")
        short = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
        page_path, cache = record(shape, short, causal, config, out, args.ncu,
                                  kernel=args.kernel)
        view, page = profile_lines(page_path, binary=cache, kernel_name=args.kernel_name)
    result = {"source_page": page_path, "kernel": view.kernel, "config": config,
              "recorded": args.kernel,
              "shape": dict(zip("BHND", shape)), "lines": view.as_dict(),
              "stalls_by_reason": _reasons(view)}
    from .lines_view import csv_rows

    rows = csv_rows([(view.kernel, view)], extra=lambda _, r: dict(r.counters or {}))
    common.emit(args, result, rows=rows, render=lambda con: _print(con, view, result, args.top))
    return 0


def _run_page_alone(args) -> int:
    """--page-alone: a recorded page without its binary
    (:func:`flashscope.profile.source_page.page_alone`)."""
    from ..errors import FlashscopeError
    from ..profile import source_page

    if not args.source_page:
        raise FlashscopeError("--page-alone reads a recorded page: give --source-page FILE")
    if args.binary:
        raise FlashscopeError("--page-alone reads the page without a binary: drop --binary "
                              "(with it, the page is joined to its source lines)")
    pages = [source_page.pick(source_page.load(p), args.kernel_name) for p in args.source_page]
    common.prepare(args)
    if len(pages) > 1:
        return _compare_pages(args, pages)
    result = {"source_page": args.source_page[0],
              **source_page.page_alone(pages[0], args.top or 20)}
    total = result["stall_samples"] or 1.0
    rows = [{"kind": "opcode", "opcode": o["opcode"], "offset": "", "sass": "",
             "instructions": o["instructions"],
             "instructions_executed": o["instructions_executed"],
             "stall_samples": o["stall_samples"], "share": o["stall_samples"] / total}
            for o in result["by_opcode"]]
    rows += [{"kind": "instruction", "opcode": source_page.opcode(t["sass"]),
              "offset": f"0x{t['offset']:x}", "sass": t["sass"], "instructions": 1,
              "instructions_executed": t["counters"].get("instructions_executed", 0),
              "stall_samples": t["counters"].get("stall_samples", 0),
              "share": t["counters"].get("stall_samples", 0) / total}
             for t in result["top"]]
    common.emit(args, result, rows=rows, render=lambda con: _print_alone(con, result))
    return 0


def _compare_pages(args, pages) -> int:
    """Two or more pages alone, side by side
    (:func:`flashscope.profile.source_page.compare`)."""
    from ..profile import source_page

    result = {"source_pages": list(args.source_page), **source_page.compare(pages)}
    names = [f"page {i + 1}" for i in range(len(pages))]
    rows = [{"kind": kind, "name": r[key],
             **{f"{n} {col}": r[col][i] for i, n in enumerate(names)
                for col in ("share", "instructions_executed") if col in r}}
            for kind, key, table in (("opcode", "opcode", result["by_opcode"]),
                                     ("reason", "reason", result["by_reason"]))
            for r in table]
    common.emit(args, result, rows=rows,
                render=lambda con: _print_compare(con, result, args.top or 20))
    return 0


def _print_compare(console, result, top: int) -> None:
    from .. import terminal

    heads = [f"{i + 1}: {_short_name(p['kernel'])}" for i, p in enumerate(result["pages"])]
    console.print("pages: " + "; ".join(
        f"{h} ({p['instructions']} instructions, {p['stall_samples']:,.0f} samples)"
        for h, p in zip(heads, result["pages"])))
    for kind, key, table in (("opcode", "opcode", result["by_opcode"][:top]),
                             ("reason", "reason", result["by_reason"])):
        cols = [f"share {i + 1}" for i in range(len(heads))]
        extra = ([f"warp instr {i + 1}" for i in range(len(heads))]
                 if kind == "opcode" else [])
        t = terminal.table(kind, *cols, *extra,
                           title=f"stall samples by {kind} (shares of each page's)",
                           left=(kind,))
        for r in table:
            if max(r["share"]) < 0.0005:  # 0.0% on every page
                continue
            t.add_row(r[key], *(f"{v:.1%}" for v in r["share"]),
                      *(f"{v:,.0f}" for v in r.get("instructions_executed", [])[:len(extra)]))
        terminal.show(console, t)


def _short_name(kernel: str) -> str:
    return kernel if len(kernel) <= 60 else kernel[:57] + "..."


def _print_alone(console, result) -> None:
    from .. import terminal

    total = result["stall_samples"] or 1.0
    name = _short_name(result["kernel"])
    t = terminal.table("opcode", "instr", "warp instr executed", "stall samples", "share",
                       title=f"{name}: stalls by opcode (the page alone, "
                             f"{result['instructions']} instructions; no binary, no lines)",
                       left=("opcode",))
    for o in result["by_opcode"][:12]:
        t.add_row(o["opcode"], str(o["instructions"]), f"{o['instructions_executed']:,.0f}",
                  f"{o['stall_samples']:,.0f}", f"{o['stall_samples'] / total:.1%}")
    terminal.show(console, t)
    t = terminal.table("offset", "sass", "warp instr executed", "stall samples", "share",
                       "top reasons", title=f"{name}: instructions by stall "
                                            "samples", left=("offset", "sass", "top reasons"))
    for x in result["top"]:
        t.add_row(f"+0x{x['offset']:x}", x["sass"][:56],
                  *_counter_cells(x["counters"], total))
    terminal.show(console, t)
    _print_reasons(console, result["stalls_by_reason"], total)


def _print_reasons(console, reasons: dict, total: float) -> None:
    """The line under a table: the eight largest stall reasons as shares of ``total``
    (``reasons`` largest first)."""
    console.print("stalls by reason: " + ", ".join(
        f"{k} {v / total:.1%}" for k, v in list(reasons.items())[:8]))


def _reasons(view) -> dict:
    from ..profile.source_page import by_reason

    return dict(sorted(by_reason(view.rows).items(), key=lambda kv: -kv[1]))


def _print(console, view, result, top: int) -> None:
    from .. import terminal
    from .lines_view import _fmt, _short, head

    total = sum((r.counters or {}).get("stall_samples", 0) for r in view.rows) or 1.0
    rows = [r for r in view.rows if r.counters]
    if top:
        rows = sorted(rows, key=lambda r: -r.counters.get("stall_samples", 0))[:top]
    t = terminal.table("line", "source", "warp instr executed", "stall samples", "share",
                       "top reasons", "instr", "live max",
                       title=f"{view.kernel}@{view.target}: {head(view)}",
                       left=("line", "source", "top reasons"))
    for r in rows:
        c = r.counters
        t.add_row(f"{'  ' if r.helper else ''}{_short(r.file)}:{r.line}",
                  (r.source or "").strip()[:56], *_counter_cells(c, total), str(r.count),
                  _fmt(r.live_registers_max))
    terminal.show(console, t)
    _print_loops(console, view, total)
    _print_reasons(console, result["stalls_by_reason"], total)


def _print_loops(console, view, total: float) -> None:
    """The stalls by loop, nested by indentation (:func:`flashscope.isa.lines.loop_rows`):
    the share of the launch's samples each loop's instructions took, its own waits
    included, so an inner loop's share is part of its outer loop's; then, of the loop's
    own samples, how many found a warp issuing and what the others waited on. In a
    warp-specialized kernel a partition's share grows with its warps (a one-warp
    producer beside eight consumer warps); the loop's own shares do not."""
    from .. import terminal
    from .lines_view import LOOP_SHOWN, _short

    loops = [d for d in view.loops if d["count"] >= LOOP_SHOWN and d.get("counters")]
    if not loops:
        return
    t = terminal.table("loop", "at", "instr", "warp instr executed", "stall samples",
                       "share", "issued", "waits (of the loop's samples)",
                       title=f"{view.kernel}: stalls by loop",
                       left=("loop", "at", "waits (of the loop's samples)"))
    for d in loops:
        c = d["counters"]
        t.add_row("  " * d["depth"] + ((d["source"] or "").strip()[:48] or "(loop)"),
                  f"{_short(d['file'])}:{d['line']}" if d["file"] else "-", str(d["count"]),
                  *_counter_cells(c, total)[:3], *_own_cells(c))
    terminal.show(console, t)


def _own_cells(c: dict) -> tuple:
    """(the share of a row's samples that found its warp issuing, the three largest other
    reasons as shares of the row's own samples)."""
    own = c.get("stall_samples", 0)
    if not own:
        return "-", ""
    return (f"{c.get('stall.selected', 0) / own:.1%}",
            _top_reasons(c, own, 3, skip="selected"))


def _counter_cells(c: dict, total: float) -> tuple:
    """(warp instructions executed, stall samples, their share of ``total``, the two
    largest stall reasons) of one row's summed counters."""
    return (f"{c.get('instructions_executed', 0):,.0f}", f"{c.get('stall_samples', 0):,.0f}",
            f"{c.get('stall_samples', 0) / total:.1%}", _top_reasons(c, total, 2))


def _top_reasons(c: dict, total: float, n: int, skip: str = "") -> str:
    """The ``n`` largest stall reasons of a row's counters (but ``skip``) as shares of
    ``total``."""
    reasons = sorted(((v, k[len("stall."):]) for k, v in c.items()
                      if k.startswith("stall.") and k != f"stall.{skip}" and v), reverse=True)
    return ", ".join(f"{k} {v / total:.1%}" for v, k in reasons[:n])
