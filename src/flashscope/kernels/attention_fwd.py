"""FlashAttention forward: one Triton body, variants as ``tl.constexpr`` switches.

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

Causal masking is top-left aligned, as in SDPA's ``is_causal``: query i sees keys j <= i.
Key tiles entirely above the diagonal are never visited; tiles entirely below it run the
unmasked loop; only the diagonal band (and a partial last tile) pays for masks.

Hopper loads (``USE_TMA``): the kernel builds 2-D TMA tensor descriptors for Q, K and V
in device memory (``tl.make_tensor_descriptor``; Triton's Hopper warp specialization
partitions data only with these, not with host-built ones) over rows of D elements, a
view the launcher picks (heads-major rows (b, h, n), or sequence-major rows (b, n) with
the heads side by side; :func:`flashscope.launch.tma_view`). Row coordinates are
``b * ROW_B + h * ROW_H + n`` and the column is ``h * COL_H``. One TMA copy moves a
whole tile with no address arithmetic in the threads. A tile that runs past N_K reads the
next head's rows (or zeros past the tensor): their scores are masked to -inf and their V
rows to 0, so nothing leaks, not even a NaN. ``WARP_SPEC`` asks Triton's Hopper
warp-specialization pass to split the key loop into a producer warp group (TMA) and two
consumer warp groups that each own half of the BLOCK_M rows (3 x num_warps warps in all,
register budgets moved with setmaxnreg). Out is stored through pointers in every variant
(the warp-specialized pipeline does not take a descriptor store).

This module imports Triton only, so it compiles for any target without torch or a GPU.
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)
# 2^f ~ C0 + C1 f + C2 f^2 + C3 f^3 on [-1/2, 1/2]: least squares in relative error on
# Chebyshev nodes, max relative error 7.7e-5 (bf16 rounds at 3.9e-3, fp16 at 4.9e-4).
EXP2_C0 = tl.constexpr(0.9999289403695112)
EXP2_C1 = tl.constexpr(0.6932762416819607)
EXP2_C2 = tl.constexpr(0.24260405145947936)
EXP2_C3 = tl.constexpr(0.05508868380751114)
ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23


@triton.jit
def _exp2_fma(x):
    """2^x (x <= 0) on the FMA/ALU pipes instead of MUFU.EX2: x = j + f with j = round(x)
    and f in [-1/2, 1/2]; 2^f from the polynomial, 2^j by adding j to the exponent field.
    Adding 1.5 * 2^23 rounds x and leaves j in the low mantissa bits of t, so
    bits(2^x) = bits(2^f) + bits(t) << 23. x is clamped at -125 so the exponent field
    never wraps: -inf gives 2^-125 (2e-38) where MUFU gives 0, below every dtype's use."""
    x = tl.maximum(x, -125.0)
    t = x + ROUND_MAGIC
    f = x - (t - ROUND_MAGIC)
    p = ((EXP2_C3 * f + EXP2_C2) * f + EXP2_C1) * f + EXP2_C0
    bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _softmax_exp2(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXP2_POLY: tl.constexpr):
    """2^x over a score tile; with EXP2_POLY = 2 (4), one column in 2 (4) takes
    :func:`_exp2_fma`, the rest MUFU.EX2. At D = 64 a 128 x 128 tile needs as many
    MUFU cycles (16 ex2 per SM per clock) as tensor-core cycles, so moving part of the
    exponentials to the 128-lane FMA pipe shortens the softmax. The splits follow the
    MMA accumulator layout, where a thread holds column pairs (2c, 2c + 1) across the
    tile, so they move no data between threads."""
    if EXP2_POLY == 0:
        p = tl.math.exp2(x)
    else:
        even, odd = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_N // 2, 2]))
        if EXP2_POLY == 2:
            odd = _exp2_fma(odd)
        else:  # odd columns of the left half by MUFU, of the right half by polynomial
            left, right = tl.split(tl.permute(tl.reshape(odd, [BLOCK_M, 2, BLOCK_N // 4]),
                                              (0, 2, 1)))
            odd = tl.reshape(tl.permute(tl.join(tl.math.exp2(left), _exp2_fma(right)),
                                        (0, 2, 1)), [BLOCK_M, BLOCK_N // 2])
        p = tl.reshape(tl.join(tl.math.exp2(even), odd), [BLOCK_M, BLOCK_N])
    return p


@triton.jit
def _scores(q, q_src, q_mask, q_row, q_col, k_src, k_row, k_col, stride_kn, stride_kd,
            offs_d, d_ok, start_n, N_K, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
            HEAD_DIM_PAD: tl.constexpr, Q_IN_REGS: tl.constexpr, MASK_N: tl.constexpr,
            USE_TMA: tl.constexpr):
    """Raw scores Q K^T (BLOCK_M x BLOCK_N, fp32) of the key tile at ``start_n``."""
    cols = start_n + tl.arange(0, BLOCK_N)
    if USE_TMA:
        kt = k_src.load([k_row + start_n, k_col]).T
    else:
        kt_ptrs = k_src + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd
        if MASK_N:
            kt = tl.load(kt_ptrs, mask=(cols[None, :] < N_K) & d_ok[:, None], other=0.0)
        elif HEAD_DIM != HEAD_DIM_PAD:
            kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
    if not Q_IN_REGS:
        # Q is re-read each iteration (L1/L2 -> shared memory) instead of staying live in
        # registers across the loop.
        if USE_TMA:
            q = q_src.load([q_row, q_col])
        else:
            q = tl.load(q_src, mask=q_mask, other=0.0)
    return tl.dot(q, kt)


@triton.jit
def _attn_fwd_tiles(
    acc, l_i, m_i, q,
    q_src, q_mask, q_row, q_col, k_src, v_src, k_row, k_col, v_row, v_col,
    stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, N_K, qk_scale, lo, hi,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, Q_IN_REGS: tl.constexpr, MASK_N: tl.constexpr,
    MASK_DIAG: tl.constexpr, SCALE_POS: tl.constexpr, USE_TMA: tl.constexpr,
    WARP_SPEC: tl.constexpr, EXP2_POLY: tl.constexpr, OVERLAP: tl.constexpr,
):
    """Fold key tiles [lo, hi) into (acc, l_i, m_i). MASK_N masks keys >= N_K,
    MASK_DIAG masks keys above the causal diagonal; both are compile-time switches.
    ``*_src``: pointers to the (b, h) slice, or TMA descriptors read at (row, col)."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    if OVERLAP:
        # the last tile's start: the prefetch of the tile after it re-reads it (in bounds)
        last = lo + tl.maximum(hi - lo - 1, 0) // BLOCK_N * BLOCK_N
        qk_next = _scores(q, q_src, q_mask, q_row, q_col, k_src, k_row, k_col, stride_kn,
                          stride_kd, offs_d, d_ok, lo, N_K, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD,
                          Q_IN_REGS, MASK_N, USE_TMA)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if OVERLAP:
            # the next tile's QK^T is issued before this tile's softmax, so the tensor
            # cores work while the softmax runs (its wait lands in the next iteration)
            qk = qk_next
            qk_next = _scores(q, q_src, q_mask, q_row, q_col, k_src, k_row, k_col, stride_kn,
                              stride_kd, offs_d, d_ok, tl.minimum(start_n + BLOCK_N, last),
                              N_K, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, Q_IN_REGS, MASK_N, USE_TMA)
        else:
            qk = _scores(q, q_src, q_mask, q_row, q_col, k_src, k_row, k_col, stride_kn,
                         stride_kd, offs_d, d_ok, start_n, N_K, BLOCK_N, HEAD_DIM,
                         HEAD_DIM_PAD, Q_IN_REGS, MASK_N, USE_TMA)
        if MASK_DIAG or MASK_N or not SCALE_POS:
            s = qk * qk_scale
            if MASK_DIAG:
                s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
            if MASK_N:
                s = tl.where(cols[None, :] < N_K, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = _softmax_exp2(s - m_new[:, None], BLOCK_M, BLOCK_N, EXP2_POLY)
        else:
            # max(qk) * scale == max(qk * scale) for scale > 0, and the scale folds into one
            # FMA per score: p = 2^(qk * qk_scale - m_new).
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = _softmax_exp2(qk * qk_scale - m_new[:, None], BLOCK_M, BLOCK_N, EXP2_POLY)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_TMA:
            v = v_src.load([v_row + start_n, v_col])
            if MASK_N:  # rows past N_K are another head's (p is 0 there; 0 * inf is not)
                v = tl.where(cols[:, None] < N_K, v, 0.0)
        else:
            v_ptrs = v_src + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd
            if MASK_N:
                v = tl.load(v_ptrs, mask=(cols[:, None] < N_K) & d_ok[None, :], other=0.0)
            elif HEAD_DIM != HEAD_DIM_PAD:
                v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
            else:
                v = tl.load(v_ptrs)
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
    Q_ROW_B, Q_ROW_H, Q_COL_H, K_ROW_B, K_ROW_H, K_COL_H, V_ROW_B, V_ROW_H, V_COL_H,
    Q_ROWS, Q_COLS, K_ROWS, K_COLS, V_ROWS, V_COLS,
    H, GROUP, N_Q, N_K, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, Q_IN_REGS: tl.constexpr,
    RETURN_LSE: tl.constexpr, EVEN_N: tl.constexpr, SCALE_POS: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPEC: tl.constexpr, EXP2_POLY: tl.constexpr,
    HEAVY_FIRST: tl.constexpr, OVERLAP: tl.constexpr,
):
    """Grid: (cdiv(N_Q, BLOCK_M), B * H). qk_scale = scale * log2(e). With USE_TMA, the
    *_ROWS x *_COLS views are read through descriptors and the *_ROW_* / *_COL_H scalars
    place (b, h) in them. HEAVY_FIRST (causal) hands the first programs of each head the
    last row blocks, which have the most key tiles: the GPU starts blocks in program order,
    so the grid ends on short blocks instead of leaving SMs idle behind long ones
    (longest-processing-time-first scheduling)."""
    pid_m = tl.program_id(0)
    if HEAVY_FIRST:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    off_hkv = off_h // GROUP
    start_m = pid_m * BLOCK_M

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q_mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    if USE_TMA:
        q_row = (off_b * Q_ROW_B + off_h * Q_ROW_H + start_m).to(tl.int32)
        q_col = (off_h * Q_COL_H).to(tl.int32)
        k_row = (off_b * K_ROW_B + off_hkv * K_ROW_H).to(tl.int32)
        k_col = (off_hkv * K_COL_H).to(tl.int32)
        v_row = (off_b * V_ROW_B + off_hkv * V_ROW_H).to(tl.int32)
        v_col = (off_hkv * V_COL_H).to(tl.int32)
        q_src = tl.make_tensor_descriptor(Q, [Q_ROWS, Q_COLS], [stride_qm, 1],
                                          [BLOCK_M, HEAD_DIM_PAD])
        k_src = tl.make_tensor_descriptor(K, [K_ROWS, K_COLS], [stride_kn, 1],
                                          [BLOCK_N, HEAD_DIM_PAD])
        v_src = tl.make_tensor_descriptor(V, [V_ROWS, V_COLS], [stride_vn, 1],
                                          [BLOCK_N, HEAD_DIM_PAD])
        q = q_src.load([q_row, q_col])
    else:
        q_row, q_col, k_row, k_col, v_row, v_col = 0, 0, 0, 0, 0, 0
        q_src = (Q + off_b * stride_qb + off_h * stride_qh
                 + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd)
        k_src = K + off_b * stride_kb + off_hkv * stride_kh
        v_src = V + off_b * stride_vb + off_hkv * stride_vh
        q = tl.load(q_src, mask=q_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    n_full = (N_K // BLOCK_N) * BLOCK_N  # keys in whole tiles
    if WARP_SPEC:
        # Triton 3.6's Hopper pass specializes a kernel with one loop only: every tile
        # goes through one loop, which pays for the masks the problem needs on all tiles.
        if IS_CAUSAL:
            hi = tl.minimum(N_K, start_m + BLOCK_M)
        else:
            hi = N_K
        acc, l_i, m_i = _attn_fwd_tiles(
            acc, l_i, m_i, q, q_src, q_mask, q_row, q_col,
            k_src, v_src, k_row, k_col, v_row, v_col,
            stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d, N_K, qk_scale,
            0, hi, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, Q_IN_REGS, not EVEN_N, IS_CAUSAL,
            SCALE_POS, USE_TMA, WARP_SPEC, EXP2_POLY, OVERLAP)
    elif IS_CAUSAL:
        # Whole tiles strictly left of this row block need no causal mask.
        full_hi = tl.minimum((start_m // BLOCK_N) * BLOCK_N, n_full)
        acc, l_i, m_i = _attn_fwd_tiles(
            acc, l_i, m_i, q, q_src, q_mask, q_row, q_col,
            k_src, v_src, k_row, k_col, v_row, v_col,
            stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d, N_K, qk_scale,
            0, full_hi, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, Q_IN_REGS, False, False,
            SCALE_POS, USE_TMA, WARP_SPEC, EXP2_POLY, OVERLAP)
        # The diagonal band (and a partial last tile); tiles above it are skipped.
        acc, l_i, m_i = _attn_fwd_tiles(
            acc, l_i, m_i, q, q_src, q_mask, q_row, q_col,
            k_src, v_src, k_row, k_col, v_row, v_col,
            stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d, N_K, qk_scale,
            full_hi, tl.minimum(N_K, start_m + BLOCK_M),
            BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, Q_IN_REGS, not EVEN_N, True,
            SCALE_POS, USE_TMA, WARP_SPEC, EXP2_POLY, OVERLAP)
    else:
        acc, l_i, m_i = _attn_fwd_tiles(
            acc, l_i, m_i, q, q_src, q_mask, q_row, q_col,
            k_src, v_src, k_row, k_col, v_row, v_col,
            stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d, N_K, qk_scale,
            0, n_full, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, Q_IN_REGS, False, False,
            SCALE_POS, USE_TMA, WARP_SPEC, EXP2_POLY, OVERLAP)
        if not EVEN_N:
            acc, l_i, m_i = _attn_fwd_tiles(
                acc, l_i, m_i, q, q_src, q_mask, q_row, q_col,
                k_src, v_src, k_row, k_col, v_row, v_col,
                stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d, N_K, qk_scale,
                n_full, N_K, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, Q_IN_REGS, True, False,
                SCALE_POS, USE_TMA, WARP_SPEC, EXP2_POLY, OVERLAP)

    out = acc / l_i[:, None]
    o_ptrs = (Out + off_b * stride_ob + off_h * stride_oh
              + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=q_mask)
    if RETURN_LSE:
        lse = (m_i + tl.math.log2(l_i)) * LN2
        tl.store(Lse + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)
