"""Decoding against a KV cache: a few new query tokens per sequence attend to that
sequence's cached keys and values (FlashAttention's ``flash_attn_with_kvcache``).

Shapes: Q (B, N_Q, H, D); the cache either dense, K and V (B, CAPACITY, Hkv, D), or
paged, K and V (pages, PAGE, Hkv, D) with Table (B, max pages) int32 naming the page
that holds keys [PAGE i, PAGE (i + 1)) of sequence b; SeqLens (B,) int32, the keys each
sequence holds before this call; Out like Q; Lse (B, H, N_Q) fp32. Any strides.

Sequence b holds n_k = SeqLens[b] + N_NEW keys (N_NEW new ones were appended by
:func:`_decode_append` first), and query i sits at position n_k - N_Q + i: the mask
(causal, window, softcap) is :mod:`flashscope.masks`' with bottom-right alignment, and the
key tiles a row block visits come from the forward's own helper
(:func:`flashscope.kernels.keyrange.key_range`) with a per-sequence OFFSET = n_k - N_Q.

One program serves one KV head of one sequence: the GROUP = H / Hkv query heads that read
that head, times the N_Q query tokens, are packed as rows of one tile (row r is token
r // GROUP of head r % GROUP, padded to BLOCK_M), so a GQA group reads its K and V once.
DOT: the scores and P V are tensor-core products (``tl.dot``, BLOCK_M >= 16); without it
each key tile is multiplied into the rows and reduced on the CUDA cores, which computes no
padding rows (the family says which it runs and why). SPLITS programs share a tile's keys
(flash-decoding): split s takes an even share of its key tiles and, with SPLIT, writes its
unnormalized rows and softmax state (m, l) to a float32 workspace in
:mod:`flashscope.kernels.attention_merge`'s slot layout; :func:`_decode_merge` combines
them, many slots at a time. The online softmax is
:func:`flashscope.kernels.common.softmax_step`.

Device-side guards, so that bad values the host does not read (that would cost a sync)
stay harmless: n_k is clamped into [0, CAPACITY] (the cache's keys per sequence), pages read
are clamped into [0, NUM_PAGES), and an append whose position or page is out of range
writes nothing. This module imports Triton only.
"""

import triton
import triton.language as tl

from flashscope.kernels.attention_merge import merge_chunks
from flashscope.kernels.common import (
    LN2,
    in_units,
    launch_next,
    load_tile,
    scaled_scores,
    softmax_step,
    wait_previous,
)
from flashscope.kernels.keyrange import key_range, segment, visible


@triton.jit
def _page_of(table_row, cols, ok, PAGE: tl.constexpr):
    """The page of keys ``cols`` of one sequence, as the table holds it (widened to int64:
    a page times its stride may pass 2^31 elements)."""
    return tl.load(table_row + cols // PAGE, mask=ok, other=0).to(tl.int64)


@triton.jit
def _key_rows(table_row, seq, start_n, cols, ok, N_K, NUM_PAGES, PAGE: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """Where keys ``cols`` = start_n + [0, BLOCK_N) of sequence ``seq`` live, as indices
    along the cache's first two axes: (seq, col) when dense (PAGE = 0), (page, col % PAGE)
    when paged, the page read once for K and V and clamped into the cache. A tile inside
    one page (PAGE a multiple of BLOCK_N) reads its page once, as a scalar; a tile of
    whole pages (BLOCK_N a multiple of PAGE) reads its BLOCK_N / PAGE pages, each index
    clamped into the sequence's table row rather than masked, clamps them into the cache
    before spreading each over its keys, and takes a key's place in its page from the
    tile's own arange (start_n is a multiple of PAGE). Against masking the table read and
    clamping and taking ``cols % PAGE`` per key: 3200 instructions against 4312 and no
    spilled registers against 3/4 (sm_90, 16-key pages, ``16x128 w4 s3``); GPU time
    0.99-1.04x (H200), so the paged cache's gap to the dense one is not this arithmetic."""
    if PAGE > 0:
        if PAGE % BLOCK_N == 0:
            page = _in_pool(tl.load(table_row + start_n // PAGE), NUM_PAGES)
            row = cols % PAGE
        elif BLOCK_N % PAGE == 0:
            PAGES: tl.constexpr = BLOCK_N // PAGE
            first = start_n // PAGE + tl.arange(0, PAGES)
            pages = _in_pool(tl.load(table_row + tl.minimum(first, (N_K - 1) // PAGE)),
                             NUM_PAGES)
            page = tl.reshape(tl.broadcast_to(pages[:, None], (PAGES, PAGE)), (BLOCK_N,))
            row = tl.arange(0, BLOCK_N) % PAGE
        else:
            page = _in_pool(_page_of(table_row, cols, ok, PAGE), NUM_PAGES)
            row = cols % PAGE
        return page.to(tl.int64), row
    else:
        return seq, cols


@triton.jit
def _in_pool(page, NUM_PAGES):
    """A page read from the block table, clamped into the cache's NUM_PAGES."""
    return tl.minimum(tl.maximum(page, 0), NUM_PAGES - 1)


@triton.jit
def _decode_tiles(
    acc, l_i, m_i, q, k_base, v_base, table_row, seq, q_pos, lo, hi, N_K, OFFSET,
    LEFT, RIGHT, NUM_PAGES, qk_scale, cap_in, cap_out, offs_d,
    stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    PAGE: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Fold key tiles [lo, hi) into (acc, l_i, m_i). MASKED: the tiles of the band's
    edges and the sequence's partial last tile (keys past N_K and those the mask hides
    from a row); unmasked tiles load whole and carry no mask."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    PAD_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    BAND: tl.constexpr = CAUSAL or HAS_LEFT or HAS_RIGHT
    for start_n in tl.range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        ok = cols < N_K
        row_b, row_n = _key_rows(table_row, seq, start_n, cols, ok, N_K, NUM_PAGES, PAGE,
                                 BLOCK_N)
        k_off = row_b * stride_kb + row_n * stride_kn
        v_off = row_b * stride_vb + row_n * stride_vn
        if DOT:
            kt = load_tile(k_base + k_off[None, :] + offs_d[:, None] * stride_kd,
                           ok[None, :], d_ok[:, None], MASKED, PAD_D)
            qk = tl.dot(q, kt)
        else:
            k = load_tile(k_base + k_off[:, None] + offs_d[None, :] * stride_kd,
                          ok[:, None], d_ok[None, :], MASKED, PAD_D)
            qk = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], 2)
        s = scaled_scores(qk, qk_scale, cap_in, cap_out, SOFTCAP)
        if MASKED:
            keep = ok[None, :]
            if BAND:
                keep = keep & visible(q_pos[:, None], cols[None, :], OFFSET, LEFT, RIGHT,
                                      CAUSAL, HAS_LEFT, HAS_RIGHT, True)
            s = tl.where(keep, s, float("-inf"))
        # a row may reach a masked tile before it has seen any key, or see none at all
        p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, MASKED)
        v = load_tile(v_base + v_off[:, None] + offs_d[None, :] * stride_vd,
                      ok[:, None], d_ok[None, :], MASKED, PAD_D)
        acc = acc * alpha[:, None]
        if DOT:
            acc = tl.dot(p.to(v.dtype), v, acc)
        else:
            acc += tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], 1)
    return acc, l_i, m_i


@triton.jit
def _tile_of(t, N_M, HKV):
    """Work tile t -> (sequence, kv head, row block)."""
    bh = t // N_M
    return bh // HKV, bh % HKV, t % N_M


@triton.jit
def _row_heads(rows, hkv, GROUP: tl.constexpr):
    """Packed rows -> (query index, query head) of each."""
    return rows // GROUP, hkv * GROUP + rows % GROUP


@triton.jit
def _store_rows(Out, Lse, out, lse2, b, qi, h, row_ok, lse_ok, offs_d, H, N_Q,
                stride_ob, stride_om, stride_oh, stride_od,
                HEAD_DIM: tl.constexpr, RETURN_LSE: tl.constexpr):
    """Store normalized rows (``row_ok``) to Out[b, qi, h] and the log-sum-exp (given in
    base 2) of rows ``lse_ok`` to Lse[b, h, qi] in natural log."""
    o_ptrs = (Out + b.to(tl.int64) * stride_ob + qi[:, None].to(tl.int64) * stride_om
              + h[:, None].to(tl.int64) * stride_oh + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    if RETURN_LSE:
        lse_ptrs = Lse + (b.to(tl.int64) * H + h) * N_Q + qi
        tl.store(lse_ptrs, lse2 * LN2, mask=lse_ok)


@triton.jit
def _decode_fwd(
    Q, K, V, Out, Lse, Part, SeqLens, Table,
    stride_qb, stride_qm, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_ob, stride_om, stride_oh, stride_od,
    stride_tb, N_Q, N_NEW, CAPACITY, NUM_PAGES, N_M, HKV, SPLITS,
    qk_scale, LEFT, RIGHT, cap_in, cap_out,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, DOT: tl.constexpr,
    SPLIT: tl.constexpr, RETURN_LSE: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    EARLY: tl.constexpr = False, ROW_UNIT: tl.constexpr = 1,
):
    """Grid (B * Hkv * N_M, SPLITS): program (t, s) runs split s of work tile t (row block
    t % N_M of kv head (t // N_M) % Hkv of sequence t // (N_M Hkv)). With SPLIT it writes
    workspace slot t * SPLITS + s of Part for :func:`_decode_merge`; without, the output.
    qk_scale = scale * log2(e); LEFT, RIGHT, cap_in, cap_out and the mask switches as
    :meth:`flashscope.masks.Mask.scalars`, ``cap_args`` and ``switches`` give them.
    EARLY: launched early (the kernel before it may still run), and the merge after it
    let in at once (:func:`~flashscope.kernels.common.wait_previous`). ROW_UNIT: the
    strides' unit (:func:`~flashscope.kernels.common.in_units`)."""
    stride_qb, stride_qh, stride_qm = in_units(stride_qb, stride_qh, stride_qm, ROW_UNIT)
    stride_kb, stride_kh, stride_kn = in_units(stride_kb, stride_kh, stride_kn, ROW_UNIT)
    stride_vb, stride_vh, stride_vn = in_units(stride_vb, stride_vh, stride_vn, ROW_UNIT)
    stride_ob, stride_oh, stride_om = in_units(stride_ob, stride_oh, stride_om, ROW_UNIT)
    t = tl.program_id(0)
    split = tl.program_id(1)
    launch_next(t, EARLY)
    wait_previous(t, EARLY)
    b, hkv, m = _tile_of(t, N_M, HKV)
    rows = m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP * N_Q
    qi, h = _row_heads(rows, hkv, GROUP)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q_ptrs = (Q + b.to(tl.int64) * stride_qb + qi[:, None].to(tl.int64) * stride_qm
              + h[:, None].to(tl.int64) * stride_qh + offs_d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if not DOT:
        q = q.to(tl.float32)
    n_k = tl.minimum(tl.maximum(tl.load(SeqLens + b) + N_NEW, 0), CAPACITY)
    offset = n_k - N_Q
    # query indices a row block spans (rows past the real ones count, as in the forward)
    SPAN: tl.constexpr = (BLOCK_M + GROUP - 2) // GROUP + 1
    lo, full_lo, full_hi, hi = key_range(m * BLOCK_M // GROUP, n_k, offset, LEFT, RIGHT,
                                         SPAN, BLOCK_N, CAUSAL, HAS_LEFT, HAS_RIGHT, True)
    # this split's even share of the row block's key tiles
    share = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), SPLITS) * BLOCK_N
    s_lo = lo + split * share
    s_hi = tl.minimum(s_lo + share, hi)

    table_row = Table + b.to(tl.int64) * stride_tb
    k_base = K + hkv.to(tl.int64) * stride_kh
    v_base = V + hkv.to(tl.int64) * stride_vh
    seq = b.to(tl.int64)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    # the band's left edge (masked), the tiles every row sees whole, then the band's right
    # edge and the sequence's partial last tile (masked), each cut to this split's share
    for seg in tl.static_range(3):
        seg_lo, seg_hi = segment(seg, lo, full_lo, full_hi, hi)
        if seg != 0 or HAS_LEFT:
            acc, l_i, m_i = _decode_tiles(
                acc, l_i, m_i, q, k_base, v_base, table_row, seq, qi,
                tl.maximum(seg_lo, s_lo), tl.minimum(seg_hi, s_hi), n_k, offset, LEFT, RIGHT,
                NUM_PAGES, qk_scale, cap_in, cap_out, offs_d, stride_kb, stride_kn,
                stride_kd, stride_vb, stride_vn, stride_vd, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD,
                PAGE, DOT, seg != 1, CAUSAL, HAS_LEFT, HAS_RIGHT, SOFTCAP)

    if SPLIT:
        slot = Part + (t.to(tl.int64) * SPLITS + split) * (BLOCK_M * (HEAD_DIM_PAD + 2))
        local = tl.arange(0, BLOCK_M)
        tl.store(slot + local[:, None] * HEAD_DIM_PAD + offs_d[None, :], acc,
                 mask=row_ok[:, None])
        ml = slot + BLOCK_M * HEAD_DIM_PAD + 2 * local
        tl.store(ml, m_i, mask=row_ok)
        tl.store(ml + 1, l_i, mask=row_ok)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        _store_rows(Out, Lse, out, m_i + tl.math.log2(l_i), b, qi, h, row_ok, row_ok, offs_d,
                    HKV * GROUP, N_Q, stride_ob, stride_om, stride_oh, stride_od, HEAD_DIM,
                    RETURN_LSE)


@triton.jit
def _decode_merge(
    Part, Out, Lse, N_Q, N_M, HKV, SPLITS,
    stride_ob, stride_om, stride_oh, stride_od,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, CHUNK: tl.constexpr,
    RETURN_LSE: tl.constexpr, EARLY: tl.constexpr = False,
):
    """Grid (B * Hkv * N_M, row chunks, HEAD_DIM_PAD / COLS): combine the SPLITS slots of
    work tile t (:func:`flashscope.kernels.attention_merge.merge_chunks`, CHUNK slots at a
    time) for ROWS of its rows and COLS of its columns; the log-sum-exp from the first
    column chunk. EARLY: launched while the splits' kernel runs, it waits for it first."""
    t = tl.program_id(0)
    wait_previous(t, EARLY)
    c = tl.program_id(1)
    j = tl.program_id(2)
    b, hkv, m = _tile_of(t, N_M, HKV)
    local = c * ROWS + tl.arange(0, ROWS)
    rows = m * BLOCK_M + local
    row_ok = (rows < GROUP * N_Q) & (local < BLOCK_M)
    qi, h = _row_heads(rows, hkv, GROUP)
    offs_d = j * COLS + tl.arange(0, COLS)
    out, lse2 = merge_chunks(Part, t.to(tl.int64) * SPLITS, SPLITS, local, offs_d, row_ok,
                             BLOCK_M, HEAD_DIM_PAD, CHUNK)
    # each column chunk holds the whole log-sum-exp: the first stores it (the condition as
    # a vector: Triton 3.9's interpreter refuses a mask that ands a vector with a scalar)
    first = (local * 0 + j) == 0
    _store_rows(Out, Lse, out, lse2, b, qi, h, row_ok, row_ok & first, offs_d, HKV * GROUP,
                N_Q, stride_ob, stride_om, stride_oh, stride_od, HEAD_DIM, RETURN_LSE)


@triton.jit
def _decode_append(
    KNew, VNew, K, V, SeqLens, Table,
    stride_nb, stride_nn, stride_nh, stride_nd,
    stride_wb, stride_wn, stride_wh, stride_wd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_tb, HKV, CAPACITY, NUM_PAGES,
    HKV_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    PAGE: tl.constexpr, EARLY: tl.constexpr = False, ROW_UNIT: tl.constexpr = 1,
):
    """Grid (N_NEW, B): program (i, b) copies new token i of sequence b (every kv head of
    KNew and VNew, (B, N_NEW, Hkv, D)) to cache position SeqLens[b] + i, bit for bit. A
    position outside [0, CAPACITY) or, paged, a page outside [0, NUM_PAGES) is skipped.
    EARLY: launched early, and the attention after it let in at once (it waits for the
    cache's writes itself). ROW_UNIT: the strides' unit
    (:func:`~flashscope.kernels.common.in_units`)."""
    stride_nb, stride_nh, stride_nn = in_units(stride_nb, stride_nh, stride_nn, ROW_UNIT)
    stride_wb, stride_wh, stride_wn = in_units(stride_wb, stride_wh, stride_wn, ROW_UNIT)
    stride_kb, stride_kh, stride_kn = in_units(stride_kb, stride_kh, stride_kn, ROW_UNIT)
    stride_vb, stride_vh, stride_vn = in_units(stride_vb, stride_vh, stride_vn, ROW_UNIT)
    i = tl.program_id(0)
    launch_next(i, EARLY)
    wait_previous(i, EARLY)
    b = tl.program_id(1).to(tl.int64)
    heads = tl.arange(0, HKV_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    # the position once a head, a vector: every test below is then on vectors, which
    # Triton 3.9's interpreter needs (a comparison of scalars there gives no mask)
    pos = tl.load(SeqLens + b) + i + heads * 0
    ok = (pos >= 0) & (pos < CAPACITY)
    if PAGE > 0:
        page = _page_of(Table + b * stride_tb, pos, ok, PAGE)
        ok = ok & (page >= 0) & (page < NUM_PAGES)
        seq = page[:, None]
        pos = pos % PAGE
    else:
        seq = b
    keep = ok[:, None] & (heads[:, None] < HKV) & (offs_d[None, :] < HEAD_DIM)
    pos = pos[:, None]
    heads = heads[:, None].to(tl.int64)
    offs_d = offs_d[None, :]
    _copy_row(KNew + b * stride_nb + i * stride_nn + heads * stride_nh + offs_d * stride_nd,
              K + seq * stride_kb + pos * stride_kn + heads * stride_kh + offs_d * stride_kd,
              keep)
    _copy_row(VNew + b * stride_wb + i * stride_wn + heads * stride_wh + offs_d * stride_wd,
              V + seq * stride_vb + pos * stride_vn + heads * stride_vh + offs_d * stride_vd,
              keep)


@triton.jit
def _copy_row(src, dst, keep):
    tl.store(dst, tl.load(src, mask=keep), mask=keep)
