"""The merge of a cut row block's pieces (the forward's SPLIT work lists).

A piece covers key tiles [lo, hi) of a row block and leaves, per row, its unnormalized
output and softmax state in base 2 (scores scaled by ``scale * log2(e)``):

    m_p = max_j s_j,   l_p = sum_j 2^(s_j - m_p),   O_p = sum_j 2^(s_j - m_p) v_j

over its keys j. The block's rows are then

    M = max_p m_p,   L = sum_p 2^(m_p - M) l_p,   out = sum_p 2^(m_p - M) O_p / L,
    lse = (M + log2 L) ln 2,

which is the online softmax's own update, taken once per piece instead of once per key
tile. In the forward's work lists every piece holds at least one unmasked key of every
row (:func:`flashscope.schedule.split_points`), so m_p is finite and L >= 1; a decoding
split may hold no key of a row (m_p = -inf, l_p = 0, O_p = 0: weight 0), and a row that
no piece has a key for comes out 0 with lse -inf (:func:`merge_slots`).

Workspace slot s (float32): BLOCK_M x D values of O_p, then BLOCK_M (m_p, l_p) pairs; a
block's pieces sit in consecutive slots. This module imports Triton only.
"""

import triton
import triton.language as tl

from flashscope.kernels.common import LN2, wait_previous


@triton.jit
def merge_slots(Part, first, pieces, rows, cols, keep, BLOCK_M: tl.constexpr,
                HEAD_DIM: tl.constexpr):
    """Combine the pieces in slots ``first .. first + pieces - 1`` for slot rows ``rows``
    (those with ``keep`` set; the others read as empty) and columns ``cols``: returns
    (out, M + log2 L), the normalized rows and their base-2 log-sum-exp. A row empty in
    every piece returns 0 and -inf."""
    rec: tl.constexpr = BLOCK_M * (HEAD_DIM + 2)
    big = tl.full(rows.shape, float("-inf"), tl.float32)
    for p in range(0, pieces):
        ml = Part + (first + p).to(tl.int64) * rec + BLOCK_M * HEAD_DIM + 2 * rows
        big = tl.maximum(big, tl.load(ml, mask=keep, other=float("-inf")))
    big_use = tl.where(big == float("-inf"), 0.0, big)
    total = tl.zeros(rows.shape, tl.float32)
    acc = tl.zeros([rows.shape[0], cols.shape[0]], tl.float32)
    for p in range(0, pieces):
        slot = Part + (first + p).to(tl.int64) * rec
        ml = slot + BLOCK_M * HEAD_DIM + 2 * rows
        w = tl.math.exp2(tl.load(ml, mask=keep, other=float("-inf")) - big_use)
        total += w * tl.load(ml + 1, mask=keep, other=0.0)
        o = tl.load(slot + rows[:, None] * HEAD_DIM + cols[None, :], mask=keep[:, None],
                    other=0.0)
        acc += w[:, None] * o
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    return out, big + tl.math.log2(total)


@triton.jit
def merge_chunks(Part, first, pieces, rows, cols, keep, BLOCK_M: tl.constexpr,
                 HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr):
    """:func:`merge_slots` for many pieces (a decoding split's): CHUNK pieces at a time,
    their (m_p, l_p) and O_p loaded together and folded into a running maximum, one
    round of loads a chunk where :func:`merge_slots` takes two a piece (the first pass
    for M, then O_p after its m_p); ``cols`` may be any subset of the slot's columns."""
    rec: tl.constexpr = BLOCK_M * (HEAD_DIM + 2)
    offs = tl.arange(0, CHUNK)
    big = tl.full(rows.shape, float("-inf"), tl.float32)
    total = tl.zeros(rows.shape, tl.float32)
    acc = tl.zeros([rows.shape[0], cols.shape[0]], tl.float32)
    for c in range(0, pieces, CHUNK):
        have = (c + offs) < pieces
        slot = Part + (first + c + offs).to(tl.int64) * rec  # [CHUNK]
        ml = slot[:, None] + BLOCK_M * HEAD_DIM + 2 * rows[None, :]
        both = have[:, None] & keep[None, :]
        m = tl.load(ml, mask=both, other=float("-inf"))
        lp = tl.load(ml + 1, mask=both, other=0.0)
        o = tl.load(slot[:, None, None] + rows[None, :, None] * HEAD_DIM + cols[None, None, :],
                    mask=both[:, :, None], other=0.0)
        new = tl.maximum(big, tl.max(m, 0))
        use = tl.where(new == float("-inf"), 0.0, new)
        w = tl.math.exp2(m - use[None, :])
        alpha = tl.math.exp2(big - use)
        total = total * alpha + tl.sum(w * lp, 0)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o, 0)
        big = new
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    return out, big + tl.math.log2(total)


@triton.jit
def _merge_parts(Part, Merge, Out, Lse, H, N_Q, n_m, D,
                 stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh,
                 stride_og, stride_lg,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
                 RETURN_LSE: tl.constexpr, COLS: tl.constexpr = 0, CHUNK: tl.constexpr = 0,
                 GROUP: tl.constexpr = 0, EARLY: tl.constexpr = False):
    """Grid (cut blocks, BLOCK_M / ROWS[, HEAD_DIM / COLS]). Merge (int32 [M, 3]): per
    cut block (work tile t = pid_bh * n_m + pid_m, first slot, pieces). Out (B, H, N_Q,
    D), any strides; Lse (B, H, N_Q) fp32, rows one apart; the workspace holds HEAD_DIM
    >= D columns (the padded width). Rows at or past N_Q and columns at or past D are not
    written. CHUNK > 0 (a decoding call's blocks, cut into up to SMs / blocks pieces):
    COLS columns a program and the pieces CHUNK at a time (:func:`merge_chunks`), so the
    grid holds enough programs and each waits on one round of loads a chunk. GROUP = G
    > 0 (a decoding call's rows in the caller's layout): row r is token r / G of group
    member r % G, at r / G times stride_om plus r % G times stride_og in Out and r / G
    plus r % G times stride_lg in Lse (unread otherwise). EARLY: launched while the cut
    grid runs (a KV cache's), it waits for that grid first."""
    i = tl.program_id(0)
    wait_previous(i, EARLY)
    c = tl.program_id(1)
    t = tl.load(Merge + 3 * i)
    first = tl.load(Merge + 3 * i + 1)
    pieces = tl.load(Merge + 3 * i + 2)
    pid_bh = t // n_m
    pid_m = t % n_m
    rows = c * ROWS + tl.arange(0, ROWS)
    if CHUNK > 0:
        cols = tl.program_id(2) * COLS + tl.arange(0, COLS)
        out, lse2 = merge_chunks(Part, first, pieces, rows, cols, rows < BLOCK_M, BLOCK_M,
                                 HEAD_DIM, CHUNK)
    else:
        cols = tl.arange(0, HEAD_DIM)
        out, lse2 = merge_slots(Part, first, pieces, rows, cols, rows < BLOCK_M, BLOCK_M,
                                HEAD_DIM)
    q_rows = pid_m * BLOCK_M + rows
    keep = q_rows < N_Q
    b = pid_bh // H
    h = pid_bh % H
    if GROUP > 0:
        o_rows = (q_rows // GROUP).to(tl.int64) * stride_om + (q_rows % GROUP) * stride_og
        l_rows = q_rows // GROUP + (q_rows % GROUP) * stride_lg
    else:
        o_rows = q_rows.to(tl.int64) * stride_om
        l_rows = q_rows
    dst = (Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
           + o_rows[:, None] + cols[None, :] * stride_od)
    tl.store(dst, out.to(Out.dtype.element_ty), mask=keep[:, None] & (cols[None, :] < D))
    if RETURN_LSE:
        if CHUNK > 0:  # one program of a row range writes its log-sum-exp (the test on
            # a vector: Triton 3.9's interpreter gives no mask from a scalar comparison)
            keep = keep & ((rows * 0 + tl.program_id(2)) == 0)
        tl.store(Lse + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + l_rows,
                 lse2 * LN2, mask=keep)
