"""PNG plots of the report (matplotlib, Agg backend, no display needed).

- ``budget.png``: per target, the analytic budget of each config as stacked bars (one colour
  per component) with the measured register count marked; a red marker when the kernel
  spills (the measured count is then what the allocator was allowed, not the demand). A
  config whose build failed keeps its place, hatched and marked FAILED (NOT BUILT, "does
  not fit", where its target cannot run it: a rule or a limit).
- ``staircase.png``: per target, occupancy against registers (VGPRs) per thread for each
  block size in the report, the register limit alone (solid); each config is plotted at
  its measured registers and its actual occupancy. Where shared memory (LDS) is what holds
  a config down, the staircase with its shared memory is drawn too (dashed, in the colour
  of its block size), so the cap it sets is on the plot. Labels never overlap
  (:func:`flashscope.plotting.place_labels`).
"""

from __future__ import annotations

from ..budget import COMPONENT_LABELS, COMPONENTS
from ..plotting import place_labels, pyplot
from ..terminal import label
from .collect import unbuilt

_COLOURS = ("#4c72b0", "#dd8452", "#f0b27a", "#55a868", "#8172b3", "#937860", "#b0b0b0")

#: Limiter names that mean shared memory (NVIDIA) or LDS (AMD).
SHARED_LIMITS = ("shared_mem", "lds")

def _failed_budget(r):
    """The analytic budget of a row whose build failed, when the model can give one."""
    from .. import budget as fbudget
    from ..errors import FlashscopeError
    from ..targets import get_target

    try:
        return fbudget.budget(r.config, get_target(r.target), r.head_dim)
    except FlashscopeError:
        return None


def plot_budget(report, path) -> str:
    plt = pyplot()
    names = [t.name for t in report.spec.targets]
    rows = report.main_rows()
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.4 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        mine = [r for r in rows if r.target == name]
        budgets = [r.budget if r.budget is not None else _failed_budget(r) for r in mine]
        failed = [r.record is None for r in mine]
        labels = [f"{label(r.config)}\nD{r.head_dim}"
                  + (f"\n{unbuilt(r.refused, None)[0]}" if f else "")
                  for r, f in zip(mine, failed)]
        x = list(range(len(mine)))
        bottom = [0.0] * len(mine)
        for comp, colour in zip(COMPONENTS, _COLOURS):
            vals = [b.parts[comp] if b is not None else 0.0 for b in budgets]
            ax.bar(x, vals, bottom=bottom, color=colour, label=COMPONENT_LABELS[comp],
                   width=0.7, hatch=None)
            bottom = [b + v for b, v in zip(bottom, vals)]
        for i, f in enumerate(failed):
            if f:  # no binary: hatch the (analytic) bar and say why above it
                ax.bar([i], [max(bottom[i], 1.0)], width=0.7, fill=False, hatch="///",
                       edgecolor="#a40000", linewidth=0)
                why = "does not fit" if mine[i].refused else "build failed"
                ax.annotate(why, (i, bottom[i]), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=7,
                            color="#a40000")
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
        ax.set_xticks(x)
        crowded = len(mine) > 8
        ax.set_xticklabels(labels, fontsize=7, rotation=90 if crowded else 0)
        for tick, f in zip(ax.get_xticklabels(), failed):
            if f:
                tick.set_color("#a40000")
        ax.set_ylabel("registers / thread")
        ax.set_title(f"{name}: analytic budget vs measured", fontsize=10, loc="left")
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.12)
    axes[0, 0].legend(fontsize=7, ncol=5, loc="lower left", bbox_to_anchor=(0, 1.08),
                      frameon=False, markerscale=0.4)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def _shared_caps(t, mine) -> list:
    """(threads, shared bytes) of the configs held down by shared memory / LDS."""
    caps = set()
    for r in mine:
        if any(k in SHARED_LIMITS for k in (r.occ.limiter or ())):
            caps.add((r.record.threads, r.record.shared_bytes or 0))
    return sorted(caps)


def plot_staircase(report, path) -> str:
    from ..occupancy.plot import staircase
    from ..targets import get_target

    plt = pyplot()
    names = [t.name for t in report.spec.targets]
    rows = [r for r in report.main_rows() if r.record is not None and r.occ is not None]
    ncols = min(2, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.4 * nrows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    pending = []
    for ax, name in zip(axes.flat, names):
        t = get_target(name)
        mine = [r for r in rows if r.target == name]
        wave = None if t.vendor == "nvidia" else t.warp_size
        colour = {}
        for k, threads in enumerate(sorted({r.record.threads for r in mine})):
            colour[threads] = f"C{k}"
            xs, ys = zip(*staircase(t, threads=threads, wave_size=wave))
            ax.step(xs, [100 * y for y in ys], where="post", linewidth=1.2, color=f"C{k}",
                    label=f"{threads} threads, registers alone")
        for k, (threads, shared) in enumerate(_shared_caps(t, mine)):
            kw = {"smem": shared} if t.vendor == "nvidia" else {"lds": shared}
            xs, ys = zip(*staircase(t, threads=threads, wave_size=wave, **kw))
            # the colour of its block size, a dash pattern of its own
            ax.step(xs, [100 * y for y in ys], where="post", linewidth=1.0,
                    ls=((0, (5, 2)), (0, (2, 2)), (0, (6, 2, 1, 2)), (0, (1, 1)))[k % 4],
                    color=colour.get(threads, "#a40000"),
                    label=f"{threads} threads with {shared:,} B "
                          f"{'shared memory' if t.vendor == 'nvidia' else 'LDS'} (its cap)")
        points = {}
        for r in mine:
            key = (r.record.registers, 100 * r.occ.occupancy)
            points.setdefault(key, []).append(r)
        for (x, y), rs in points.items():
            colour = "red" if any(r.spills for r in rs) else "black"
            ax.scatter([x], [y], color=colour, s=18, zorder=3)
        pending.append((ax, list(points), ["\n".join(label(r.config) for r in rs)
                                           for rs in points.values()]))
        ax.set_xlabel("registers / thread" if t.vendor == "nvidia" else "VGPRs / lane")
        ax.set_ylabel("occupancy %")
        ax.set_ylim(0, 108)
        ax.set_title(name, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        if mine:
            ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    for ax, anchors, texts in pending:  # after the layout: labels measured where drawn
        place_labels(ax, anchors, texts)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def write_plots(report, out_dir) -> dict:
    from pathlib import Path

    out = Path(out_dir)
    return {"budget": plot_budget(report, out / "budget.png"),
            "staircase": plot_staircase(report, out / "staircase.png")}
