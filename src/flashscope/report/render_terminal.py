"""The terminal summary (rich): budget vs measurement, the model's error, ablations with
NVIDIA and AMD side by side, and the configs just past a cliff."""

from __future__ import annotations

from ..budget import COMPONENTS


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _signed(x) -> str:
    return "-" if x is None else f"{x:+d}" if isinstance(x, int) else f"{x:+.1f}"


def budget_table(report):
    from rich.table import Table

    tab = Table(title="Registers per thread (lane): measured vs the analytic budget",
                title_justify="left")
    for col in ("config", "D", "target", "measured", "spills", *COMPONENTS, "predicted",
                "error", "dominant", "occupancy", "limiter"):
        tab.add_column(col, justify="left" if col in ("config", "target", "dominant",
                                                       "limiter") else "right")
    for r in report.main_rows():
        if r.record is None or r.comparison is None:
            tab.add_row(r.config.label, str(r.head_dim), r.target, "-", "-",
                        *["" for _ in COMPONENTS], "-", "-", (r.error or "")[:48], "-", "-")
            continue
        c, b = r.comparison, r.budget
        err = f"{c['error']:+.0f} ({100 * c['rel_error']:+.0f}%)" + (" spills" if c["spilled"]
                                                                      else "")
        tab.add_row(r.config.label, str(r.head_dim), r.target, str(c["measured"]),
                    str(r.spills), *[f"{b.parts[k]:.0f}" for k in COMPONENTS],
                    f"{c['predicted']:.0f}", err, c["dominant"],
                    _pct(r.occ.occupancy if r.occ else None),
                    ",".join(r.occ.limiter) if r.occ else "-")
    return tab


def model_table(report):
    from rich.table import Table

    tab = Table(title="How well the budget predicts the measurement", title_justify="left")
    for col in ("target", "rows", "mean |error| (no spills)", "max |error|", "spilling rows",
                "dominant"):
        tab.add_column(col)
    for t, s in report.model_summary().items():
        dom = ", ".join(f"{k} {v}" for k, v in sorted(s["dominant"].items(),
                                                      key=lambda kv: -kv[1]))
        tab.add_row(t, str(s["rows"]), _pct(s["mean_abs_rel_error"]),
                    _pct(s["max_abs_rel_error"]), str(s["spilled"]), dom)
    return tab


def ablation_table(report):
    from rich.table import Table

    names = [t.name for t in report.spec.targets]
    tab = Table(title="Ablations (compiled): d registers / d spills / occupancy before -> "
                      "after", title_justify="left")
    tab.add_column("step")
    for n in names:
        tab.add_column(n)
    for a in report.ablations:
        cells = []
        for n in names:
            e = a["targets"][n]
            if "d_registers" not in e:
                bad = e["before"] if not e["before"]["ok"] else e["after"]
                cells.append("not built" if not bad.get("error") else bad["error"][:28])
                continue
            cells.append(f"{_signed(e['d_registers'])} r / {_signed(e['d_spills'])} sp / "
                         f"{_pct(e['before']['occupancy'])}->{_pct(e['after']['occupancy'])}")
        tab.add_row(a["name"], *cells)
    return tab


def cliff_table(report):
    from rich.table import Table

    tab = Table(title="Just past a cliff: the saving that gains a block (workgroup)",
                title_justify="left")
    for col in ("target", "config", "D", "resource", "now", "save", "occupancy"):
        tab.add_column(col)
    for c in report.cliffs:
        if not c["near"]:
            continue
        tab.add_row(c["target"], c["config"], str(c["head_dim"]), c["resource"],
                    str(c["value"]), str(c["save_to_gain"]),
                    f"{_pct(c['occupancy'])} -> {_pct(c['occupancy_after'])}")
    return tab


def defaults_table(report):
    """The kernel each target runs by default, as compiled."""
    from rich.table import Table

    tab = Table(title="The kernel that runs (by default, per target)", title_justify="left")
    for col in ("target", "D", "config", "registers", "spills", "occupancy"):
        tab.add_column(col, justify="left" if col in ("target", "config") else "right",
                       overflow="fold")
    for r in report.defaults:
        rec = r.record
        tab.add_row(r.target, str(r.head_dim), r.config.label,
                    "failed" if rec is None else str(rec.registers),
                    "-" if rec is None else str(r.spills),
                    _pct(r.occ.occupancy if r.occ else None))
    return tab


def render(report, console=None, out_dir=None) -> None:
    from rich.console import Console

    console = console or Console()
    console.print(defaults_table(report))
    console.print(budget_table(report))
    console.print(model_table(report))
    console.print(ablation_table(report))
    console.print(cliff_table(report))
    t = report.timings
    tail = f"{t.get('kernels', 0)} kernels in {t.get('compile_s', 0):.1f} s"
    if out_dir is not None:
        tail += f"; report written to {out_dir}"
    console.print(tail)
