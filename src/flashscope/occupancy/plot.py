"""The occupancy staircase: occupancy against registers (VGPRs) per thread for one target
and block size, the kernel's point and its nearest cliff marked, and, when shared memory
(LDS) is what limits the kernel, the cap it sets drawn across. PNG via matplotlib (Agg)."""

from __future__ import annotations

from ..targets import get_target
from . import occupancy


def staircase(target, *, threads, smem=0, lds=0, sgprs=None, wave_size=None) -> list:
    """[(registers, occupancy)] for every register count the target allows."""
    t = get_target(target)
    out = []
    for r in range(1, t.max_regs_per_thread + 1):
        if t.vendor == "nvidia":
            o = occupancy(t, threads=threads, regs=r, smem=smem)
        else:
            o = occupancy(t, threads=threads, vgprs=r, lds=lds, sgprs=sgprs,
                          wave_size=wave_size)
        out.append((r, o.occupancy))
    return out


def plot_staircase(path, occ, *, threads, regs, smem=0, lds=0, sgprs=None,
                   wave_size=None) -> str:
    """Write the staircase PNG for the kernel ``occ`` (an Occupancy) to ``path``."""
    from ..plotting import pyplot

    plt = pyplot()
    steps = staircase(occ.target, threads=threads, smem=smem, lds=lds, sgprs=sgprs,
                      wave_size=wave_size)
    xs, ys = zip(*steps)
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    ax.step(xs, [100 * y for y in ys], where="post", color="tab:blue")
    if any(k in ("shared_mem", "lds") for k in occ.limiter):
        # with the fewest registers, what is left is the other limits: shared memory's cap
        cap = 100 * steps[0][1]
        what = "shared memory" if get_target(occ.target).vendor == "nvidia" else "LDS"
        ax.axhline(cap, color="#a40000", ls="--", lw=1,
                   label=f"{what} cap: {cap:.1f}% ({smem or lds:,} B per block)")
    ax.plot([regs], [100 * occ.occupancy], "o", color="tab:red", label=f"kernel: {regs}")
    c = occ.cliffs.get("registers", {})
    if c.get("save_to_gain"):
        r = regs - c["save_to_gain"]
        ax.axvline(r, color="tab:green", ls="--", lw=1,
                   label=f"gain a block at {r} (-{c['save_to_gain']})")
    if c.get("room_before_loss") is not None and regs + c["room_before_loss"] < xs[-1]:
        r = regs + c["room_before_loss"] + 1
        ax.axvline(r, color="tab:orange", ls=":", lw=1, label=f"lose a block at {r}")
    unit = "registers" if get_target(occ.target).vendor == "nvidia" else "VGPRs"
    ax.set_xlabel(f"{unit} per thread")
    ax.set_ylabel("occupancy (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"{occ.target}, {threads} threads per block")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
