"""Which key tiles a block of query rows visits, and which query tiles see a block of keys:
the device half of :mod:`flashscope.masks` (the host computes the same ranges; a test
checks that both agree on every tile).

A mask reaches a kernel as runtime scalars (``OFFSET`` = position of query 0 in the key
sequence, window bounds ``LEFT``/``RIGHT`` in keys) and constexpr switches: CAUSAL (the
right bound is 0), HAS_RIGHT (a right window bound, RIGHT), HAS_LEFT (a left bound,
LEFT), SHIFTED (OFFSET != 0, bottom-right alignment). Switched-off parts compile away, so
a plain causal or unmasked kernel carries none of the window's arithmetic.

Both functions return offsets (lo, full_lo, full_hi, hi): visit [lo, hi) in steps of the
tile, with a mask on [lo, full_lo) and [full_hi, hi) and without one on [full_lo, full_hi).
lo, full_lo and full_hi are tile multiples; hi is the exclusive bound. This module
imports Triton only; Gluon kernels call these functions as they are.
"""

import triton
import triton.language as tl


@triton.jit
def _floor_tile(x, TILE: tl.constexpr):
    """floor(x / TILE) * TILE for x >= 0."""
    return (x // TILE) * TILE


@triton.jit
def _right_bound(RIGHT, CAUSAL: tl.constexpr):
    """Keys past p + bound are masked (p a row's position): 0 when causal."""
    if CAUSAL:
        return 0
    return RIGHT


@triton.jit
def visible(rows, cols, OFFSET, LEFT, RIGHT, CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
            HAS_RIGHT: tl.constexpr, SHIFTED: tl.constexpr):
    """Whether query ``rows`` see key ``cols`` (broadcast against each other, e.g. rows
    [:, None] and cols [None, :]) under the mask's bounds; keys past N_K are the caller's
    to mask. The band's edge tiles apply this; whole tiles skip it."""
    pos = rows
    if SHIFTED:
        pos = rows + OFFSET
    if CAUSAL:
        keep = pos >= cols
    elif HAS_RIGHT:
        keep = pos + RIGHT >= cols
    if HAS_LEFT:
        if CAUSAL or HAS_RIGHT:
            keep = keep & (cols >= pos - LEFT)
        else:
            keep = cols >= pos - LEFT
    return keep


@triton.jit
def visible_from(rows, cols, OFFSET, LEFT, RIGHT, CAUSAL: tl.constexpr,
                 HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SHIFTED: tl.constexpr):
    """:func:`visible` with the bounds moved to the keys' side (the answer depends on
    rows - cols alone, so it is the same). Where ``rows`` holds a constant in each register
    (a thread's share of the query index moved into ``cols``, which then holds a few
    distinct values a thread), each element costs one compare against a constant."""
    if SHIFTED:
        cols = cols - OFFSET
    if CAUSAL:
        keep = rows >= cols
    elif HAS_RIGHT:
        keep = rows >= cols - RIGHT
    if HAS_LEFT:
        if CAUSAL or HAS_RIGHT:
            keep = keep & (rows <= cols + LEFT)
        else:
            keep = rows <= cols + LEFT
    return keep


@triton.jit
def key_range(start_m, N_K, OFFSET, LEFT, RIGHT,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SHIFTED: tl.constexpr):
    """(lo, full_lo, full_hi, hi) of the keys query rows [start_m, start_m + BLOCK_M) visit
    (rows past N_Q included: their output is not stored). CAUSAL implies a right bound."""
    first = start_m
    if SHIFTED:
        first = start_m + OFFSET
    n_full = _floor_tile(N_K, BLOCK_N)
    if CAUSAL or HAS_RIGHT:
        r = _right_bound(RIGHT, CAUSAL)
        if SHIFTED or HAS_RIGHT:  # the bound may fall before key 0
            hi = tl.maximum(tl.minimum(N_K, first + BLOCK_M + r), 0)
            full_hi = tl.minimum(_floor_tile(tl.maximum(first + r + 1, 0), BLOCK_N), n_full)
        else:  # top-left causal: rows see key 0 onwards, start_m is a tile multiple
            hi = tl.minimum(N_K, first + BLOCK_M)
            full_hi = tl.minimum(_floor_tile(first, BLOCK_N), n_full)
    else:
        hi = N_K
        full_hi = n_full
    if HAS_LEFT:
        lo = tl.minimum(_floor_tile(tl.maximum(first - LEFT, 0), BLOCK_N), hi)
        full_lo = tl.cdiv(tl.maximum(first + BLOCK_M - 1 - LEFT, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    else:
        lo = 0
        full_lo = 0
        if SHIFTED or HAS_RIGHT:
            full_hi = tl.minimum(full_hi, hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def query_range(start_n, N_Q, OFFSET, LEFT, RIGHT,
                BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SHIFTED: tl.constexpr):
    """(lo, full_lo, full_hi, hi) of the query rows that see keys [start_n, start_n +
    BLOCK_N): rows of [full_lo, full_hi) see every one of them (keys past N_K included:
    their gradients are not stored) and are all below N_Q; [lo, full_lo) holds no row
    at or past N_Q either."""
    shift = 0
    if SHIFTED:
        shift = OFFSET
    m_full = _floor_tile(N_Q, BLOCK_M)
    if CAUSAL or HAS_RIGHT:
        r = _right_bound(RIGHT, CAUSAL)
        if SHIFTED or HAS_RIGHT:  # row i sees key j when i >= j - OFFSET - r
            lo = tl.minimum(_floor_tile(tl.maximum(start_n - shift - r, 0), BLOCK_M), N_Q)
            full_lo = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - shift - r, 0), BLOCK_M)
        else:  # top-left causal; start_n is a tile multiple, so + BLOCK_N - 1 or + BLOCK_N
            lo = _floor_tile(start_n, BLOCK_M)  # give the same quotient
            full_lo = tl.cdiv(start_n + BLOCK_N, BLOCK_M)
        full_lo = tl.maximum(tl.minimum(full_lo * BLOCK_M, m_full), lo)
    else:
        lo = 0
        full_lo = 0
    if HAS_LEFT:  # row i sees key j when i <= j - OFFSET + LEFT
        hi = tl.maximum(tl.minimum(N_Q, start_n + BLOCK_N - shift + LEFT), 0)
        full_hi = tl.minimum(_floor_tile(tl.maximum(start_n - shift + LEFT + 1, 0), BLOCK_M),
                             m_full)
        lo = tl.minimum(lo, hi)
        full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    else:
        hi = N_Q
        full_hi = m_full
        if CAUSAL or HAS_RIGHT:
            full_hi = tl.maximum(full_hi, full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def segment(SEG: tl.constexpr, lo, full_lo, full_hi, hi):
    """Bounds of segment SEG of a range (lo, full_lo, full_hi, hi) from the functions
    above, as a kernel visits it: 0 the masked lower edge [lo, full_lo), 1 the whole tiles
    [full_lo, full_hi), 2 the masked upper edge and ragged tail [full_hi, hi)."""
    if SEG == 0:
        seg_lo, seg_hi = lo, full_lo
    elif SEG == 1:
        seg_lo, seg_hi = full_lo, full_hi
    else:
        seg_lo, seg_hi = full_hi, hi
    return seg_lo, seg_hi
