"""The sm_90 forward's output: each consumer's 64 rows of O / l, stored through TMA, or
from registers where a packed sequence ends inside the rows; with a head-dim tail both
column parts; with SPLIT, a cut block's unnormalized partial for the merge kernel.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from flashscope.compat import tma_store
from flashscope.kernels.common import LN2


@gluon.jit
def _store_out(acc, l_part, m_i, o_smem, q_empty, o_desc, Lse, C: gl.constexpr, off_b,
               off_h, row0, pid_bh, N_Q, RETURN_LSE: gl.constexpr, EARLY_Q: gl.constexpr,
               OUT_RCP: gl.constexpr, row_s: gl.constexpr, GUARD: gl.constexpr, q0, Out,
               VARLEN: gl.constexpr, tail, ROW_GROUP: gl.constexpr = 1,
               GROUPED: gl.constexpr = False):
    """Consumer C's output rows [row0, row0 + 64) of head (off_b, off_h): O / l (acc
    [64, D] fp32, l_part its rows' quad shares of l, summed here once per work tile) and,
    with RETURN_LSE, (m + log2 l) ln 2. O / l divides each of a thread's D / 2 values,
    and ptxas wraps every IEEE division in a range fix-up; OUT_RCP takes one reciprocal
    per row and multiplies (within an ulp of the quotient, far below bf16's rounding).
    Out is staged in shared memory for a TMA store: without EARLY_Q in this consumer's Q
    slot (its Q K^T products completed), handed back for the next Q once the store has
    read it; with EARLY_Q in a slot of its own, which only the previous work tile's store
    must have left. GUARD: a row that saw no key (l = 0, m = -inf) stores zeros and a
    log-sum-exp of -inf.

    VARLEN: the rows are a packed sequence's from row q0 of the (1, H, total, D) output,
    and the TMA store clips at the tensor's end, not the sequence's: 64 rows all inside
    the sequence go through it, a block that crosses the sequence's end stores its rows
    from registers with a row mask (``Out``, the output's address; once per sequence and
    head). The log-sum-exp is (H, total) there.

    ``tail``: () or a head-dim tail's (accumulator, shared slots, descriptor, first
    column), stored the same way beside the main part.

    GROUPED: a decoding call's rows in the caller's layout, off_b the sequence
    (:func:`_tma_tokens`), the log-sum-exp its (B, Hkv G, Nq)."""
    ROWS: gl.constexpr = acc.shape[0]
    l_i = gl.sum(l_part, 1)
    if GUARD:
        l_i = gl.where(l_i == 0.0, 1.0, l_i)
    out = _normalized(acc, l_i, OUT_RCP).to(o_smem.dtype)
    if len(tail) > 0:
        out_t = (_normalized(tail[0], l_i, OUT_RCP).to(o_smem.dtype), tail[1].index(C),
                 tail[2], tail[3])
    else:
        out_t = ()
    if GROUPED:
        _tma_tokens(out, o_smem.index(C), o_desc, off_b, off_h, row0 // ROW_GROUP, EARLY_Q)
    elif VARLEN:
        if row0 + ROWS <= N_Q:
            _tma_out(out, o_smem.index(C), o_desc, off_b, off_h, q0 + row0, EARLY_Q, out_t)
        else:
            _store_rows(out, Out, o_desc, off_h, q0, row0, N_Q, 0)
            if len(tail) > 0:
                _store_rows(out_t[0], Out, tail[2], off_h, q0, row0, N_Q, tail[3])
    else:
        _tma_out(out, o_smem.index(C), o_desc, off_b, off_h, row0, EARLY_Q, out_t)
    if RETURN_LSE:
        rows = row0 + gl.arange(0, ROWS, layout=row_s)
        lse = (m_i + gl.log2(gl.convert_layout(l_i, row_s))) * LN2
        if GROUPED:  # (B, Hkv G, Nq): row r is token r / G of query head off_h G + r % G
            head = off_b.to(gl.int64) * o_desc.shape[2] + off_h
            at = (Lse + (head * ROW_GROUP + rows % ROW_GROUP) * o_desc.shape[1]
                  + rows // ROW_GROUP)
        elif VARLEN:  # (H, total)
            at = Lse + off_h.to(gl.int64) * o_desc.shape[2] + q0 + rows
        else:
            at = Lse + pid_bh.to(gl.int64) * N_Q + rows
        gl.store(at, lse, mask=rows < N_Q)
    if not EARLY_Q:
        tma.store_wait(0)
        mbarrier.arrive(q_empty.index(C), count=1)


@gluon.jit
def _normalized(acc, l_i, OUT_RCP: gl.constexpr):
    """acc / l per row (``l_i`` in any row layout), or times one reciprocal with OUT_RCP."""
    l_o = gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, acc.type.layout)), 1)
    if OUT_RCP:
        return acc * (1.0 / l_o)
    return acc / l_o


@gluon.jit
def _tma_out(out, o_slot, o_desc, off_b, off_h, row, EARLY_Q: gl.constexpr, tail):
    """:func:`_tma_rows` of the main part, then of a ``tail`` ((values, slot, descriptor,
    first column) or ()), whose slot the main part's wait has already covered."""
    _tma_rows(out, o_slot, o_desc, off_b, off_h, row, 0, EARLY_Q)
    if len(tail) > 0:
        _tma_rows(tail[0], tail[1], tail[2], off_b, off_h, row, tail[3], False)


@gluon.jit
def _tma_rows(out, o_slot, o_desc, off_b, off_h, row, col, WAIT: gl.constexpr):
    """``out`` (16-bit [64, width]) to rows [row, row + 64), columns from ``col``, of head
    (off_b, off_h) through shared-memory slot ``o_slot`` and a TMA store; with WAIT the
    slot's previous store must have read it first (EARLY_Q: the slots outlive the
    work tile)."""
    if WAIT:
        tma.store_wait(0)
    o_slot.store(gl.reshape(out, [1, 1, out.shape[0], out.shape[1]]))
    fence_async_shared()
    tma_store(o_desc, [off_b, off_h, row, col], o_slot)


@gluon.jit
def _tma_tokens(out, o_slot, o_desc, b, h, token, WAIT: gl.constexpr):
    """GROUPED: ``out`` (16-bit [64, D]) to tokens [token, token + 64 / G) of kv head
    ``h``'s G query heads in the caller's (B, Nq, Hkv, G, D) output, sequence ``b``,
    through ``o_slot`` (1, 64 / G, 1, G, D) and a TMA store, which clips the tokens past
    Nq; WAIT as :func:`_tma_rows`."""
    if WAIT:
        tma.store_wait(0)
    o_slot.reshape([out.shape[0], out.shape[1]]).store(out)
    fence_async_shared()
    tma_store(o_desc, [b, token, h, 0, 0], o_slot)


@gluon.jit
def _store_rows(out, Out, o_desc, off_h, q0, row0, N_Q, col0):
    """Rows [row0, row0 + 64) of ``out`` (16-bit, the accumulator's layout) below N_Q
    into head off_h of a packed output (1, H, total, D) at ``Out`` from row q0 and
    column ``col0``, with the strides and D of its descriptor ``o_desc``; columns past D
    (the padded head dim) are not stored."""
    layout: gl.constexpr = out.type.layout
    rows = row0 + gl.arange(0, out.shape[0], layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, layout))
    base = Out + off_h.to(gl.int64) * o_desc.strides[1] + q0.to(gl.int64) * o_desc.strides[2]
    at = base + gl.expand_dims(rows * o_desc.strides[2], 1) + gl.expand_dims(cols, 0)
    ok = gl.expand_dims(rows < N_Q, 1) & gl.expand_dims(cols < o_desc.shape[3], 0)
    gl.store(at, out, mask=ok)


@gluon.constexpr_function
def _record_width(head_dim, head_tail):
    """Columns of a workspace record (:func:`_store_part`): the head dim padded to a
    power of two, the width the merge kernel reads."""
    return 2 * head_dim if head_tail else head_dim


@gluon.jit
def _part_cols(rec, acc, col0, WIDTH: gl.constexpr, C: gl.constexpr):
    """Consumer C's rows of ``acc`` (fp32 [64, n]) into columns [col0, col0 + n) of the
    BLOCK_M x WIDTH record at ``rec``."""
    layout: gl.constexpr = acc.type.layout
    rows = C * acc.shape[0] + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
    gl.store(rec + gl.expand_dims(rows, 1) * WIDTH + gl.expand_dims(cols, 0), acc)


@gluon.jit
def _store_part(acc, l_part, m_i, Part, slot, C: gl.constexpr, BLOCK_M: gl.constexpr,
                row_s: gl.constexpr, tail):
    """Consumer C's rows of one piece of a cut row block (SPLIT): O unnormalized (acc
    [64, D] fp32, relative to the rows' running maximum m, base 2, scaled) and (m, l),
    to workspace slot ``slot``: BLOCK_M x WIDTH floats of O (WIDTH: the head dim padded,
    :func:`_record_width`; with a head-dim ``tail``, (accumulator, first column), its
    columns beside the main part's, the padding unwritten), then BLOCK_M (m, l) pairs.
    :func:`flashscope.kernels.attention_merge._merge_parts` combines a block's pieces."""
    ROWS: gl.constexpr = acc.shape[0]
    if len(tail) > 0:
        HEAD_DIM: gl.constexpr = _record_width(acc.shape[1], tail[0].shape[1])
    else:
        HEAD_DIM: gl.constexpr = acc.shape[1]
    rec = Part + slot.to(gl.int64) * (BLOCK_M * (HEAD_DIM + 2))
    _part_cols(rec, acc, 0, HEAD_DIM, C)
    if len(tail) > 0:
        _part_cols(rec, tail[0], tail[1], HEAD_DIM, C)
    ml = rec + BLOCK_M * HEAD_DIM + 2 * (C * ROWS + gl.arange(0, ROWS, layout=row_s))
    gl.store(ml, m_i)
    gl.store(ml + 1, gl.convert_layout(gl.sum(l_part, 1), row_s))
