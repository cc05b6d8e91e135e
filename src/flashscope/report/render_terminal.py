"""The terminal summary (rich): budget vs measurement, the model's error, ablations with
NVIDIA and AMD side by side, and the configs just past a cliff. Tables fit 100 columns
(:mod:`flashscope.terminal`): the budget's components share one wrapped cell."""

from __future__ import annotations

from ..budget import COMPONENTS
from ..terminal import label, pct, show, table
from .collect import no_comparison, unbuilt



def _signed(x) -> str:
    return "-" if x is None else f"{x:+d}" if isinstance(x, int) else f"{x:+.1f}"


def _parts(budget) -> str:
    return ", ".join(f"{k} {budget.parts[k]:.0f}" for k in COMPONENTS)


def budget_table(report):
    rows = report.main_rows()
    dims = len({r.head_dim for r in rows}) > 1
    cols = ["config", *(["D"] if dims else []), "target", "regs", "budget (error)",
            "budget parts", "dominant", "spills", "occupancy", "limiter"]
    tab = table(*cols, title="Registers per thread (lane): measured vs the analytic budget "
                "(spills marked * cap the count: it is what the allocator was allowed)",
                left=("config", "target", "budget parts", "dominant", "limiter"))
    for r in rows:
        head = [label(r.config), *([str(r.head_dim)] if dims else []), r.target]
        if r.record is None or r.comparison is None:
            cell, reason = no_comparison(r)
            tab.add_row(*head, str(cell), "-", "-", "-", "-", "-", reason)
            continue
        c, b = r.comparison, r.budget
        tab.add_row(*head, str(c["measured"]),
                    f"{c['predicted']:.0f} ({100 * c['rel_error']:+.0f}%)", _parts(b),
                    c["dominant"], str(r.spills) + ("*" if c["spilled"] else ""),
                    pct(r.occ.occupancy if r.occ else None),
                    ", ".join(r.occ.limiter) if r.occ else "-")
    return tab


def model_table(report):
    tab = table("target", "rows", "mean |error| (no spills)", "max |error|", "spilling rows",
                "dominant", title="How well the budget predicts the measurement",
                left=("target", "dominant"))
    for t, s in report.model_summary().items():
        dom = ", ".join(f"{k} {v}" for k, v in sorted(s["dominant"].items(),
                                                      key=lambda kv: -kv[1]))
        tab.add_row(t, str(s["rows"]), pct(s["mean_abs_rel_error"]),
                    pct(s["max_abs_rel_error"]), str(s["spilled"]), dom)
    return tab


def ablation_cell(e) -> str:
    """One target's cell of an ablation step: d registers / d spills / occupancy."""
    if e is None:
        return ""
    if "d_registers" not in e:
        bad = e["before"] if not e["before"]["ok"] else e["after"]
        cell = unbuilt(bad.get("refused", False), None)[0]
        return cell + (f": {bad['error']}" if bad.get("error") else "")
    return (f"{_signed(e['d_registers'])} regs, {_signed(e['d_spills'])} spills, "
            f"{pct(e['before']['occupancy'])} -> {pct(e['after']['occupancy'])}")


def ablation_table(report):
    names = [t.name for t in report.spec.targets]
    tab = table("step", *names, title="Ablations (compiled): d registers, d spills, "
                "occupancy before -> after", left=("step", *names))
    for a in report.ablations:
        tab.add_row(a["name"], *[ablation_cell(a["targets"][n]) for n in names])
    return tab


def cliff_table(report):
    tab = table("target", "config", "D", "resource", "now", "save", "occupancy",
                title="Just past a cliff: the saving that gains a block (workgroup)",
                left=("target", "config", "resource"))
    for c in report.cliffs:
        if not c["near"]:
            continue
        tab.add_row(c["target"], c["config"], str(c["head_dim"]), c["resource"],
                    str(c["value"]), str(c["save_to_gain"]),
                    f"{pct(c['occupancy'])} -> {pct(c['occupancy_after'])}")
    return tab


def defaults_table(report):
    """The kernel each target runs by default, as compiled."""
    tab = table("target", "D", "runs by default", "regs", "spills", "occupancy",
                title="The kernel that runs (the default config per target)",
                left=("target", "runs by default"))
    for r in report.defaults:
        rec = r.record
        tab.add_row(r.target, str(r.head_dim), label(r.config),
                    unbuilt(r.refused, r.error)[0] if rec is None else str(rec.registers),
                    "-" if rec is None else r.spill_cell,
                    pct(r.occ.occupancy if r.occ else None))
    return tab


def neighbours_table(report):
    """Each AMD default next to its neighbours and why each lost (the offline choice's
    verdicts, :meth:`flashscope.tune.offline.Choice.verdicts`)."""
    tab = table("target", "D", "config", "VGPRs", "spills", "waves/SIMD", "occupancy",
                "verdict", title="AMD defaults and their neighbours, as the offline choice "
                "reads them (spill-free, not just past a cliff, then the model)",
                left=("target", "config", "verdict"))
    for ch in report.choices:
        for v in ch.verdicts():
            first = v["role"] == "default"
            tab.add_row(ch.cell.target if first else "", str(ch.cell.head_dim) if first else "",
                        v["config"] if first else f"  {v['move']}",
                        "-" if v["vgprs"] is None else str(v["vgprs"]),
                        "-" if v["spills"] is None else str(v["spills"]),
                        "-" if v["waves_per_simd"] is None else str(v["waves_per_simd"]),
                        pct(v["occupancy"]), v["verdict"])
    return tab


def render(report, console=None, out_dir=None) -> None:
    from ..terminal import console as make_console

    console = console or make_console()
    tables = [budget_table(report), model_table(report), ablation_table(report),
              cliff_table(report)]
    show(console, *([defaults_table(report)] if report.defaults else []),
         *([neighbours_table(report)] if report.choices else []), *tables)
    t = report.timings
    tail = f"{t.get('kernels', 0)} kernels in {t.get('compile_s', 0):.1f} s"
    if out_dir is not None:
        tail += f"; report written to {out_dir}"
    console.print(tail)
