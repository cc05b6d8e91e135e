"""Pieces every Triton kernel body here shares: the log constants, the masked tile load,
the logit cap, the score scaling, the online-softmax step, and where a (batch, head)'s rows
start in a dense or packed tensor.

Packed (variable-length) batches follow FlashAttention's layout: the sequences of a batch
lie one after another along one axis of (total, H, D) tensors, and ``cu_seqlens`` (B + 1,
int32 prefix sums) says where each starts. A program finds its sequence's start and length
from the prefix sums on the device (:func:`sequence`); its rows are then addressed as a
dense sequence of that length (:func:`seq_base`), and its per-row vectors (log-sum-exp,
delta) as (H, total) (:func:`row_start`). With ``VARLEN`` off the same calls give the dense
(B, H, N, D) addresses, with the sequence start a constant 0.

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
def launch_next(x, EARLY: tl.constexpr):
    """With EARLY (an sm_90+ GPU's launch): let the kernel queued after this one start
    now (``griddepcontrol.launch_dependents``); it was launched with programmatic stream
    serialization and waits for this one's writes itself (:func:`wait_previous`). ``x``:
    a dummy operand (inline asm takes and returns values)."""
    if EARLY:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r,r",
                                  [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def wait_previous(x, EARLY: tl.constexpr):
    """With EARLY: wait for the kernels queued before this one to finish and their
    writes to be visible (``griddepcontrol.wait``), the first thing a kernel launched
    with programmatic stream serialization (Triton's ``launch_pdl``) does before it
    reads or writes memory; its launch then overlaps the kernel before it."""
    if EARLY:
        tl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [x],
                                  dtype=tl.int32, is_pure=False, pack=1)


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


@triton.jit
def scaled_scores(qk, qk_scale, cap_in, cap_out, SOFTCAP: tl.constexpr):
    """Raw scores q . k in the exp2 domain: qk * scale * log2(e), or capped
    (:func:`softcapped`) with SOFTCAP."""
    if SOFTCAP:
        s, _ = softcapped(qk, cap_in, cap_out)
    else:
        s = qk * qk_scale
    return s


@triton.jit
def softmax_step(s, m_i, l_i, GUARD: tl.constexpr):
    """One online-softmax step over a tile of scores ``s`` (exp2 domain, -inf where
    masked) for rows with running maximum ``m_i`` and sum ``l_i``: returns (p, alpha,
    m_new, l_new), p = 2^(s - m_new) and alpha = 2^(m_i - m_new), the factor the row's
    earlier sums and outputs are rescaled by. GUARD: a row that has seen no key yet (its
    maximum still -inf) subtracts 0 instead of -inf, so its p and alpha are 0, not NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = m_new
    if GUARD:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def sequence(CuSeqlens, b, N, VARLEN: tl.constexpr):
    """(start, length) of sequence ``b``: from the prefix sums CuSeqlens[b], CuSeqlens[b + 1]
    of a packed batch (VARLEN), else (0, N)."""
    if VARLEN:
        start = tl.load(CuSeqlens + b)
        n = tl.load(CuSeqlens + b + 1) - start
    else:
        start = 0
        n = N
    return start, n


@triton.jit
def sequences(CuSeqQ, CuSeqK, b, N_Q, N_K, OFFSET, VARLEN: tl.constexpr,
              SHIFTED: tl.constexpr):
    """(q_start, n_q, k_start, n_k, OFFSET) of sequence ``b``: where its rows and keys
    start and how many there are (:func:`sequence`), and the mask's OFFSET, which a packed
    batch's bottom-right alignment (SHIFTED) takes from the sequence's own lengths,
    n_k - n_q (as given otherwise)."""
    q_start, n_q = sequence(CuSeqQ, b, N_Q, VARLEN)
    k_start, n_k = sequence(CuSeqK, b, N_K, VARLEN)
    if VARLEN and SHIFTED:
        OFFSET = n_k - n_q
    return q_start, n_q, k_start, n_k, OFFSET


@triton.jit
def seq_base(Ptr, off_b, off_h, start, stride_b, stride_h, stride_n, VARLEN: tl.constexpr):
    """The address of row 0 of head ``off_h`` of sequence ``off_b``: Ptr + b stride_b + h
    stride_h in a dense tensor; in a packed one (VARLEN), the sequence's first row
    ``start`` of the packed axis (stride_n) instead of a batch offset."""
    if VARLEN:
        return Ptr + start.to(tl.int64) * stride_n + off_h * stride_h
    else:
        return Ptr + off_b * stride_b + off_h * stride_h


@triton.jit
def in_units(stride_b, stride_h, stride_n, UNIT: tl.constexpr):
    """A tensor's batch, head and row strides as multiples of UNIT elements, which the
    host found them to be (:func:`flashscope.families.base.row_unit`; UNIT = 1: as they
    are). Triton's binder tells the compiler only whether an integer is a multiple of 16:
    a row of 72 or 136 two-byte elements, 16 bytes a multiple, then reads as single
    elements (sm_90, the backward's delta launch at D = 136: 256 two-byte loads a thread
    where D = 144 takes 32 of 16 bytes; the portable forward 105 registers spilled on
    sm_80). ``(s // UNIT) * UNIT`` is ``s`` and carries the divisibility."""
    if UNIT > 1:
        return (stride_b // UNIT) * UNIT, (stride_h // UNIT) * UNIT, (stride_n // UNIT) * UNIT
    else:
        return stride_b, stride_h, stride_n


@triton.jit
def row_start(pid_bh, off_h, start, N, VARLEN: tl.constexpr):
    """The offset of row 0 of (batch, head) ``pid_bh`` in a per-row fp32 vector
    (log-sum-exp, delta): contiguous (B, H, N) dense, (H, total) packed (N = total
    there)."""
    if VARLEN:
        return off_h * N + start
    else:
        return pid_bh.to(tl.int64) * N
