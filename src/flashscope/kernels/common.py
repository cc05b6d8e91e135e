"""Pieces every Triton kernel body here shares: the log constants and the masked tile load.

This module imports Triton only.
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def load_tile(ptrs, idx_ok, d_ok, MASK_IDX: tl.constexpr, PAD_D: tl.constexpr):
    """Load a tile whose one axis runs over sequence positions and the other over the head
    dim: ``idx_ok`` (broadcast to the tile) marks positions inside the sequence, ``d_ok``
    columns below the real head dim. Only the masks a tile needs are applied: a whole tile
    of an unpadded head dim loads unmasked. Masked elements read as 0."""
    if MASK_IDX:
        return tl.load(ptrs, mask=idx_ok & d_ok, other=0.0)
    elif PAD_D:
        return tl.load(ptrs, mask=d_ok, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def tanh(x):
    """tanh(x) = 1 - 2 / (e^(2x) + 1), from exp2 (every target and the interpreter have it;
    it saturates to +-1 without overflow: e^(2x) = inf gives 1, 0 gives -1)."""
    return 1.0 - 2.0 / (tl.math.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def softcapped(qk, cap_in, cap_out):
    """Scores capped as c tanh(s / c) for s = qk * scale, already in the exp2 domain:
    cap_in = scale / c, cap_out = c * log2(e). Returns (capped scores, tanh values) (the
    backward needs the second for the cap's derivative 1 - tanh^2)."""
    t = tanh(qk * cap_in)
    return t * cap_out, t
