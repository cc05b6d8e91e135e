"""The work lists of a packed (variable-length) batch, built on the device from the
prefix sums, so the host never waits to read them: the persistent sm_90 forward's
(:func:`_packed_list`) and the order of the Hopper backward's programs
(:func:`_key_list`).

A packed batch's grid is sized by its longest sequence: B x H x cdiv(max_seqlen_q,
BLOCK_M) row blocks, most of them past their own sequence's end when the lengths differ.
:func:`_packed_list` keeps only the row blocks that hold rows (sequence b has
cdiv(n_b, BLOCK_M) of them per head) and deals them to the P programs so that each
program's share costs about the same, with no list scheduling on the device:

- **Longest sequences first.** The list runs through the sequences by the keys their
  last query row sees (:func:`_reach`), most first (ties: more query rows, then batch
  order), then heads, then row blocks. A row block costs the key tiles it visits, so
  the list's costs fall as it goes, and dealing it out in rounds of P, every other round
  backwards (program P - 1 first), pairs each program's heavy entries with light ones:
  the snake order of a longest-first schedule.
- **Causal row blocks in pairs (FOLD).** A causal head's row blocks cost 1, 2, .., n
  tiles; listed folded (the last, the first, the next-to-last, the second, ..) and dealt
  two at a time, each program gets pairs that cost n + 1 whatever the pair. A head of
  odd n that starts on an odd entry lists its middle block first, so that it pairs with
  the previous head's middle one.

Consecutive entries run at the same time, so the row blocks of one head share its K and
V in L2, as the dense grid's do. Why: a list simulation costing each row block by its
key tiles (+1 for its prologue and epilogue; 132 programs; mixed batches drawn by
:func:`flashscope.bench.suite.draw_seqlens`, 40 seeds x 4 length ranges x 3 head counts)
puts the busiest program 1.11-1.34x the mean share on average dealt in batch order one
entry at a time (causal; up to 1.82x), 1.00-1.05x this way, as even as programs taking
the next entry as they finish; on an H100 the mixed causal batches of the varlen suite
ran 1.10x faster (docs/varlen.md).

Layout (int32), the persistent kernel's work-list format
(:func:`flashscope.kernels.sm90_worklist._share`) with four fields more per entry:
``Sched[0 .. P]`` the offsets of each program's share (program p runs slots
``Sched[p] .. Sched[p + 1]`` of the list, in order), then ``L`` slots of tiles (``t = (b H + h)
n_m + m`` in the padded numbering the kernel decodes), then ``L`` slots each of the
sequence's first query row, its query rows, its first key row and its keys. ``L`` is the
padded count B H n_m; the live entries T <= L fill the first T slots of each field.
A decoding call's list may cut each row block along its keys (SPLIT: two fields more,
T slots apart, :func:`_packed_list`).

Program (c, h) of the grid ranks sequences [c BLOCK_B, + BLOCK_B) among all B (BLOCK_B
at a time) and places their head-h entries; program (0, 0) writes the offsets. This
module imports Triton and the kernels' common pieces only.
"""

import triton
import triton.language as tl

from flashscope.kernels.common import launch_next


@triton.jit
def _share_start(p, T, P):
    """Where program p's share of T units starts when they are dealt in rounds of P,
    every other one backwards: T // P each, and one more for the programs the last,
    partial round reaches (the first T % P after an even number of whole rounds, else
    the last T % P)."""
    rounds = T // P
    extra = T % P
    more = tl.where(rounds % 2 == 0, tl.minimum(p, extra), tl.maximum(p - (P - extra), 0))
    return p * rounds + more


@triton.jit
def _dealt_to(u, P):
    """(program, round) unit u is dealt to: rounds of P, every other one backwards."""
    r = u // P
    k = u % P
    return tl.where(r % 2 == 0, k, P - 1 - k), r


@triton.jit
def _entry_start(p, T, P, SPAN: tl.constexpr):
    """Where program p's entries start when the T entries go out in units of SPAN
    consecutive ones (the last unit shorter where SPAN does not divide T: it ends its
    program's share, and the programs after that one start that much earlier)."""
    units = tl.cdiv(T, SPAN)
    last, _ = _dealt_to(units - 1, P)
    return SPAN * _share_start(p, units, P) - tl.where(p > last, units * SPAN - T, 0)


@triton.jit
def _reach(n_q, n_k, TOP_LEFT: tl.constexpr):
    """Keys the last query row of a sequence sees, the list's order (most first): all
    n_k, or min(n_q, n_k) under a top-left causal mask."""
    if TOP_LEFT:
        return tl.minimum(n_q, n_k)
    else:
        return n_k


@triton.jit
def _lengths(CuQ, CuK, Used, ADD, b, ok, N_M, BLOCK_M: tl.constexpr, TOP_LEFT: tl.constexpr,
             USED: tl.constexpr):
    """(first query row, query rows, first key row, keys, row blocks, reach) of sequences
    ``b`` (``ok``: those that exist; the others have no row blocks). A sequence longer
    than the N_M row blocks the grid was sized for keeps N_M (its rows past them are
    not written, as in the portable kernels). USED: sequence b's keys are its first
    Used[b] + ADD (a KV cache's lengths and the keys appended; FlashAttention's
    ``seqused_k``), clamped into the CuK[b + 1] - CuK[b] its slots hold."""
    q0 = tl.load(CuQ + b, mask=ok, other=0)
    n_q = tl.load(CuQ + b + 1, mask=ok, other=0) - q0
    k0 = tl.load(CuK + b, mask=ok, other=0)
    n_k = tl.load(CuK + b + 1, mask=ok, other=0) - k0
    if USED:
        n_k = tl.minimum(tl.maximum(tl.load(Used + b, mask=ok, other=0) + ADD, 0), n_k)
    blocks = tl.minimum(tl.cdiv(n_q, BLOCK_M), N_M)
    return q0, n_q, k0, n_k, blocks, _reach(n_q, n_k, TOP_LEFT)


@triton.jit
def _ranked(CuQ, CuK, Used, ADD, b, n_q, reach, B, H, N_M, BLOCK_M: tl.constexpr,
            BLOCK_B: tl.constexpr, TOP_LEFT: tl.constexpr, USED: tl.constexpr, PIECES=1):
    """(entries ahead of each sequence ``b``, entries of all B sequences) in a list
    holding H x PIECES entries per row block of each sequence (:func:`_lengths`, whose
    ``n_q`` and ``reach`` for ``b`` these are), the sequences by reach, most first, then
    by query rows, then in batch order: each sequence is ranked against all B at once,
    BLOCK_B at a time."""
    start = tl.zeros([BLOCK_B], tl.int32)
    T = 0
    for b0 in range(0, B, BLOCK_B):
        o = b0 + tl.arange(0, BLOCK_B)
        o_ok = o < B
        _, o_q, _, _, o_blocks, o_reach = _lengths(CuQ, CuK, Used, ADD, o, o_ok, N_M,
                                                   BLOCK_M, TOP_LEFT, USED)
        ahead = (o_reach[None, :] > reach[:, None]) | (
            (o_reach[None, :] == reach[:, None])
            & ((o_q[None, :] > n_q[:, None])
               | ((o_q[None, :] == n_q[:, None]) & (o[None, :] < b[:, None]))))
        entries = tl.where(o_ok, o_blocks * (H * PIECES), 0)
        start += tl.sum(tl.where(ahead, entries[None, :], 0), 1)
        T += tl.sum(entries, 0)
    return start, T


@triton.jit
def _row_block(i, blocks, odd_start, FOLD: tl.constexpr):
    """The row block a head lists i-th: i itself, or with FOLD the last, the first, the
    next-to-last, the second, ..; a head of odd ``blocks`` that starts on an odd entry
    lists its middle block first."""
    if FOLD:
        rotate = (odd_start & (blocks % 2 == 1)).to(tl.int32)
        j = i - rotate
        m = tl.where(j % 2 == 0, blocks - 1 - j // 2, j // 2)
        return tl.where((rotate == 1) & (i == 0), (blocks - 1) // 2, m)
    else:
        return i


@triton.jit
def _packed_list(CuQ, CuK, Used, ADD, Sched, B, H, N_M, P, L, PIECES, BLOCK_M: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr, FOLD: tl.constexpr,
                 TOP_LEFT: tl.constexpr, USED: tl.constexpr, SPLIT: tl.constexpr = False,
                 EARLY: tl.constexpr = False):
    """Grid (cdiv(B, BLOCK_B), H): program (c, h) places the head-h entries of sequences
    [c BLOCK_B, + BLOCK_B). FOLD: causal row blocks folded and dealt in pairs;
    TOP_LEFT: a top-left causal mask (rows see min(n_q, n_k) keys at most); USED: each
    sequence's keys in use are Used[b] + ADD (:func:`_lengths`; unread otherwise).

    SPLIT (not with FOLD): each row block is PIECES consecutive entries, piece j of its
    key tiles (``j | PIECES << 16``, which the kernel turns into positions,
    :func:`flashscope.kernels.sm90_worklist._range`) writing workspace slot t PIECES + j,
    the two fields after the sequence's four. The fields are then T slots apart (T: the
    live entries, ``Sched[P]``, which the kernel reads as a host list's length), not L:
    the host sizes the list by PIECES but not the live entries, which only the device
    knows.

    EARLY (a GPU's launch): the kernel queued next, launched with programmatic stream
    serialization (a KV cache's forward), may start at once: it waits for this one's
    writes itself (``griddepcontrol.wait``), and starting it here hides its launch and
    set-up under this kernel."""
    SPAN: tl.constexpr = 2 if FOLD else 1  # consecutive entries a program is dealt
    tl.static_assert(not (SPLIT and FOLD), "SPLIT: row blocks are not folded")
    c = tl.program_id(0)
    h = tl.program_id(1)
    launch_next(c, EARLY)
    b = c * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = b < B
    q0, n_q, k0, n_k, blocks, reach = _lengths(CuQ, CuK, Used, ADD, b, ok, N_M, BLOCK_M,
                                               TOP_LEFT, USED)
    pieces = PIECES if SPLIT else 1
    start, T = _ranked(CuQ, CuK, Used, ADD, b, n_q, reach, B, H, N_M, BLOCK_M, BLOCK_B,
                       TOP_LEFT, USED, pieces)
    if SPLIT:
        L = T
    per_head = blocks * pieces
    first = start + h * per_head  # this head's first entry, per sequence
    for i0 in range(0, tl.max(per_head, 0), BLOCK_E):
        i = i0 + tl.arange(0, BLOCK_E)[None, :]
        live = ok[:, None] & (i < per_head[:, None])
        e = first[:, None] + i
        if SPLIT:
            m = i // pieces
        else:
            m = _row_block(i, blocks[:, None], first[:, None] % 2 == 1, FOLD)
        p, r = _dealt_to(e // SPAN, P)
        at = P + 1 + _entry_start(p, T, P, SPAN) + SPAN * r + e % SPAN
        t = (b[:, None] * H + h) * N_M + m
        tl.store(Sched + at, t, mask=live)
        tl.store(Sched + at + L, q0[:, None], mask=live)
        tl.store(Sched + at + 2 * L, n_q[:, None], mask=live)
        tl.store(Sched + at + 3 * L, k0[:, None], mask=live)
        tl.store(Sched + at + 4 * L, n_k[:, None], mask=live)
        if SPLIT:
            j = i % pieces
            tl.store(Sched + at + 5 * L, j | (pieces << 16), mask=live)
            tl.store(Sched + at + 6 * L, t * pieces + j, mask=live)
    if (c == 0) & (h == 0):
        for p0 in range(0, P + 1, BLOCK_E):
            pp = p0 + tl.arange(0, BLOCK_E)
            tl.store(Sched + pp, _entry_start(pp, T, P, SPAN), mask=pp <= P)


@triton.jit
def _key_list(CuQ, CuK, List, B, HKV, N_N, L, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
              BLOCK_E: tl.constexpr, SECTION: tl.constexpr):
    """The program order of the Hopper backward on a packed batch: ``List[e]`` = (b HKV +
    h) N_N + n, key tile n of kv head h of sequence b, for the grid's program e; -1 in the
    slots from the T live entries to L. A grid sized by the longest sequence (B HKV N_N
    programs) would launch the key tiles past each shorter sequence's end, and launch
    the sequences in batch order; here each sequence has its min(cdiv(n_k, BLOCK_N), N_N)
    key tiles per kv head, the sequences by query rows, most first (ties: more keys, then
    batch order), as every key tile of a sequence visits its query rows (under a causal
    mask key tile n visits those from n on, so a sequence's first tiles cost most).
    Within a sequence, heads one after another, key tile by key tile within a head (they
    share its Q and dO in L2); SECTION > 0 (causal): sections of SECTION heads, key tile
    by key tile within a section, so its longest programs start first, as the dense
    grid's sections do. Grid (cdiv(B, BLOCK_B), HKV): program (c, h) places the head-h
    entries of sequences [c BLOCK_B, + BLOCK_B); program (0, 0) fills the slots past T."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    b = c * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = b < B
    # the forward's ranking with the roles of queries and keys swapped: key tiles take
    # the place of row blocks, and the reach of a sequence is its query rows
    _, n_k, _, _, tiles, reach = _lengths(CuK, CuQ, CuK, 0, b, ok, N_N, BLOCK_N, False,
                                          False)
    start, T = _ranked(CuK, CuQ, CuK, 0, b, n_k, reach, B, HKV, N_N, BLOCK_N, BLOCK_B,
                       False, False)
    if SECTION > 0:
        sec = h // SECTION
        width = tl.minimum(HKV - sec * SECTION, SECTION)
        first = start + sec * SECTION * tiles + h % SECTION  # key tile n at first + n width
    else:
        width = 1
        first = start + h * tiles
    for n0 in range(0, tl.max(tiles, 0), BLOCK_E):
        n = n0 + tl.arange(0, BLOCK_E)[None, :]
        tl.store(List + first[:, None] + n * width, (b[:, None] * HKV + h) * N_N + n,
                 mask=ok[:, None] & (n < tiles[:, None]))
    if (c == 0) & (h == 0):
        for e0 in range(T, L, BLOCK_E):
            e = e0 + tl.arange(0, BLOCK_E)
            tl.store(List + e, -1, mask=e < L)
