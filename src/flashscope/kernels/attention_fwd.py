"""FlashAttention forward, the portable Triton body (any NVIDIA or AMD target, and Triton's
CPU interpreter); variants are ``tl.constexpr`` switches.

For one (batch, head) and a tile of BLOCK_M query rows, stream over the keys in tiles of
BLOCK_N and keep, per row i, the running maximum m_i and running sum l_i of the online
softmax (Milakov & Gimelshein 2018; Dao et al., FlashAttention, 2022 and FlashAttention-2,
2023), in base 2:

    s_ij   = (q_i . k_j) * scale * log2(e)              scores in the exp2 domain
    m_new  = max(m_i, max_j s_ij)
    alpha  = 2^(m_i - m_new)                             rescales what came before
    p_ij   = 2^(s_ij - m_new)
    l_i   <- l_i * alpha + sum_j p_ij
    acc_i <- acc_i * alpha + sum_j p_ij v_j              fp32 accumulator
    out_i  = acc_i / l_i                                 one division, at the end
    lse_i  = ln(2) * (m_i + log2(l_i))                   natural-log row log-sum-exp

Shapes: Q (B, H, Nq, D), K and V (B, Hkv, Nk, D) with H % Hkv == 0 (GQA: query head h
reads kv head h // (H / Hkv)), Out (B, H, Nq, D), Lse (B, H, Nq) fp32. Any strides.
D is padded to HEAD_DIM_PAD (a power of two, >= 16) by masked loads, never by the caller.
With VARLEN the batch is packed (FlashAttention's varlen layout, :mod:`.common`): sequence
b's query rows are rows CuSeqQ[b] .. CuSeqQ[b + 1] of the packed axis (the N axis of the
tensors, batch stride unused), its keys those of CuSeqK; every program reads its
sequence's bounds on the device and leaves at once when its row block starts past the
sequence's end, so the grid is sized by the longest sequence and nothing is padded. The
mask applies per sequence (bottom-right alignment offsets by each sequence's own Nk - Nq).

The mask (causal, a sliding window, top-left or bottom-right alignment; see
:mod:`flashscope.masks`) decides which key tiles a row block visits
(:func:`flashscope.kernels.keyrange.key_range`): tiles no row sees are never loaded, tiles
every row sees run the unmasked loop, and only the band's edges (and a partial last tile)
pay for masks. With GUARD (some row may see no key at all) the softmax keeps such rows at
zero instead of 0/0, and their log-sum-exp is -inf.

This module imports Triton only, so it compiles for any target without torch or a GPU.
"""

import triton
import triton.language as tl

from flashscope.kernels.common import (LN2, in_units, load_tile, row_start, seq_base, sequences,
                                       softcapped)
from flashscope.kernels.keyrange import key_range, segment, visible


@triton.jit
def _attn_fwd_tiles(
    acc, l_i, m_i, q, q_ptrs, q_mask, k_base, v_base,
    stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, N_K, qk_scale, OFFSET, LEFT, RIGHT, cap_in, cap_out, lo, hi,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    Q_IN_REGS: tl.constexpr, MASK_N: tl.constexpr, MASK_BAND: tl.constexpr,
    SCALE_POS: tl.constexpr, CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, SHIFTED: tl.constexpr, GUARD: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Fold key tiles [lo, hi) into (acc, l_i, m_i). MASK_N masks keys >= N_K, MASK_BAND
    the keys the mask hides from a row; both are compile-time switches."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if not Q_IN_REGS:
            # Q is re-read each iteration (L1/L2 -> shared memory) instead of staying live
            # in registers across the loop.
            q = tl.load(q_ptrs, mask=q_mask, other=0.0)
        kt = load_tile(k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                       cols[None, :] < N_K, d_ok[:, None], MASK_N, PAD_D)
        qk = tl.dot(q, kt)
        if MASK_BAND or MASK_N or not SCALE_POS or SOFTCAP:
            if SOFTCAP:
                s, _ = softcapped(qk, cap_in, cap_out)
            else:
                s = qk * qk_scale
            if MASK_BAND:
                keep = visible(offs_m[:, None], cols[None, :], OFFSET, LEFT, RIGHT, CAUSAL,
                               HAS_LEFT, HAS_RIGHT, SHIFTED)
                s = tl.where(keep, s, float("-inf"))
            if MASK_N:
                s = tl.where(cols[None, :] < N_K, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
            if GUARD:  # a row that has seen no key yet subtracts 0, not -inf (NaN)
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_use[:, None])
        else:
            # max(qk) * scale == max(qk * scale) for scale > 0, and the scale folds into one
            # FMA per score: p = 2^(qk * qk_scale - m_new).
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_use = m_new
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = load_tile(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                      cols[:, None] < N_K, d_ok[None, :], MASK_N, PAD_D)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(
    Q, K, V, Out, Lse,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, GROUP, N_Q, N_K, qk_scale, OFFSET, LEFT, RIGHT, cap_in, cap_out, CuSeqQ, CuSeqK,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, Q_IN_REGS: tl.constexpr,
    RETURN_LSE: tl.constexpr, EVEN_N: tl.constexpr, SCALE_POS: tl.constexpr,
    HEAVY_FIRST: tl.constexpr, CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, SHIFTED: tl.constexpr, GUARD: tl.constexpr,
    SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, ROW_UNIT: tl.constexpr = 1,
):
    """Grid: (cdiv(N_Q, BLOCK_M), B * H), with VARLEN (cdiv(longest sequence, BLOCK_M),
    B * H), N_Q and N_K then the packed totals (N_Q the row stride of Lse, (H, total))
    and CuSeqQ/CuSeqK the int32 prefix sums (unread without VARLEN). qk_scale = scale *
    log2(e); OFFSET, LEFT, RIGHT and the mask switches as
    :meth:`flashscope.masks.Mask.scalars` and ``switches`` give them. SOFTCAP: scores
    become c tanh(s / c) before the softmax, cap_in = scale / c and cap_out = c log2(e)
    (:func:`~flashscope.kernels.common.softcapped`). HEAVY_FIRST (causal) hands the first
    programs of each head the last row blocks, which have the most key tiles: the GPU
    starts blocks in program order, so the grid ends on short blocks instead of leaving
    SMs idle behind long ones (longest-processing-time first). ROW_UNIT: the strides'
    unit (:func:`~flashscope.kernels.common.in_units`)."""
    stride_qb, stride_qh, stride_qm = in_units(stride_qb, stride_qh, stride_qm, ROW_UNIT)
    stride_kb, stride_kh, stride_kn = in_units(stride_kb, stride_kh, stride_kn, ROW_UNIT)
    stride_vb, stride_vh, stride_vn = in_units(stride_vb, stride_vh, stride_vn, ROW_UNIT)
    stride_ob, stride_oh, stride_om = in_units(stride_ob, stride_oh, stride_om, ROW_UNIT)
    pid_m = tl.program_id(0)
    if HEAVY_FIRST:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    off_hkv = off_h // GROUP
    start_m = pid_m * BLOCK_M
    q_start, n_q, k_start, n_k, OFFSET = sequences(CuSeqQ, CuSeqK, off_b, N_Q, N_K, OFFSET,
                                                   VARLEN, SHIFTED)
    if VARLEN:
        if start_m >= n_q:  # past this sequence's rows
            return

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q_mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)
    q_ptrs = (seq_base(Q, off_b, off_h, q_start, stride_qb, stride_qh, stride_qm, VARLEN)
              + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd)
    k_base = seq_base(K, off_b, off_hkv, k_start, stride_kb, stride_kh, stride_kn, VARLEN)
    v_base = seq_base(V, off_b, off_hkv, k_start, stride_vb, stride_vh, stride_vn, VARLEN)
    q = tl.load(q_ptrs, mask=q_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    lo, full_lo, full_hi, hi = key_range(start_m, n_k, OFFSET, LEFT, RIGHT, BLOCK_M,
                                         BLOCK_N, CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
    BAND: tl.constexpr = CAUSAL or HAS_LEFT or HAS_RIGHT
    # the band's left edge (a left bound), the tiles every row of the block sees whole (no
    # mask), then the band's right edge (the diagonal) and a partial last tile
    for seg in tl.static_range(3):
        seg_lo, seg_hi = segment(seg, lo, full_lo, full_hi, hi)
        if (seg == 0 and HAS_LEFT) or seg == 1 or (seg == 2 and (BAND or not EVEN_N)):
            acc, l_i, m_i = _attn_fwd_tiles(
                acc, l_i, m_i, q, q_ptrs, q_mask, k_base, v_base,
                stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d, n_k, qk_scale,
                OFFSET, LEFT, RIGHT, cap_in, cap_out, seg_lo, seg_hi, BLOCK_N, HEAD_DIM,
                HEAD_DIM_PAD, Q_IN_REGS, seg != 1 and not EVEN_N,
                seg == 0 or (seg == 2 and BAND), SCALE_POS, CAUSAL, HAS_LEFT, HAS_RIGHT,
                SHIFTED, GUARD, SOFTCAP)

    if GUARD or VARLEN:  # rows that saw no key (acc 0, m -inf; with VARLEN also those
        l_i = tl.where(l_i == 0.0, 1.0, l_i)  # of a sequence without keys): 0, lse -inf
    out = acc / l_i[:, None]
    o_ptrs = (seq_base(Out, off_b, off_h, q_start, stride_ob, stride_oh, stride_om, VARLEN)
              + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=q_mask)
    if RETURN_LSE:
        lse = (m_i + tl.math.log2(l_i)) * LN2
        tl.store(Lse + row_start(pid_bh, off_h, q_start, N_Q, VARLEN) + offs_m, lse,
                 mask=offs_m < n_q)
