"""FlashAttention backward with recomputation: three Triton kernels, one body each.

The forward saved only Out and the natural-log row log-sum-exp L_i (never P). With
s_ij = (q_i . k_j) * scale and dO the incoming gradient (Dao, FlashAttention-2, 2023, Alg. 2):

    delta_i = sum_d dO_id * O_id                     preprocess, fp32, (B, H, Nq)
    p_ij    = 2^(s_ij * log2(e) - L_i * log2(e))     = softmax row i, recomputed per tile
    dV_j    = sum_i p_ij dO_i
    dp_ij   = dO_i . v_j
    ds_ij   = p_ij * (dp_ij - delta_i)    softmax Jacobian, via sum_j p_ij dp_ij = delta_i
    dK_j    = scale * sum_i ds_ij q_i
    dQ_i    = scale * sum_j ds_ij k_j

Two passes, no atomics, so results are deterministic:
- ``_attn_bwd_dkdv``: one program per (key tile of BLOCK_N1, batch, kv head) holds K_j, V_j
  and the dK, dV accumulators and streams Q, dO, L, delta in tiles of BLOCK_M1 rows, over
  every query head of its GQA group (the group sum happens in registers, in a fixed order).
- ``_attn_bwd_dq``: one program per (query tile of BLOCK_M2, batch, head) holds Q_i, dO_i,
  L_i, delta_i and the dQ accumulator and streams K, V in tiles of BLOCK_N2 keys.

Shapes and strides as in the forward: Q, dQ, O, dO (B, H, Nq, D); K, V, dK, dV
(B, Hkv, Nk, D), any strides; L and delta contiguous (B, H, Nq) fp32. D runs as
HEAD_DIM_PAD columns, or, with HEAD_TAIL, as HEAD_DIM_PAD + HEAD_TAIL columns in two
power-of-two parts (80 as 64 + 16: :func:`flashscope.families.base.head_parts`): every
product over D is the sum of the two parts' products, every D-wide result two tiles.
Columns past D load as zeros. The mask is the forward's (:mod:`flashscope.masks`): the
tiles each program visits come from :mod:`flashscope.kernels.keyrange` and tiles no row
sees are skipped. In the dQ kernel only the band's edges and partial tail tiles pay for
masks (``MASK_*`` compile-time switches of one inner-loop body); the dK/dV kernel masks
every tile of a band or a packed batch, for the reason given at its loop. A row that
sees no key has L = -inf; its scores are all masked, so it adds nothing.

With VARLEN the batch is packed as in the forward (:mod:`flashscope.kernels.common`):
each program reads its sequence's bounds from the prefix sums CuSeqQ/CuSeqK and leaves
when its tile starts past the sequence's end; L and delta are (H, total_q) there.

Rows outside the problem are loaded as zeros: a padded query row has q = dO = 0 and
L = +inf, so p = 0 and it adds nothing to dK, dV; a padded key row only feeds rows of dK,
dV (or, masked to p = 0, columns of dQ) that are never stored.

Triton only: compiles for any target without torch or a GPU.
"""

import triton
import triton.language as tl

from flashscope.kernels.common import (LOG2E, in_units, load_tile, row_start, seq_base,
                                       sequence, sequences, softcapped)
from flashscope.kernels.keyrange import key_range, query_range, segment, visible


@triton.jit
def _rows(Ptr, off_b, off_h, start, stride_b, stride_h, stride_n, stride_d, offs_n, offs_d,
          VARLEN: tl.constexpr):
    """Addresses of rows ``offs_n`` x columns ``offs_d`` of head ``off_h`` of sequence
    ``off_b`` (:func:`~flashscope.kernels.common.seq_base`)."""
    return (seq_base(Ptr, off_b, off_h, start, stride_b, stride_h, stride_n, VARLEN)
            + offs_n[:, None] * stride_n + offs_d[None, :] * stride_d)


@triton.jit
def _attn_bwd_preprocess(
    Out, DOut, Delta,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    H, N_Q, CuSeqQ, Lse, LseRows, N_ROWS, Zero, ZERO_N, ZERO_CHUNK,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    VARLEN: tl.constexpr, PAD_ROWS: tl.constexpr = 0, COPY_LSE: tl.constexpr = False,
    ZERO: tl.constexpr = False, ROW_UNIT: tl.constexpr = 1,
):
    """delta = rowsum(dO * O) in fp32. Grid: (cdiv(N_Q, BLOCK_M), B * H); with VARLEN
    N_Q is the packed total and the grid's first axis covers the longest sequence.
    Delta's heads lie N_ROWS rows apart (N_Q, or dense a multiple of 4 above it: each
    head's vector then starts 16-byte aligned, as the Hopper backward's copies need).
    COPY_LSE: the log-sum-exp (Lse, (B, H, N_Q) or packed (H, N_Q)) is copied into
    LseRows, laid out as delta.

    PAD_ROWS (VARLEN): the rows go to (H, N_ROWS) vectors in which each sequence starts
    at a multiple of PAD_ROWS (:func:`padded_start`) and is followed by rows up to one,
    delta there and the log-sum-exp too (+inf in the padding): a consumer can then read
    any PAD_ROWS-row tile of a sequence as one aligned block, its rows past the sequence
    giving P = 0 (the Hopper backward's rank-1 copies). The grid's first axis covers the
    longest sequence rounded up to PAD_ROWS. ROW_UNIT: the strides' unit
    (:func:`~flashscope.kernels.common.in_units`).

    ZERO: the launch also zeroes the fp32 buffer Zero (ZERO_N elements), each program
    ZERO_CHUNK of them (a multiple of ZERO_BLOCK) in grid order: the Hopper backward's dQ
    buffer, which its one pass adds into, cleared without a launch of its own."""
    if ZERO:
        first = (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)).to(tl.int64)
        for i in range(0, ZERO_CHUNK, ZERO_BLOCK):
            offs = first * ZERO_CHUNK + i + tl.arange(0, ZERO_BLOCK)
            tl.store(Zero + offs, tl.zeros([ZERO_BLOCK], tl.float32), mask=offs < ZERO_N)
    stride_ob, stride_oh, stride_om = in_units(stride_ob, stride_oh, stride_om, ROW_UNIT)
    stride_dob, stride_doh, stride_dom = in_units(stride_dob, stride_doh, stride_dom, ROW_UNIT)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    q_start, n_q = sequence(CuSeqQ, off_b, N_Q, VARLEN)
    end = n_q
    if PAD_ROWS > 0:
        end = tl.cdiv(n_q, PAD_ROWS) * PAD_ROWS
    if VARLEN:
        if pid_m * BLOCK_M >= end:
            return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(_rows(Out, off_b, off_h, q_start, stride_ob, stride_oh, stride_om, stride_od,
                      offs_m, offs_d, VARLEN), mask=mask, other=0.0)
    do = tl.load(_rows(DOut, off_b, off_h, q_start, stride_dob, stride_doh, stride_dom,
                       stride_dod, offs_m, offs_d, VARLEN), mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    if PAD_ROWS > 0:
        lse = tl.load(Lse + row_start(pid_bh, off_h, q_start, N_Q, VARLEN) + offs_m,
                      mask=offs_m < n_q, other=float("inf"))
        rows = off_h * N_ROWS + padded_start(q_start, off_b, PAD_ROWS) + offs_m
        tl.store(LseRows + rows, lse, mask=offs_m < end)
        tl.store(Delta + rows, delta, mask=offs_m < end)
    else:
        rows = row_start(pid_bh, off_h, q_start, N_ROWS, VARLEN) + offs_m
        if COPY_LSE:
            lse = tl.load(Lse + row_start(pid_bh, off_h, q_start, N_Q, VARLEN) + offs_m,
                          mask=offs_m < n_q)
            tl.store(LseRows + rows, lse, mask=offs_m < n_q)
        tl.store(Delta + rows, delta, mask=offs_m < n_q)


#: elements a delta program zeroes a step (ZERO): 16 bytes a thread of 4 warps, twice
ZERO_BLOCK: tl.constexpr = tl.constexpr(1024)


@triton.jit
def padded_start(q_start, b, PAD_ROWS: tl.constexpr):
    """Where sequence ``b`` (first row ``q_start`` of the packed batch) starts in the
    padded row vectors: (q_start + b PAD_ROWS) rounded down to a multiple of PAD_ROWS,
    which leaves each sequence of n rows at least cdiv(n, PAD_ROWS) PAD_ROWS rows before
    the next one starts; the vectors hold cdiv(total + B PAD_ROWS, PAD_ROWS) PAD_ROWS
    rows a head."""
    return ((q_start + b * PAD_ROWS) // PAD_ROWS) * PAD_ROWS


@triton.jit
def _attn_bwd_dkdv_tiles(
    dk, dv, dk_t, dv_t, k, v, k_t, v_t,
    q_base, do_base, lse_base, delta_base,
    stride_qm, stride_qd, stride_dom, stride_dod,
    offs_n, offs_d, offs_t, N_Q, qk_scale, OFFSET, LEFT, RIGHT, cap_in, cap_out, lo, hi,
    BLOCK_M1: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    HEAD_TAIL: tl.constexpr, MASK_M: tl.constexpr, MASK_BAND: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SHIFTED: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Fold query tiles [lo, hi) into (dk, dv) of one key tile (and the tail columns'
    (dk_t, dv_t) with HEAD_TAIL). Transposed tiles (keys on rows) so no register transpose
    of P is needed. MASK_M masks query rows >= N_Q, MASK_BAND the pairs the mask hides."""
    offs_m0 = tl.arange(0, BLOCK_M1)
    d_ok = offs_d < HEAD_DIM
    t_ok = offs_t < HEAD_DIM
    PAD_D: tl.constexpr = HEAD_DIM < HEAD_DIM_PAD
    for start_m in range(lo, hi, BLOCK_M1):
        start_m = tl.multiple_of(start_m, BLOCK_M1)
        offs_m = start_m + offs_m0
        m_ok = offs_m < N_Q
        qt = load_tile(q_base + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd,
                       m_ok[None, :], d_ok[:, None], MASK_M, PAD_D)
        if HEAD_TAIL:
            qt_t = load_tile(q_base + offs_m[None, :] * stride_qm
                             + offs_t[:, None] * stride_qd, m_ok[None, :], t_ok[:, None],
                             MASK_M, True)
        if MASK_M:
            lse = tl.load(lse_base + offs_m, mask=m_ok, other=float("inf"))
        else:
            lse = tl.load(lse_base + offs_m)
        kq = tl.dot(k, qt)
        if HEAD_TAIL:
            kq = tl.dot(k_t, qt_t, kq)
        # p^T (BLOCK_N1, BLOCK_M1) = 2^(k q^T * scale*log2e - L*log2e)
        if SOFTCAP:
            st, tt = softcapped(kq, cap_in, cap_out)
            pt = tl.math.exp2(st - (lse * LOG2E)[None, :])
        else:
            pt = tl.math.exp2(kq * qk_scale - (lse * LOG2E)[None, :])
        if MASK_BAND:
            keep = visible(offs_m[None, :], offs_n[:, None], OFFSET, LEFT, RIGHT, CAUSAL,
                           HAS_LEFT, HAS_RIGHT, SHIFTED)
            pt = tl.where(keep, pt, 0.0)
        do = load_tile(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                       m_ok[:, None], d_ok[None, :], MASK_M, PAD_D)
        if MASK_M:
            delta = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)
        else:
            delta = tl.load(delta_base + offs_m)
        dv = tl.dot(pt.to(do.dtype), do, dv)
        dpt = tl.dot(v, tl.trans(do))
        if HEAD_TAIL:
            do_t = load_tile(do_base + offs_m[:, None] * stride_dom
                             + offs_t[None, :] * stride_dod, m_ok[:, None], t_ok[None, :],
                             MASK_M, True)
            dv_t = tl.dot(pt.to(do_t.dtype), do_t, dv_t)
            dpt = tl.dot(v_t, tl.trans(do_t), dpt)
        dst = pt * (dpt - delta[None, :])
        if SOFTCAP:  # d(c tanh(s / c)) / ds = 1 - tanh^2
            dst = dst * (1.0 - tt * tt)
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk)
        if HEAD_TAIL:
            dk_t = tl.dot(dst.to(qt_t.dtype), tl.trans(qt_t), dk_t)
    return dk, dv, dk_t, dv_t


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DOut, Lse, Delta, DK, DV,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H, HKV, GROUP, SPLITS, N_Q, N_K, scale, qk_scale, OFFSET, LEFT, RIGHT, cap_in, cap_out,
    CuSeqQ, CuSeqK,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_TAIL: tl.constexpr,
    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, EVEN_M: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SHIFTED: tl.constexpr, SOFTCAP: tl.constexpr, VARLEN: tl.constexpr,
    ROW_UNIT: tl.constexpr = 1,
):
    """dK, dV for one key tile. Grid: (cdiv(N_K, BLOCK_N1), B * SPLITS * HKV) (VARLEN: the
    longest sequence's keys; N_Q, N_K the packed totals). scale = softmax scale,
    qk_scale = scale * log2(e). SPLITS > 1 (dense only): the GQA group's query heads are
    shared among SPLITS programs, program s taking heads [s G / S, (s + 1) G / S), each
    writing its partial sums to batch b * SPLITS + s of DK and DV (fp32 workspaces of B *
    SPLITS batches, which the caller sums in order). ROW_UNIT: the strides' unit
    (:func:`~flashscope.kernels.common.in_units`)."""
    stride_qb, stride_qh, stride_qm = in_units(stride_qb, stride_qh, stride_qm, ROW_UNIT)
    stride_kb, stride_kh, stride_kn = in_units(stride_kb, stride_kh, stride_kn, ROW_UNIT)
    stride_vb, stride_vh, stride_vn = in_units(stride_vb, stride_vh, stride_vn, ROW_UNIT)
    stride_dob, stride_doh, stride_dom = in_units(stride_dob, stride_doh, stride_dom, ROW_UNIT)
    stride_dkb, stride_dkh, stride_dkn = in_units(stride_dkb, stride_dkh, stride_dkn, ROW_UNIT)
    stride_dvb, stride_dvh, stride_dvn = in_units(stride_dvb, stride_dvh, stride_dvn, ROW_UNIT)
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_bs = (pid_bh // HKV).to(tl.int64)  # the store's batch: b * SPLITS + split
    off_b = off_bs // SPLITS
    split = off_bs % SPLITS
    off_hkv = (pid_bh % HKV).to(tl.int64)
    start_n = pid_n * BLOCK_N1
    q_start, n_q, k_start, n_k, OFFSET = sequences(CuSeqQ, CuSeqK, off_b, N_Q, N_K, OFFSET,
                                                   VARLEN, SHIFTED)
    if VARLEN:
        if start_n >= n_k:  # past this sequence's keys
            return

    offs_n = start_n + tl.arange(0, BLOCK_N1)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    kv_mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(_rows(K, off_b, off_hkv, k_start, stride_kb, stride_kh, stride_kn, stride_kd,
                      offs_n, offs_d, VARLEN), mask=kv_mask, other=0.0)
    v = tl.load(_rows(V, off_b, off_hkv, k_start, stride_vb, stride_vh, stride_vn, stride_vd,
                      offs_n, offs_d, VARLEN), mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM_PAD], dtype=tl.float32)
    # the tail columns (HEAD_TAIL): their own K, V tiles and accumulators; without a
    # tail the main ones stand in, unused
    offs_t = offs_d
    k_t, v_t, dk_t, dv_t, kv_mask_t = k, v, dk, dv, kv_mask
    if HEAD_TAIL:
        offs_t = HEAD_DIM_PAD + tl.arange(0, HEAD_TAIL)
        kv_mask_t = (offs_n[:, None] < n_k) & (offs_t[None, :] < HEAD_DIM)
        k_t = tl.load(_rows(K, off_b, off_hkv, k_start, stride_kb, stride_kh, stride_kn,
                            stride_kd, offs_n, offs_t, VARLEN), mask=kv_mask_t, other=0.0)
        v_t = tl.load(_rows(V, off_b, off_hkv, k_start, stride_vb, stride_vh, stride_vn,
                            stride_vd, offs_n, offs_t, VARLEN), mask=kv_mask_t, other=0.0)
        dk_t = tl.zeros([BLOCK_N1, HEAD_TAIL], dtype=tl.float32)
        dv_t = tl.zeros([BLOCK_N1, HEAD_TAIL], dtype=tl.float32)

    # query tiles [lo, full_lo) cross the band's lower edge (the diagonal), [full_lo,
    # full_hi) see every key of this tile, [full_hi, hi) cross its upper edge (a left
    # window) or hold rows past N_Q
    lo, full_lo, full_hi, hi = query_range(start_n, n_q, OFFSET, LEFT, RIGHT, BLOCK_N1,
                                           BLOCK_M1, CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
    BAND: tl.constexpr = CAUSAL or HAS_LEFT or HAS_RIGHT
    for g in range(split * GROUP // SPLITS, (split + 1) * GROUP // SPLITS):
        off_h = off_hkv * GROUP + g
        bh = off_b * H + off_h
        q_base = seq_base(Q, off_b, off_h, q_start, stride_qb, stride_qh, stride_qm, VARLEN)
        do_base = seq_base(DOut, off_b, off_h, q_start, stride_dob, stride_doh, stride_dom,
                           VARLEN)
        lse_base = Lse + row_start(bh, off_h, q_start, N_Q, VARLEN)
        delta_base = Delta + row_start(bh, off_h, q_start, N_Q, VARLEN)
        # Split into segments (masked band edges, whole tiles, ragged tail), each
        # segment's loop hands dK and dV to the next while its last wgmma may still be
        # writing them, and ptxas then serializes every wgmma of the kernel (the sm_90
        # build's wgmma_serialized in `flashscope inspect`). So a band or a packed batch
        # runs one loop over all the query tiles that see this key tile, each masked;
        # only a plain dense problem splits off its ragged last tile, which it can
        # without that cost.
        if BAND or VARLEN:
            dk, dv, dk_t, dv_t = _attn_bwd_dkdv_tiles(
                dk, dv, dk_t, dv_t, k, v, k_t, v_t, q_base, do_base, lse_base, delta_base,
                stride_qm, stride_qd, stride_dom, stride_dod, offs_n, offs_d, offs_t, n_q,
                qk_scale, OFFSET, LEFT, RIGHT, cap_in, cap_out, lo, hi, BLOCK_M1, HEAD_DIM,
                HEAD_DIM_PAD, HEAD_TAIL, not EVEN_M, BAND, CAUSAL, HAS_LEFT, HAS_RIGHT,
                SHIFTED, SOFTCAP)
        else:
            for seg in tl.static_range(1, 3):  # the whole tiles, then the ragged tail
                seg_lo, seg_hi = segment(seg, lo, full_lo, full_hi, hi)
                if seg == 1 or not EVEN_M:
                    dk, dv, dk_t, dv_t = _attn_bwd_dkdv_tiles(
                        dk, dv, dk_t, dv_t, k, v, k_t, v_t, q_base, do_base, lse_base,
                        delta_base, stride_qm, stride_qd, stride_dom, stride_dod, offs_n,
                        offs_d, offs_t, n_q, qk_scale, OFFSET, LEFT, RIGHT, cap_in, cap_out,
                        seg_lo, seg_hi, BLOCK_M1, HEAD_DIM, HEAD_DIM_PAD, HEAD_TAIL,
                        seg == 2, False, CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED, SOFTCAP)

    dk = dk * scale
    tl.store(_rows(DK, off_bs, off_hkv, k_start, stride_dkb, stride_dkh, stride_dkn,
                   stride_dkd, offs_n, offs_d, VARLEN), dk.to(DK.dtype.element_ty),
             mask=kv_mask)
    tl.store(_rows(DV, off_bs, off_hkv, k_start, stride_dvb, stride_dvh, stride_dvn,
                   stride_dvd, offs_n, offs_d, VARLEN), dv.to(DV.dtype.element_ty),
             mask=kv_mask)
    if HEAD_TAIL:
        dk_t = dk_t * scale
        tl.store(_rows(DK, off_bs, off_hkv, k_start, stride_dkb, stride_dkh, stride_dkn,
                       stride_dkd, offs_n, offs_t, VARLEN), dk_t.to(DK.dtype.element_ty),
                 mask=kv_mask_t)
        tl.store(_rows(DV, off_bs, off_hkv, k_start, stride_dvb, stride_dvh, stride_dvn,
                       stride_dvd, offs_n, offs_t, VARLEN), dv_t.to(DV.dtype.element_ty),
                 mask=kv_mask_t)


@triton.jit
def _attn_bwd_dq_tiles(
    dq, dq_t, q, do, q_t, do_t, lse2, delta,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, offs_t, N_K, qk_scale, OFFSET, LEFT, RIGHT, cap_in, cap_out, lo, hi,
    BLOCK_N2: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    HEAD_TAIL: tl.constexpr, MASK_N: tl.constexpr, MASK_BAND: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SHIFTED: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Fold key tiles [lo, hi) into dq of one query tile (and the tail columns' dq_t with
    HEAD_TAIL). lse2 = L * log2(e). MASK_N masks keys >= N_K, MASK_BAND the pairs the
    mask hides."""
    offs_n0 = tl.arange(0, BLOCK_N2)
    d_ok = offs_d < HEAD_DIM
    t_ok = offs_t < HEAD_DIM
    PAD_D: tl.constexpr = HEAD_DIM < HEAD_DIM_PAD
    for start_n in range(lo, hi, BLOCK_N2):
        start_n = tl.multiple_of(start_n, BLOCK_N2)
        offs_n = start_n + offs_n0
        n_ok = offs_n[None, :] < N_K
        kt = load_tile(k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                       n_ok, d_ok[:, None], MASK_N, PAD_D)
        vt = load_tile(v_base + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd,
                       n_ok, d_ok[:, None], MASK_N, PAD_D)
        qk = tl.dot(q, kt)
        if HEAD_TAIL:
            kt_t = load_tile(k_base + offs_n[None, :] * stride_kn
                             + offs_t[:, None] * stride_kd, n_ok, t_ok[:, None], MASK_N, True)
            vt_t = load_tile(v_base + offs_n[None, :] * stride_vn
                             + offs_t[:, None] * stride_vd, n_ok, t_ok[:, None], MASK_N, True)
            qk = tl.dot(q_t, kt_t, qk)
        if SOFTCAP:
            s, t = softcapped(qk, cap_in, cap_out)
            p = tl.math.exp2(s - lse2[:, None])
        else:
            p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASK_BAND:
            keep = visible(offs_m[:, None], offs_n[None, :], OFFSET, LEFT, RIGHT, CAUSAL,
                           HAS_LEFT, HAS_RIGHT, SHIFTED)
            p = tl.where(keep, p, 0.0)
        if MASK_N:
            p = tl.where(n_ok, p, 0.0)
        dp = tl.dot(do, vt)
        if HEAD_TAIL:
            dp = tl.dot(do_t, vt_t, dp)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq)
        if HEAD_TAIL:
            dq_t = tl.dot(ds.to(kt_t.dtype), tl.trans(kt_t), dq_t)
    return dq, dq_t


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DOut, Out, Lse, Delta, DQ,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H, GROUP, N_Q, N_K, scale, qk_scale, OFFSET, LEFT, RIGHT, cap_in, cap_out,
    CuSeqQ, CuSeqK,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_TAIL: tl.constexpr,
    BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, EVEN_N: tl.constexpr,
    OWN_DELTA: tl.constexpr, CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, SHIFTED: tl.constexpr, SOFTCAP: tl.constexpr,
    VARLEN: tl.constexpr, ROW_UNIT: tl.constexpr = 1,
):
    """dQ for one query tile. Grid: (cdiv(N_Q, BLOCK_M2), B * H) (VARLEN: the longest
    sequence's rows; N_Q, N_K the packed totals). Programs run last tile first: under a
    causal mask the last query tiles have the most keys to visit. OWN_DELTA: the program
    forms its rows' delta = rowsum(dO * O) from the dO it holds and O, and stores it for
    the dK/dV pass launched after it (no preprocess launch); else it reads Delta.
    ROW_UNIT: the strides' unit (:func:`~flashscope.kernels.common.in_units`)."""
    stride_qb, stride_qh, stride_qm = in_units(stride_qb, stride_qh, stride_qm, ROW_UNIT)
    stride_kb, stride_kh, stride_kn = in_units(stride_kb, stride_kh, stride_kn, ROW_UNIT)
    stride_vb, stride_vh, stride_vn = in_units(stride_vb, stride_vh, stride_vn, ROW_UNIT)
    stride_dob, stride_doh, stride_dom = in_units(stride_dob, stride_doh, stride_dom, ROW_UNIT)
    stride_ob, stride_oh, stride_om = in_units(stride_ob, stride_oh, stride_om, ROW_UNIT)
    stride_dqb, stride_dqh, stride_dqm = in_units(stride_dqb, stride_dqh, stride_dqm, ROW_UNIT)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    off_hkv = off_h // GROUP
    start_m = pid_m * BLOCK_M2
    q_start, n_q, k_start, n_k, OFFSET = sequences(CuSeqQ, CuSeqK, off_b, N_Q, N_K, OFFSET,
                                                   VARLEN, SHIFTED)
    if VARLEN:
        if start_m >= n_q:  # past this sequence's rows
            return

    offs_m = start_m + tl.arange(0, BLOCK_M2)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    m_ok = offs_m < n_q
    q_mask = m_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(_rows(Q, off_b, off_h, q_start, stride_qb, stride_qh, stride_qm, stride_qd,
                      offs_m, offs_d, VARLEN), mask=q_mask, other=0.0)
    do = tl.load(_rows(DOut, off_b, off_h, q_start, stride_dob, stride_doh, stride_dom,
                       stride_dod, offs_m, offs_d, VARLEN), mask=q_mask, other=0.0)
    row = row_start(pid_bh, off_h, q_start, N_Q, VARLEN) + offs_m
    lse2 = tl.load(Lse + row, mask=m_ok, other=float("inf")) * LOG2E
    dq = tl.zeros([BLOCK_M2, HEAD_DIM_PAD], dtype=tl.float32)
    # the tail columns (HEAD_TAIL): their own Q, dO tiles and dQ accumulator; without a
    # tail the main ones stand in, unused
    offs_t = offs_d
    q_t, do_t, dq_t, q_mask_t = q, do, dq, q_mask
    if HEAD_TAIL:
        offs_t = HEAD_DIM_PAD + tl.arange(0, HEAD_TAIL)
        q_mask_t = m_ok[:, None] & (offs_t[None, :] < HEAD_DIM)
        q_t = tl.load(_rows(Q, off_b, off_h, q_start, stride_qb, stride_qh, stride_qm,
                            stride_qd, offs_m, offs_t, VARLEN), mask=q_mask_t, other=0.0)
        do_t = tl.load(_rows(DOut, off_b, off_h, q_start, stride_dob, stride_doh, stride_dom,
                             stride_dod, offs_m, offs_t, VARLEN), mask=q_mask_t, other=0.0)
        dq_t = tl.zeros([BLOCK_M2, HEAD_TAIL], dtype=tl.float32)
    if OWN_DELTA:
        o = tl.load(_rows(Out, off_b, off_h, q_start, stride_ob, stride_oh, stride_om,
                          stride_od, offs_m, offs_d, VARLEN), mask=q_mask, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
        if HEAD_TAIL:
            o_t = tl.load(_rows(Out, off_b, off_h, q_start, stride_ob, stride_oh, stride_om,
                                stride_od, offs_m, offs_t, VARLEN), mask=q_mask_t, other=0.0)
            delta += tl.sum(o_t.to(tl.float32) * do_t.to(tl.float32), axis=1)
        tl.store(Delta + row, delta, mask=m_ok)
    else:
        delta = tl.load(Delta + row, mask=m_ok, other=0.0)
    k_base = seq_base(K, off_b, off_hkv, k_start, stride_kb, stride_kh, stride_kn, VARLEN)
    v_base = seq_base(V, off_b, off_hkv, k_start, stride_vb, stride_vh, stride_vn, VARLEN)

    lo, full_lo, full_hi, hi = key_range(start_m, n_k, OFFSET, LEFT, RIGHT, BLOCK_M2,
                                         BLOCK_N2, CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
    BAND: tl.constexpr = CAUSAL or HAS_LEFT or HAS_RIGHT
    # the band's left edge (a left bound), the tiles every row sees, then the right edge
    # and the ragged last tile, in that order
    for seg in tl.static_range(3):
        seg_lo, seg_hi = segment(seg, lo, full_lo, full_hi, hi)
        if (seg == 0 and HAS_LEFT) or seg == 1 or (seg == 2 and (BAND or not EVEN_N)):
            dq, dq_t = _attn_bwd_dq_tiles(
                dq, dq_t, q, do, q_t, do_t, lse2, delta, k_base, v_base, stride_kn,
                stride_kd, stride_vn, stride_vd, offs_m, offs_d, offs_t, n_k, qk_scale,
                OFFSET, LEFT, RIGHT, cap_in, cap_out, seg_lo, seg_hi, BLOCK_N2, HEAD_DIM,
                HEAD_DIM_PAD, HEAD_TAIL, seg != 1 and not EVEN_N,
                seg == 0 or (seg == 2 and BAND), CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED,
                SOFTCAP)

    dq = dq * scale
    tl.store(_rows(DQ, off_b, off_h, q_start, stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                   offs_m, offs_d, VARLEN), dq.to(DQ.dtype.element_ty), mask=q_mask)
    if HEAD_TAIL:
        dq_t = dq_t * scale
        tl.store(_rows(DQ, off_b, off_h, q_start, stride_dqb, stride_dqh, stride_dqm,
                       stride_dqd, offs_m, offs_t, VARLEN), dq_t.to(DQ.dtype.element_ty),
                 mask=q_mask_t)


@triton.jit
def _attn_bwd_sum_splits(
    WK, WV, DK, DV,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    HKV, N_K,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr, ROW_UNIT: tl.constexpr = 1,
):
    """dK, dV of a dK/dV pass whose GQA groups were shared among SPLITS programs: the
    partial sums in the fp32 workspaces WK, WV (contiguous (B * SPLITS, HKV, N_K,
    HEAD_DIM), share s of batch b at b * SPLITS + s) added in share order, so the result
    is deterministic, and cast to DK's and DV's dtype. Grid: (cdiv(N_K, BLOCK_N), B * HKV).
    The shares unroll, so every load of a program is in flight at once. ROW_UNIT: the
    strides' unit (:func:`~flashscope.kernels.common.in_units`)."""
    stride_dkb, stride_dkh, stride_dkn = in_units(stride_dkb, stride_dkh, stride_dkn, ROW_UNIT)
    stride_dvb, stride_dvh, stride_dvn = in_units(stride_dvb, stride_dvh, stride_dvn, ROW_UNIT)
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // HKV).to(tl.int64)
    off_h = (pid_bh % HKV).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    ok = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    share = tl.cast(HKV, tl.int64) * N_K * HEAD_DIM
    at = (off_b * SPLITS * HKV + off_h) * N_K * HEAD_DIM \
        + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        dk += tl.load(WK + at + s * share, mask=ok, other=0.0)
        dv += tl.load(WV + at + s * share, mask=ok, other=0.0)
    tl.store(_rows(DK, off_b, off_h, 0, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                   offs_n, offs_d, False), dk.to(DK.dtype.element_ty), mask=ok)
    tl.store(_rows(DV, off_b, off_h, 0, stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                   offs_n, offs_d, False), dv.to(DV.dtype.element_ty), mask=ok)
