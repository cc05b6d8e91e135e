"""PNG plots of the report (matplotlib, Agg backend, no display needed).

- ``budget.png``: per target, the analytic budget of each config as stacked bars (one colour
  per component) with the measured register count marked; a red marker when the kernel
  spills (the measured count is then what the allocator was allowed, not the demand).
- ``staircase.png``: per target, occupancy against registers (VGPRs) per thread for each
  block size in the report (shared memory/LDS left out, so the curve is the register limit
  alone); each config is plotted at its measured registers and its actual occupancy, so a
  point below its curve is held down by shared memory/LDS or another limit.
"""

from __future__ import annotations

from ..budget import COMPONENT_LABELS, COMPONENTS

_COLOURS = ("#4c72b0", "#dd8452", "#f0b27a", "#55a868", "#8172b3", "#937860", "#b0b0b0")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_budget(report, path) -> str:
    plt = _plt()
    names = [t.name for t in report.spec.targets]
    rows = report.main_rows()
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        mine = [r for r in rows if r.target == name and r.budget is not None]
        labels = [f"{r.config.label}\nD{r.head_dim}" for r in mine]
        x = range(len(mine))
        bottom = [0.0] * len(mine)
        for comp, colour in zip(COMPONENTS, _COLOURS):
            vals = [r.budget.parts[comp] for r in mine]
            ax.bar(x, vals, bottom=bottom, color=colour, label=COMPONENT_LABELS[comp],
                   width=0.7)
            bottom = [b + v for b, v in zip(bottom, vals)]
        meas = [(i, r.record.registers, r.spills > 0) for i, r in enumerate(mine)
                if r.record is not None and r.record.registers]
        ok = [(i, m) for i, m, s in meas if not s]
        bad = [(i, m) for i, m, s in meas if s]
        if ok:
            ax.scatter(*zip(*ok), marker="_", s=900, color="black", linewidths=3,
                       label="measured", zorder=3)
        if bad:
            ax.scatter(*zip(*bad), marker="_", s=900, color="red", linewidths=3,
                       label="measured (spills)", zorder=3)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("registers / thread")
        ax.set_title(f"{name}: analytic budget vs measured", fontsize=10, loc="left")
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=3, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def plot_staircase(report, path) -> str:
    from ..occupancy.plot import staircase
    from ..targets import get_target

    plt = _plt()
    names = [t.name for t in report.spec.targets]
    rows = [r for r in report.main_rows() if r.record is not None and r.occ is not None]
    ncols = min(2, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        t = get_target(name)
        mine = [r for r in rows if r.target == name]
        for threads in sorted({r.record.threads for r in mine}):
            steps = staircase(t, threads=threads,
                              wave_size=None if t.vendor == "nvidia" else t.warp_size)
            xs, ys = zip(*steps)
            ax.step(xs, [100 * y for y in ys], where="post", linewidth=1.2,
                    label=f"{threads} threads")
        points = {}
        for r in mine:
            key = (r.record.registers, 100 * r.occ.occupancy)
            points.setdefault(key, []).append(r)
        for (x, y), rs in points.items():
            colour = "red" if any(r.spills for r in rs) else "black"
            ax.scatter([x], [y], color=colour, s=18, zorder=3)
            ax.annotate("\n".join(r.config.label for r in rs), (x, y), fontsize=6,
                        xytext=(-4, 4), textcoords="offset points", ha="right",
                        va="bottom")
        ax.set_xlabel("registers / thread" if t.vendor == "nvidia" else "VGPRs / lane")
        ax.set_ylabel("occupancy %")
        ax.set_title(name, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        if mine:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def write_plots(report, out_dir) -> dict:
    from pathlib import Path

    out = Path(out_dir)
    return {"budget": plot_budget(report, out / "budget.png"),
            "staircase": plot_staircase(report, out / "staircase.png")}
