"""The per-line view in the terminal, CSV and JSON, for ``flashscope inspect --lines`` and
``flashscope profile --lines``: one table per kernel (file:line and its text, instructions
by class, live registers, spills, what helpers inlined there add) under a head line with
the register checks and the peak, and its loops (the same sums by structure)."""

from __future__ import annotations

#: Table columns: header -> instruction classes summed into it (both vendors' names).
CLASS_COLUMNS = (
    ("mma", ("mma", "mfma", "wmma")),
    ("mem", ("global", "buffer_load", "buffer_store", "global_load", "global_store",
             "async_copy", "tma")),
    ("smem", ("shared", "ldmatrix", "ds_read", "ds_write")),
    ("exp", ("exp",)),
    ("bar", ("barrier", "s_barrier")),
)


def _cols(mix: dict) -> list:
    return [sum(mix.get(c, 0) for c in cs) for _, cs in CLASS_COLUMNS]


def head(kl) -> str:
    """One line: allocation, highest register, live peak and where, checks."""
    h = kl.highest_register
    if kl.vendor == "nvidia":
        high = f"R{h.get('R')}" if h.get("R") is not None else "-"
    else:
        high = " ".join(f"{c}{h[c]}" for c in ("v", "a", "s") if h.get(c) is not None)
    ok = sum(c["ok"] for c in kl.checks)
    peak = kl.peak or {}
    where = (f" at {_short(peak['file'])}:{peak['line']}" if peak.get("file") else "")
    out = (f"{kl.registers} registers allocated, highest {high}, live peak {kl.live_peak}"
           f"{where}, gap {kl.gap}; checks {ok}/{len(kl.checks)} ok")
    if kl.setmaxnreg:
        out += f"; setmaxnreg {', '.join(map(str, kl.setmaxnreg))}"
    return out


def _short(path) -> str:
    return str(path).rsplit("/", 1)[-1] if path else "?"


def print_tables(pairs, console=None, top: int = 0) -> None:
    """``pairs``: (label, KernelLines) in order."""
    from .. import terminal
    from ..isa.lines import row_order

    console = console or terminal.console()
    for label, kl in pairs:
        t = terminal.table("line", "source", "instr", *[c for c, _ in CLASS_COLUMNS],
                           "live max", "live mean", "spill st/ld",
                           "inlined here: instr / live max", title=f"{label}: {head(kl)}",
                           left=("line", "source"))
        rows = kl.rows
        if top:
            rows = sorted(rows, key=lambda r: -(r.count + (r.inlined or {}).get("count", 0)))
            rows = sorted(rows[:top], key=lambda r: row_order(r.file, r.line))
        for r in rows:
            inl = r.inlined or {}
            t.add_row(f"{'  ' if r.helper else ''}{_short(r.file)}:{r.line}",
                      (r.source or "").strip()[:60], str(r.count),
                      *[str(v) if v else "" for v in _cols(r.instructions)],
                      _fmt(r.live_registers_max), _fmt(r.live_registers_mean),
                      f"{r.spill_stores}/{r.spill_loads}" if r.spill_stores or r.spill_loads
                      else "", f"{inl['count']} / {_fmt(inl.get('live_registers_max'))}"
                      if inl else "")
        terminal.show(console, t)
        for c in kl.checks:
            console.print(f"  {'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}")
        _loops_table(console, label, kl)
        if kl.peak and kl.peak.get("by_line"):
            parts = [f"{x['registers']} from {_short(x['file'])}:{x['line']}"
                     for x in kl.peak["by_line"][:6]]
            console.print(f"  at the peak ({kl.peak['live']} live): {', '.join(parts)}")
        if kl.note:
            console.print(f"  note: {kl.note}")


#: Loops of fewer instructions are the compiler's waits (an mbarrier or a lock spun on):
#: the JSON keeps them, the terminal counts them
LOOP_SHOWN = 16


def _loops_table(console, label, kl) -> None:
    """The kernel's loops, nested by indentation: where its instructions, live registers
    and spills sit by structure (a spill in the innermost loop is paid every iteration)."""
    from .. import terminal

    shown = [d for d in kl.loops if d["count"] >= LOOP_SHOWN]
    if not shown:
        return
    t = terminal.table("loop", "at", "instr", *[c for c, _ in CLASS_COLUMNS], "live max",
                       "spill st/ld", title=f"{label}: loops", left=("loop", "at"))
    for d in shown:
        t.add_row("  " * d["depth"] + (d["source"] or "?").strip()[:56],
                  f"{_short(d['file'])}:{d['line']}" if d["file"] else "-", str(d["count"]),
                  *[str(v) if v else "" for v in _cols(d["instructions"])],
                  _fmt(d["live_registers_max"]),
                  f"{d['spill_stores']}/{d['spill_loads']}"
                  if d["spill_stores"] or d["spill_loads"] else "")
    terminal.show(console, t)
    small = len(kl.loops) - len(shown)
    if small:
        console.print(f"  {small} loops of fewer than {LOOP_SHOWN} instructions (waits) "
                      "left out here; --json lists them")


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def csv_rows(pairs, extra=None) -> list:
    """One row per (kernel, line); ``extra(label, row)`` adds columns (the profile's
    counters)."""
    classes = sorted({c for _, kl in pairs for r in kl.rows for c in r.instructions})
    rows = []
    for label, kl in pairs:
        for r in kl.rows:
            inl = r.inlined or {}
            d = {"kernel": label, "target": kl.target, "file": r.file, "line": r.line,
                 "source": (r.source or "").strip(), "helper": r.helper,
                 "instructions": r.count, "live_registers_max": r.live_registers_max,
                 "live_registers_mean": r.live_registers_mean,
                 "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
                 "inlined_instructions": inl.get("count", 0),
                 "inlined_live_registers_max": inl.get("live_registers_max")}
            d.update({f"mix.{c}": r.instructions.get(c, 0) for c in classes})
            if extra:
                d.update(extra(label, r))
            rows.append(d)
    return rows
