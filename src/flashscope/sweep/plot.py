"""Pareto plots of a sweep (matplotlib, Agg): every measured point, the front drawn as a
step line and labelled with config keys (placed so that no two overlap). One panel per
front and problem."""

from __future__ import annotations

from pathlib import Path

from .pareto import FRONTS, pareto_front

#: (x, y) of each front's panel.
_PANEL_AXES = {"offline": ("registers", "occupancy"), "gpu_registers": ("registers", "ms"),
               "gpu_occupancy": ("occupancy", "ms")}
_LABELS = {"ms": "median latency (ms)", "registers": "registers per thread",
           "occupancy": "theoretical occupancy"}


def _problem(r: dict) -> str:
    s = f"{r['target']} {r['dtype']} D={r['head_dim']} {'causal' if r['causal'] else 'full'}"
    return s + (f" [{r['shape']}]" if r.get("shape") else "")


def plot_pareto(records, path, kind: str = "offline") -> "Path | None":
    """Write the PNG; None when no record has the measurements (nothing to draw)."""
    from ..plotting import place_labels, pyplot

    plt = pyplot()
    fronts = ["offline"] if kind == "offline" else ["gpu_registers", "gpu_occupancy"]
    recs = [r for r in records if r.get("kind") == kind and r.get("status") == "ok"]
    problems = sorted({_problem(r) for r in recs})
    if not problems:
        return None
    fig, axes = plt.subplots(len(problems), len(fronts), squeeze=False,
                             figsize=(6 * len(fronts), 3.6 * len(problems)))
    pending = []
    for i, prob in enumerate(problems):
        rows = [r for r in recs if _problem(r) == prob]
        for j, name in enumerate(fronts):
            ax = axes[i][j]
            xk, yk = _PANEL_AXES[name]
            pts = [(r[xk], r[yk]) for r in rows if r.get(xk) is not None
                   and r.get(yk) is not None]
            if pts:
                ax.scatter(*zip(*pts), s=14, color="0.6", label="configs")
            front = pareto_front(rows, FRONTS[name])
            if front:
                fx = [r[xk] for r in front]
                fy = [r[yk] for r in front]
                order = sorted(range(len(fx)), key=lambda k: (fx[k], fy[k]))
                ax.step([fx[k] for k in order], [fy[k] for k in order], where="post",
                        color="C3", lw=1.2)
                ax.scatter(fx, fy, s=26, color="C3", label="Pareto front", zorder=3)
                labels = {}
                for r in front:  # configs on the same spot share one label
                    labels.setdefault((r[xk], r[yk]), []).append(r["config_key"])
                pending.append((ax, list(labels), [", ".join(sorted(k))
                                                   for k in labels.values()]))
            ax.set_xlabel(_LABELS[xk])
            ax.set_ylabel(_LABELS[yk])
            ax.set_title(prob, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    for ax, anchors, texts in pending:  # after the layout: no two labels overlap
        place_labels(ax, anchors, texts)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
