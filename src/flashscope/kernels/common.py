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
