"""The work list of a packed (variable-length) batch for the persistent sm_90 forward,
built on the device from the prefix sums, so the host never waits to read them.

A packed batch's grid is sized by its longest sequence: B x H x cdiv(max_seqlen_q,
BLOCK_M) row blocks, most of them past their own sequence's end when the lengths differ.
:func:`_packed_list` keeps only the row blocks that hold rows (sequence b has
cdiv(n_b, BLOCK_M) of them per head) and deals them to the P programs in rounds of P, in
sequence order, then head, then row block (with HEAVY_FIRST the last row block of a head
first: a causal block's cost grows with its index). Consecutive entries run at the same
time, so the row blocks of one head share its K and V in L2, as the dense grid's do.
Every other round is dealt backwards (program P - 1 first): dealt forwards only, a
program gets the same row block of every head whenever P is a multiple of the blocks a
head has (132 programs, 22 causal blocks a head: the program holding the last blocks
ran twice the average, and the batch took 1.9 times as long), where going back and forth
pairs each program's heavy blocks with light ones.

Layout (int32), the persistent kernel's work-list format
(:func:`flashscope.kernels.sm90_worklist._share`) with four fields more per entry:
``Sched[0 .. P]`` the offsets of each program's share (program p runs slots
``Sched[p] .. Sched[p + 1]`` of the list, in order), then ``L`` slots of tiles (``t = (b H + h)
n_m + m`` in the padded numbering the kernel decodes), then ``L`` slots each of the
sequence's first query row, its query rows, its first key row and its keys. ``L`` is the
padded count B H n_m; the live entries T <= L fill the first T slots of each field.

Every program of the grid counts the live row blocks of all sequences (BLOCK_B at a
time) and places its own BLOCK_E entries; program 0 writes the offsets. This module
imports Triton only.
"""

import triton
import triton.language as tl


@triton.jit
def _share_start(p, T, P):
    """Where program p's share of T entries starts when they are dealt in rounds of P,
    every other one backwards: T // P each, and one more for the programs the last,
    partial round reaches (the first T % P after an even number of whole rounds, else
    the last T % P)."""
    rounds = T // P
    extra = T % P
    more = tl.where(rounds % 2 == 0, tl.minimum(p, extra), tl.maximum(p - (P - extra), 0))
    return p * rounds + more


@triton.jit
def _entries(e, CuQ, CuK, B, H, N_M, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr,
             HEAVY_FIRST: tl.constexpr):
    """(T, sequence, head, row block, q0, n_q, k0, n_k) of entries ``e`` of the list in
    sequence, head, row-block order (T: the live entries; the fields of entries e >= T
    are unread). A sequence longer than the N_M row blocks the grid was sized for keeps
    N_M (its rows past them are not written, as in the portable kernels)."""
    seq = tl.zeros(e.shape, tl.int32)  # sequences that end at or before entry e
    before = tl.zeros(e.shape, tl.int32)  # live entries of those sequences
    T = 0
    for b0 in range(0, B, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        ok = b < B
        n = tl.load(CuQ + b + 1, mask=ok, other=0) - tl.load(CuQ + b, mask=ok, other=0)
        ends = T + tl.cumsum(tl.minimum(tl.cdiv(n, BLOCK_M), N_M) * H, 0)
        past = ends[None, :] <= e[:, None]
        seq += tl.sum(past.to(tl.int32), 1)
        before = tl.maximum(before, tl.max(tl.where(past, ends[None, :], 0), 1))
        T = tl.max(ends, 0)
    live = e < T
    s = tl.minimum(seq, B - 1)
    q0 = tl.load(CuQ + s, mask=live, other=0)
    n_q = tl.load(CuQ + s + 1, mask=live, other=0) - q0
    k0 = tl.load(CuK + s, mask=live, other=0)
    n_k = tl.load(CuK + s + 1, mask=live, other=0) - k0
    blocks = tl.minimum(tl.maximum(tl.cdiv(n_q, BLOCK_M), 1), N_M)
    local = e - before
    h = local // blocks
    m = local % blocks
    if HEAVY_FIRST:
        m = blocks - 1 - m
    return T, s, h, m, q0, n_q, k0, n_k


@triton.jit
def _packed_list(CuQ, CuK, Sched, B, H, N_M, P, L, BLOCK_M: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr, HEAVY_FIRST: tl.constexpr):
    """Grid (cdiv(L, BLOCK_E),): program i places live entries [i BLOCK_E, + BLOCK_E)."""
    pid = tl.program_id(0)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E)
    T, s, h, m, q0, n_q, k0, n_k = _entries(e, CuQ, CuK, B, H, N_M, BLOCK_M, BLOCK_B,
                                            HEAVY_FIRST)
    live = e < T
    r = e // P
    p = tl.where(r % 2 == 0, e % P, P - 1 - e % P)
    at = P + 1 + _share_start(p, T, P) + r
    tl.store(Sched + at, (s * H + h) * N_M + m, mask=live)
    tl.store(Sched + at + L, q0, mask=live)
    tl.store(Sched + at + 2 * L, n_q, mask=live)
    tl.store(Sched + at + 3 * L, k0, mask=live)
    tl.store(Sched + at + 4 * L, n_k, mask=live)
    if pid == 0:
        for p0 in range(0, P + 1, BLOCK_E):
            pp = p0 + tl.arange(0, BLOCK_E)
            tl.store(Sched + pp, _share_start(pp, T, P), mask=pp <= P)
