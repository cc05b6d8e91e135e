"""Outputs of the backward report: the rich terminal summary, ``bwd_registers.png`` and
``staircase.png``, one self-contained ``report.html`` and ``report.json``.

- ``bwd_registers.png``: per target, measured registers per thread (VGPRs per lane) of the
  dK/dV and dQ kernel of each config at the report's head dim; red edges where it spills.
- ``staircase.png``: the forward report's occupancy staircase, with each point labelled
  ``dkdv:<config>`` or ``dq:<config>``.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from types import SimpleNamespace

from .backward import BWD_KERNELS
from .render_terminal import _pct, _signed

_SHORT = {"bwd_dkdv": "dkdv", "bwd_dq": "dq"}


def _measured(r) -> list:
    """config, D, target, kernel, registers, spills, shared, occupancy, limiter."""
    head = [r.config.label, r.head_dim, r.target, BWD_KERNELS[r.kernel][0]]
    if r.record is None:
        return head + ["-", "-", "-", "-", (r.error or "")[:48]]
    return head + [r.record.registers, r.spills, r.record.shared_bytes,
                   _pct(r.occ.occupancy if r.occ else None),
                   ",".join(r.occ.limiter) if r.occ else (r.error or "-")[:48]]


_MEASURED_HEAD = ("config", "D", "target", "kernel", "registers", "spills", "shared B",
                  "occupancy", "limiter")


def _ablation_cell(e) -> str:
    if e is None:
        return ""
    if "d_registers" not in e:
        bad = e["before"] if not e["before"]["ok"] else e["after"]
        return "not built" if not bad.get("error") else bad["error"][:28]
    return (f"{_signed(e['d_registers'])} r / {_signed(e['d_spills'])} sp / "
            f"{_pct(e['before']['occupancy'])}->{_pct(e['after']['occupancy'])}")


def render_bwd(report, console=None, out_dir=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    names = [t.name for t in report.spec.targets]
    bases = ", ".join(f"{t} {k}" for t, k in report.as_dict()["spec"]["base"].items())
    tab = Table(title=f"Backward kernels, measured (no analytic budget); bases: {bases}",
                title_justify="left")
    for col in _MEASURED_HEAD:
        tab.add_column(col, justify="left" if col in ("config", "target", "kernel",
                                                       "limiter") else "right")
    for r in sorted(report.main_rows(), key=lambda r: (r.kernel, r.target)):
        tab.add_row(*map(str, _measured(r)))
    console.print(tab)
    tab = Table(title="Backward ablations (compiled): d registers / d spills / occupancy "
                      "before -> after", title_justify="left")
    tab.add_column("kernel")
    tab.add_column("step")
    for n in names:
        tab.add_column(n)
    for a in report.ablations:
        tab.add_row(BWD_KERNELS[a["kernel"]][0], a["name"],
                    *[_ablation_cell(a["targets"].get(n)) for n in names])
    console.print(tab)
    tab = Table(title="Just past a cliff: the saving that gains a block (workgroup)",
                title_justify="left")
    for col in ("target", "kernel", "config", "resource", "now", "save", "occupancy"):
        tab.add_column(col)
    for c in report.cliffs:
        if c["near"]:
            tab.add_row(c["target"], BWD_KERNELS[c["kernel"]][0], c["config"], c["resource"],
                        str(c["value"]), str(c["save_to_gain"]),
                        f"{_pct(c['occupancy'])} -> {_pct(c['occupancy_after'])}")
    console.print(tab)
    t = report.timings
    tail = f"{t.get('kernels', 0)} kernels in {t.get('compile_s', 0):.1f} s"
    if out_dir is not None:
        tail += f"; report written to {out_dir}"
    console.print(tail)


def plot_registers(report, path) -> str:
    from .plots import _plt

    plt = _plt()
    names = [t.name for t in report.spec.targets]
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        for j, kernel in enumerate(BWD_KERNELS):
            mine = [r for r in report.main_rows() if r.target == name and r.kernel == kernel
                    and r.record is not None]
            xs = [2 * i + j * 0.8 for i in range(len(mine))]
            ax.bar(xs, [r.record.registers for r in mine], width=0.75,
                   color=f"C{j}", label=BWD_KERNELS[kernel][0],
                   edgecolor=["red" if r.spills else "none" for r in mine], linewidth=2)
            for x, r in zip(xs, mine):
                ax.annotate(r.config.label, (x, 0), rotation=90, fontsize=6, xytext=(0, 3),
                            textcoords="offset points", ha="center", va="bottom",
                            color="white")
        ax.set_xticks([])
        ax.set_ylabel("registers / thread")
        ax.set_title(f"{name}: measured registers (red edge: spills)", fontsize=10,
                     loc="left")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def plot_staircase_bwd(report, path) -> str:
    from .plots import plot_staircase

    rows = [SimpleNamespace(record=r.record, occ=r.occ, target=r.target, spills=r.spills,
                            config=SimpleNamespace(label=f"{_SHORT[r.kernel]}:{r.config.label}"))
            for r in report.main_rows()]
    shim = SimpleNamespace(spec=report.spec, main_rows=lambda: rows)
    return plot_staircase(shim, path)


def write_bwd_html(report, path, plots: dict) -> str:
    from .html import _CSS, _img, _table

    s = report.spec
    measured = _table(_MEASURED_HEAD, [_measured(r) for r in
                                       sorted(report.main_rows(),
                                              key=lambda r: (r.kernel, r.target))],
                      left=("config", "target", "kernel", "limiter"),
                      classes=["spill" if r.spills or r.record is None else "" for r in
                               sorted(report.main_rows(), key=lambda r: (r.kernel, r.target))])
    names = [t.name for t in s.targets]
    abl = _table(("kernel", "step", *names),
                 [[BWD_KERNELS[a["kernel"]][0], a["name"],
                   *[_ablation_cell(a["targets"].get(n)) for n in names]]
                  for a in report.ablations], left=("kernel", "step", *names))
    near = [c for c in report.cliffs if c["near"]]
    cliffs = _table(("target", "kernel", "config", "resource", "now", "save", "occupancy"),
                    [[c["target"], BWD_KERNELS[c["kernel"]][0], c["config"], c["resource"],
                      c["value"], c["save_to_gain"],
                      f"{_pct(c['occupancy'])} -> {_pct(c['occupancy_after'])}"]
                     for c in near], left=("target", "kernel", "config", "resource"))
    bases = ", ".join(f"{t} <code>{escape(k)}</code>"
                      for t, k in report.as_dict()["spec"]["base"].items())
    title = "flashscope report: backward kernels (dK/dV, dQ)"
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{_CSS}</style></head><body><h1>{title}</h1>"
            f"<p class='muted'>{', '.join(names)}; head dim {s.head_dim}, {s.dtype}, "
            f"{'causal' if s.causal else 'non-causal'}; bases (each target's default "
            f"backward config): {bases}; {report.timings.get('kernels', 0)} kernels. "
            "Measured only: no analytic register budget for the backward.</p>"
            f"<h2>Registers, spills, shared memory, occupancy</h2>{measured}"
            f"{_img(plots['registers'])}<h2>Ablations</h2>"
            "<p>One knob of each target's base at a time; a tile knob changes only the "
            "kernel that uses it (BLOCK_M1/BLOCK_N1: dK/dV, BLOCK_M2/BLOCK_N2: dQ).</p>"
            f"{abl}<h2>Occupancy cliffs</h2>{cliffs}{_img(plots['staircase'])}"
            "</body></html>")
    Path(path).write_text(page)
    return str(path)


def write_bwd_report(report, out_dir) -> dict:
    """report.json, bwd_registers.png, staircase.png and report.html into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out / "report.json")}
    (out / "report.json").write_text(json.dumps(report.as_dict(), indent=1, default=str))
    plots = {"registers": plot_registers(report, out / "bwd_registers.png"),
             "staircase": plot_staircase_bwd(report, out / "staircase.png")}
    files.update(plots)
    files["html"] = write_bwd_html(report, out / "report.html", plots)
    return files
