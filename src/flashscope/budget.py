"""An analytic register budget of the FlashAttention forward kernel, per thread (lane).

The forward kernel keeps a few tiles alive across its KV loop; each is a BLOCK_M-row tile
spread over the T = num_warps x L threads of a block (L = 32 lanes per NVIDIA warp, 64 per
CDNA wavefront, 32 per RDNA wave). With BM = BLOCK_M, BN = BLOCK_N, D = HEAD_DIM_PAD and
4-byte registers, the model counts per thread:

    acc    = BM * D / T             fp32 output accumulator
    scores = BM * BN / T            fp32 score tile S = Q K^T
    p      = BM * BN / (2 T)        S rounded to fp16/bf16: the A operand of P V
    q      = BM * D / (2 T)         the Q tile (16-bit) when Q_IN_REGS, else 0
    stats  = 2 * rows               running max m_i and sum l_i, one value per row a lane
                                    holds: rows = rows_per_slab * max(1, BM / (W * slab))
    kv     = B-operand fragments of K^T then V held in registers at once (one at a time:
             the larger of the two): 0 when the matrix unit reads B from shared memory
             (sm90 wgmma); K_held * max(BN, D) * 2 / 4 / L when it is loaded K_held rows
             of the reduction dimension at a time (sm80 mma.sync via ldmatrix, K_held = 16);
             the whole tile max(BN, D) * min(BN, D) * 2 / 4 / L when each wave loads its full
             operand from LDS (AMD MFMA/WMMA). B operands are replicated per warp, so this
             term scales with 1/L, not 1/T.
    rest   = a fixed 16 for addresses, offsets, loop counters and masks.

For the sm90 kernel (``sm90-fwd``) each consumer warpgroup is its own partition over 64 of
the BLOCK_M rows, so the model counts one consumer: BM = 64, T = 128 (its setmaxnreg
budget is what it is held to, 240 with one or two consumers, 160 with three).

``rows_per_slab``/``slab``: in the matrix-unit output layout a lane holds rows_per_slab of
every slab-row strip its warp computes: NVIDIA mma/wgmma 2 of 16, CDNA MFMA 32x32 16 of 32,
RDNA WMMA 16x16 8 of 16. Warps split the rows first (BM / W per warp).

The prediction is the plain sum; it is a model of what is live at the inner loop's peak,
not a fit: no constant is tuned to the measured counts, so its error (stated per config by
:func:`compare`) is the model's honest error. Register allocators reuse S for P, keep
temporaries, or spill when the demand passes the hardware cap (255 NVIDIA, 512 CDNA
unified, 256 RDNA). A kernel that spills is flagged ``spilled``: its count is what the
allocator was allowed (often the cap), not the demand, so its error says little about the
model and summaries leave it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import ConfigError
from .families.base import head_dim_pad
from .targets import get_target

#: Fixed remainder for addresses, offsets, loop state and masks, registers per thread.
REST = 16

#: Budget components in stacking order.
COMPONENTS = ("acc", "scores", "p", "q", "stats", "kv", "rest")

COMPONENT_LABELS = {"acc": "O accumulator (fp32)", "scores": "score tile S (fp32)",
                    "p": "P (16-bit copy)", "q": "Q fragments", "stats": "row max/sum",
                    "kv": "K/V operand fragments", "rest": "addresses, loop state"}


@dataclass(frozen=True)
class Layout:
    """How one target family's matrix unit lays tiles over lanes (see module docstring)."""

    name: str
    lanes: int
    slab: int  # rows of one output strip of the matrix instruction
    rows_per_slab: int  # rows of that strip one lane holds
    kv_k_held: Optional[int]  # reduction rows of B held at once; None: whole tile; 0: none


#: Layouts as data, keyed by target family (NVIDIA: by compute capability family).
LAYOUTS = {
    "hopper": Layout("wgmma (warpgroups of 4 warps, 64-row slabs)", 32, 16, 2, 0),
    "blackwell": Layout("mma (32 lanes)", 32, 16, 2, 16),
    "ampere": Layout("mma.sync m16n8k16 (32 lanes)", 32, 16, 2, 16),
    "ada": Layout("mma.sync m16n8k16 (32 lanes)", 32, 16, 2, 16),
    "cdna2": Layout("MFMA 32x32 (wavefront 64)", 64, 32, 16, None),
    "cdna3": Layout("MFMA 32x32 (wavefront 64)", 64, 32, 16, None),
    "cdna4": Layout("MFMA 32x32 (wavefront 64)", 64, 32, 16, None),
    "rdna3": Layout("WMMA 16x16 (wave 32)", 32, 16, 8, None),
    "rdna4": Layout("WMMA 16x16 (wave 32)", 32, 16, 8, None),
}


def layout_for(target) -> Layout:
    t = get_target(target)
    try:
        return LAYOUTS[t.family]
    except KeyError:
        raise ConfigError(f"target {t.name}: no register layout model for family "
                          f"{t.family!r}; known: {', '.join(LAYOUTS)}") from None


@dataclass(frozen=True)
class Budget:
    """Predicted registers per thread by component (floats: tiles need not divide evenly)."""

    target: str
    layout: str
    threads: int
    lanes: int
    rows_per_thread: int
    parts: dict

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def dominant(self) -> str:
        return max(COMPONENTS, key=lambda k: self.parts[k])

    def as_dict(self) -> dict:
        return {"target": self.target, "layout": self.layout, "threads": self.threads,
                "lanes": self.lanes, "rows_per_thread": self.rows_per_thread,
                "parts": dict(self.parts), "total": self.total, "dominant": self.dominant}


def block_rows(cfg) -> int:
    """Query rows one block of threads keeps: BLOCK_M, or one sm90 consumer's 64."""
    return 64 if cfg.KERNEL == "sm90-fwd" else cfg.BLOCK_M


def rows_per_thread(cfg, layout: Layout) -> int:
    """Rows of the score tile one lane holds: rows_per_slab x slabs per warp (at least 1)."""
    rows_per_warp = block_rows(cfg) / cfg.num_warps
    return int(layout.rows_per_slab * max(1.0, rows_per_warp / layout.slab))


def budget(cfg, target, head_dim: int) -> Budget:
    """The register budget of the forward kernel for ``cfg`` (a ``triton-fwd`` or
    ``sm90-fwd`` record) on ``target`` (formulas in the module docstring)."""
    lay = layout_for(target)
    t = get_target(target)
    bm, bn, d = block_rows(cfg), cfg.BLOCK_N, head_dim_pad(head_dim)
    threads = cfg.num_warps * lay.lanes
    rows = rows_per_thread(cfg, lay)
    if lay.kv_k_held == 0:
        kv = 0.0
    elif lay.kv_k_held is None:
        kv = bn * d * 2 / 4 / lay.lanes
    else:
        kv = lay.kv_k_held * max(bn, d) * 2 / 4 / lay.lanes
    parts = {
        "acc": bm * d / threads,
        "scores": bm * bn / threads,
        "p": bm * bn / (2 * threads),
        "q": bm * d / (2 * threads) if cfg.Q_IN_REGS else 0.0,
        "stats": float(2 * rows),
        "kv": kv,
        "rest": float(REST),
    }
    return Budget(t.name, lay.name, threads, lay.lanes, rows, parts)


def compare(b: Budget, measured: int, *, spilled: bool = False) -> dict:
    """Prediction against a measured count: error = predicted - measured (registers) and
    relative to the measurement. ``spilled``: the kernel spills, so the measurement is a
    lower bound on the demand; ``at_cap``: it equals the target's per-thread maximum."""
    if measured is None or measured <= 0:
        raise ConfigError(f"measured registers {measured!r}: expected a positive count")
    cap = get_target(b.target).max_regs_per_thread
    err = b.total - measured
    return {"predicted": round(b.total, 2), "measured": int(measured),
            "error": round(err, 2), "rel_error": round(err / measured, 4),
            "spilled": bool(spilled), "at_cap": measured >= cap, "dominant": b.dominant}
