"""Outputs of a family's report (:mod:`.backward`: ``--kernel bwd|decode``): the rich
terminal summary, ``<family>_registers.png`` and ``staircase.png``, one self-contained
``report.html`` and ``report.json``.

- ``<family>_registers.png`` (``bwd_registers.png``, ``decode_registers.png``): per target,
  measured registers per thread (VGPRs per lane) of each of the family's kernels for each
  config at the report's head dim; red edges where it spills.
- ``staircase.png``: the forward report's occupancy staircase, with each point labelled
  by its kernel's short label and config (``dkdv:<config>``, ``paged:<config>``).
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from types import SimpleNamespace

from ..terminal import label, pct, show, table
from .collect import unbuilt
from .render_terminal import ablation_cell

def registers_file(family) -> str:
    """The registers plot's file name for a :class:`~.backward.FamilyKernels`."""
    return f"{family.name}_registers.png"


def _label(report, kernel: str) -> str:
    return report.spec.family.kernels[kernel][0]


def _measured(report, r) -> list:
    """config, D, target, kernel, registers, spills, shared, occupancy, limiter."""
    head = [label(r.config), r.head_dim, r.target, _label(report, r.kernel)]
    if r.record is None:
        cell, reason = unbuilt(r.refused, r.error)
        return head + [cell, "-", "-", "-", reason]
    return head + [r.record.registers, r.spill_cell, r.record.shared_bytes,
                   pct(r.occ.occupancy if r.occ else None),
                   ", ".join(r.occ.limiter) if r.occ else (r.error or "-")]


_MEASURED_HEAD = ("config", "D", "target", "kernel", "registers", "spills", "shared (B)",
                  "occupancy", "limiter")


def render_bwd(report, console=None, out_dir=None) -> None:
    from ..terminal import console as make_console

    console = console or make_console()
    names = [t.name for t in report.spec.targets]
    bases = ", ".join(f"{t} {k}" for t, k in report.as_dict()["spec"]["base"].items())
    noun = report.spec.family.noun.capitalize()
    measured = table(*_MEASURED_HEAD, title=f"{noun} kernels, measured (no analytic "
                     f"budget); bases: {bases}", left=("config", "target", "kernel",
                                                       "limiter"))
    for r in sorted(report.main_rows(), key=lambda r: (r.kernel, r.target)):
        measured.add_row(*map(str, _measured(report, r)))
    abl = table("kernel", "step", *names, title=f"{noun} ablations (compiled): d "
                "registers, d spills, occupancy before -> after",
                left=("kernel", "step", *names))
    for a in report.ablations:
        abl.add_row(_label(report, a["kernel"]), a["name"],
                    *[ablation_cell(a["targets"].get(n)) for n in names])
    cliffs = table("target", "kernel", "config", "resource", "now", "save", "occupancy",
                   title="Just past a cliff: the saving that gains a block (workgroup)",
                   left=("target", "kernel", "config", "resource"))
    for c in report.cliffs:
        if c["near"]:
            cliffs.add_row(c["target"], _label(report, c["kernel"]), c["config"],
                           c["resource"], str(c["value"]), str(c["save_to_gain"]),
                           f"{pct(c['occupancy'])} -> {pct(c['occupancy_after'])}")
    show(console, measured, abl, cliffs)
    t = report.timings
    tail = f"{t.get('kernels', 0)} kernels in {t.get('compile_s', 0):.1f} s"
    if out_dir is not None:
        tail += f"; report written to {out_dir}"
    console.print(tail)


def plot_registers(report, path) -> str:
    from ..plotting import pyplot

    plt = pyplot()
    names = [t.name for t in report.spec.targets]
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        for j, kernel in enumerate(report.spec.family.kernels):
            mine = [r for r in report.main_rows() if r.target == name and r.kernel == kernel
                    and r.record is not None]
            xs = [2 * i + j * 0.8 for i in range(len(mine))]
            ax.bar(xs, [r.record.registers for r in mine], width=0.75,
                   color=f"C{j}", label=_label(report, kernel),
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

    short = {k: v[1] for k, v in report.spec.family.kernels.items()}
    rows = [SimpleNamespace(record=r.record, occ=r.occ, target=r.target, spills=r.spills,
                            config=SimpleNamespace(label=f"{short[r.kernel]}:{r.config.label}"))
            for r in report.main_rows()]
    shim = SimpleNamespace(spec=report.spec, main_rows=lambda: rows)
    return plot_staircase(shim, path)


def write_bwd_html(report, path, plots: dict, default_kernels=None) -> str:
    from . import html

    s = report.spec
    ordered = sorted(report.main_rows(), key=lambda r: (r.kernel, r.target))
    fam = s.family
    measured = html._table(_MEASURED_HEAD, [_measured(report, r) for r in ordered],
                           left=("config", "target", "kernel", "limiter"),
                           classes=["fail" if r.record is None else "spill" if r.spills
                                    else "" for r in ordered])
    names = [t.name for t in s.targets]
    abl = html._table(("kernel", "step", *names),
                      [[_label(report, a["kernel"]), a["name"],
                        *[html.ablation_cell(a["targets"].get(n)) for n in names]]
                       for a in report.ablations], left=("kernel", "step", *names))
    near = [c for c in report.cliffs if c["near"]]
    cliffs = html._table(("target", "kernel", "config", "resource", "now", "save",
                          "occupancy"),
                         [[c["target"], _label(report, c["kernel"]), c["config"],
                           c["resource"], c["value"], c["save_to_gain"],
                           f"{pct(c['occupancy'])} -> {pct(c['occupancy_after'])}"]
                          for c in near], left=("target", "kernel", "config", "resource"))
    bases = ", ".join(f"{escape(t)} <code>{escape(k)}</code>"
                      for t, k in report.as_dict()["spec"]["base"].items())
    meta = (f"{escape(', '.join(names))}; head dim {s.head_dim}, {escape(s.dtype)}, "
            f"{'causal' if s.causal else 'non-causal'}; bases (each target's default "
            f"{escape(fam.noun)} config): {bases}; {report.timings.get('kernels', 0)} "
            f"kernels. Measured only: no analytic register budget for the {escape(fam.noun)} "
            "kernels.")
    body = (html.default_kernel_sentence(names, default_kernels or {})
            + html.failed_note(report.main_rows())
            + f"<h2>Registers, spills, shared memory, occupancy</h2>{measured}"
            f"{html._img(plots['registers'])}<h2>Ablations</h2>"
            f"<p>One knob of each target's base at a time; {escape(fam.note)}.</p>"
            f"{abl}<h2>Occupancy cliffs</h2>{cliffs}{html._img(plots['staircase'])}")
    kernels = ", ".join(v[0] for v in fam.kernels.values())
    title = f"flashscope report: {fam.noun} kernels ({kernels})"
    Path(path).write_text(html.page(title, meta, body), encoding="utf-8")
    return str(path)


def write_bwd_report(report, out_dir, doc=None) -> dict:
    """report.json (``doc``, default ``report.as_dict()``), the registers plot
    (:func:`registers_file`), staircase.png and report.html into ``out_dir``."""
    from . import write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": write_json(out / "report.json", report.as_dict() if doc is None
                                else doc)}
    plots = {"registers": plot_registers(report, out / registers_file(report.spec.family)),
             "staircase": plot_staircase_bwd(report, out / "staircase.png")}
    files.update(plots)
    files["html"] = write_bwd_html(report, out / "report.html", plots)
    return files
