"""FlashAttention forward for Hopper (sm_90), written in Gluon: the one variant that differs.

The maths is :mod:`flashscope.kernels.attention_fwd`'s (base-2 online softmax, fp32
accumulator, one division at the end, natural-log LSE). What differs is who schedules the
tensor cores. Triton 3.6 waits for *every* outstanding wgmma group at the first use of the
rescaled accumulator, so the next tile's QK^T cannot run under this tile's softmax (17-30%
slower where it was tried, docs/experiments.md). Gluon states the schedule
explicitly, as FlashAttention-3 does (Shah et al., 2024, "intra-warpgroup overlap"):

    S_0 = Q K_0^T;  P_0, m_0, l_0 = softmax(S_0)
    for j = 1 .. T-1:
        issue  S_j  = Q K_j^T                (wgmma, async, group 1)
        issue  O   += P_{j-1} V_{j-1}        (wgmma, async, group 2, P from registers)
        wait   until <= 1 group in flight    -> S_j is ready, the PV product still runs
        m_j = max(m_{j-1}, rowmax S_j);  P_j = 2^(S_j c - m_j);  a_j = 2^(m_{j-1} - m_j)
        l_j = a_j l_{j-1} + rowsum P_j
        wait   until 0 groups in flight      -> release K/V stage j-1 to the producer
        O   *= a_j
    O += P_{T-1} V_{T-1};  out = O / l_{T-1}

so the exponentials of tile j can overlap the P V product of tile j-1 on the tensor
cores. With RESCALE_TAU = t > 0 a row keeps m_{j-1} unless m_j exceeds it by more than t
(base 2): P_j = 2^(S_j c - m) then stays below 2^t, the sums and O are exact in the kept
maximum, and a_j = 1, so the O *= a_j above is skipped by every warp none of whose rows
moved that far (:func:`_lazy_rescale`). After the first few key tiles of a row that is
nearly every tile: at D = 128 it takes 64 FMULs per thread out of the tile's tail.

The ptxas in Triton 3.6's wheel (CUDA 12.8) places the ``wait(0)`` as early as its
block allows, ahead of the whole softmax. The consumer stores the row maxima to shared
memory just before the wait (:func:`_pin`), which ptxas keeps in order: the max reduction
runs under the product and the exponentials after its wait, the order FlashAttention-4's
Hopper kernel compiles to (pinning the exponentials too, FlashAttention-3's order, and
pinning nothing both measured slower; docs/experiments.md).

Warps: a producer partition issues TMA copies of K and V tiles into a ring of STAGES
shared-memory slots (``k_ready``/``v_ready`` mbarriers carry the bytes in, ``v_empty``
hands a slot back once its P V has completed; with K_EARLY, ``k_empty`` hands back the
K half as soon as its Q K^T has, so a 2-stage ring prefetches like a deeper one); one
consumer warpgroup per 64 query rows runs the loop above. Each
warpgroup issues its own wgmma on its 64 rows, so the warpgroups interleave on the tensor
cores without any barrier. Where they sit (:func:`_attn_fwd_sm90`): with one or two
consumers, consumer 0 is the default partition and the producer a one-warp worker; with
three (160 registers each) the producer takes the default partition and every consumer is
a worker, because ptxas fits a consumer into 160 registers as a worker but not as the
default partition, which keeps the kernel's arguments live beside the loop (D = 64,
192 x 128: 38 spilled registers at 168 in the default partition, 0 as workers). A paged
cache of pages smaller than a key tile (a copy a page) adds a second one-warp worker
that brings V (LOADERS = 2): one warp issuing every copy of a 16-key page's tile held
the reads to 0.94-0.96 of the dense speed on the same memory.

Each consumer's Q slot is loaded once per work tile. Without EARLY_Q it also stages the
output for its TMA store, so the next Q can load only after that store has read it: on
short rows (4.5 key tiles per causal row block at N = 1024) that Q load is exposed once
per work tile. EARLY_Q gives the output a slot of its own and hands Q back at the work
tile's last Q K^T, so the next Q arrives under the last P V and the epilogue.
With Q_REGS (``Sm90FwdConfig.Q_IN_REGS``) each consumer loads its Q slot into
registers once per work tile (the wgmma A-operand layout, D / 4 registers per thread)
and every Q K^T takes Q from there: a key tile then reads only K and V from shared
memory (at D = 128, 192 instead of 224 KB per SM and key tile, TMA writes included,
against the 128 bytes a clock shared memory delivers), and with EARLY_Q the slot goes
back after the first Q K^T.

Descriptors are rank 4, over (B, H, N, D) with the caller's strides and block
(1, 1, rows, D): TMA zero-fills rows past N of *this* head, so a partial tile never reads
another head, and the output store clips rows past N_Q. Scores of keys >= N_K (and above
the causal diagonal) are set to -inf; the zero-filled V rows there contribute 0. A work
tile's key tiles are loaded and consumed in order, or with MASKED_FIRST masked ones first
(:func:`_key_tile`), so that each consumer masks at most its first tile and the loop body
above carries no mask.

A band (a sliding window, or bottom-right alignment with Nq != Nk: HAS_LEFT, HAS_RIGHT,
SHIFTED) starts each work tile at the first key tile its rows see
(:func:`~flashscope.kernels.sm90_worklist._work`, the shared key-range helper), runs
round robin without MASKED_FIRST, and has each consumer compute only the tiles its own
rows see and mask only those its band's edges cross
(:func:`~flashscope.kernels.sm90_worklist._band_own`); rows that have seen no key keep
their maximum at 0 and store zeros (:func:`_row_max`). SOFTCAP caps each score tile as c
tanh(s / c) in the exp2 domain before the mask. All of it compiles away without its
switch.

Shapes: Q (B, H, Nq, D), K and V (B, Hkv, Nk, D), H % Hkv == 0, Out (B, H, Nq, D), Lse
(B, H, Nq) fp32. Gluon's tiles are powers of two wide, so a head dim D = HEAD_DIM +
HEAD_TAIL between two of them (D = 80 as 64 + 16, 96 as 64 + 32, 160 as 128 + 32) runs as
two column parts: a second set of descriptors (``Tail``: block (1, 1, rows, HEAD_TAIL),
loaded and stored at column HEAD_DIM), their own shared-memory tiles, two wgmma per
Q K^T (the tail accumulating onto the scores) and a second accumulator for the tail's
P V. A D padded to one power of two instead pays its padded width in every product (96
as 128: a third more MMA work); with HEAD_TAIL = 0 none of the tail is built.

A packed batch (VARLEN) is one "batch" of (1, H, total, D) tensors: each work tile comes
from a list built on the device (:mod:`flashscope.kernels.packed_worklist`) with its
sequence's first rows and lengths, which stand for N_Q and N_K (:func:`~flashscope.
kernels.sm90_worklist._sequence`); tiles load from the sequence's first row, a tile past
its end reads the next sequence's rows (masked: keys past N_K are -inf), and the output
slab that crosses the end stores from registers with a row mask (:func:`_store_out`).
A decoding call runs here too (:mod:`flashscope.kvcache`, wide rows): each sequence a
kv head's G query heads times its new tokens packed as rows (ROW_GROUP = G, G rows a
position) against its cache's keys in use (CACHE: a work tile's key count is the
sequence's length, not the room the cache keeps it; the V rows past it, which may hold
anything, are zeroed before a product reads them). Where its grid has a program for each
row block (or piece of one), a program finds its own from its index and the cache's
lengths, with no list; the kernel starts under the one before it (launched with
programmatic stream serialization) and waits for it before any partition reads memory.
Where G divides 64 (GROUPED) its q and
output stay in the caller's (B, Nq, H, D): their descriptors are rank 5 over (B, Nq, Hkv,
G, D), a 64-row block being 64 / G tokens' G heads, the same tile in shared memory.

Each program reads its work list one tile ahead and divides tile indices by multipliers
the host computed (``_divmod``): at N = 1024 the list's global loads and two integer
divisions otherwise sat between one work tile's output and the next one's first product.
A ``TRACE = R`` build stamps the SM clock at fixed points of each work tile (``_stamp``;
:mod:`flashscope.profile.timeline` reads them);
with TRACE = 0 the stamps compile away.

Four modules hold the pieces: :mod:`~flashscope.kernels.sm90_worklist` (which work
tiles a program runs and what each covers), :mod:`~flashscope.kernels.sm90_softmax`
(masking, exponentials, the P operand, the rescale), :mod:`~flashscope.kernels.sm90_sync`
(ring slots, hand-backs, wgmma turns) and :mod:`~flashscope.kernels.sm90_epilogue` (the
output: through TMA, or for a packed sequence's last slab from registers; with SPLIT a
cut block's partial). This file reads top down: the knobs the partitions share
(``Knobs``, one argument: the entry's constexprs bundled), partition sizes
(``_worker_*``), the clock stamps (``_stamp``), the producer (``_load_rows``,
``_load_kv``, ``_producer``), the head-dim tail's operands (``_tail_*``, ``_scores``),
``_consumer``, and the kernel ``_attn_fwd_sm90``, which allocates the shared memory and
barriers and starts the partitions.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.language.nvidia.hopper.tma import tensor_descriptor

from flashscope.compat import aggregate, tma_load
from flashscope.kernels.common import softcapped
from flashscope.kernels.sm90_epilogue import _store_out, _store_part
from flashscope.kernels.sm90_softmax import (
    _masked,
    _p_operand,
    _quad_sums,
    _rescaled,
    _row_max,
    _zero_past,
)
from flashscope.kernels.sm90_sync import (
    _acquire,
    _grid_launch_next,
    _grid_wait,
    _next_slot,
    _pass_tiles,
    _pass_turn,
    _pin,
    _release,
    _scores_done,
    _take_turn,
)
from flashscope.kernels.sm90_worklist import (
    _band_own,
    _key_tile,
    _own_tiles,
    _range,
    _sequence,
    _share,
    _tile,
    _work,
)


# -- what the partitions share: knobs, tail operands, sizes, clock stamps ------------------

@aggregate
class Knobs:
    """The kernel's compile-time knobs, carried into its partitions as one argument (the
    entry's constexprs of the same names; CONSUMERS = BLOCK_M / 64)."""

    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    HEAD_DIM: gl.constexpr
    HEAD_TAIL: gl.constexpr
    STAGES: gl.constexpr
    CONSUMERS: gl.constexpr
    IS_CAUSAL: gl.constexpr
    RETURN_LSE: gl.constexpr
    LPT: gl.constexpr
    PINGPONG: gl.constexpr
    RESCALE_TAU: gl.constexpr
    EARLY_Q: gl.constexpr
    K_EARLY: gl.constexpr
    MASKED_FIRST: gl.constexpr
    OUT_RCP: gl.constexpr
    Q_REGS: gl.constexpr
    SPLIT: gl.constexpr
    TRACE: gl.constexpr
    HAS_LEFT: gl.constexpr
    HAS_RIGHT: gl.constexpr
    SHIFTED: gl.constexpr
    SOFTCAP: gl.constexpr
    VARLEN: gl.constexpr
    ROW_GROUP: gl.constexpr
    CACHE: gl.constexpr
    PAGE: gl.constexpr
    GROUPED: gl.constexpr
    LOADERS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, **knobs):
        for name, value in knobs.items():
            setattr(self, name, gl.constexpr(value))


@aggregate
class Tail:
    """A head-dim tail's TMA descriptors (blocks (1, 1, rows, HEAD_TAIL)) and shared
    tiles: Q's slots, the K and V rings and the output's slots, carried into the
    partitions as one argument (``()`` without a tail)."""

    q_desc: tensor_descriptor
    k_desc: tensor_descriptor
    v_desc: tensor_descriptor
    o_desc: tensor_descriptor
    q_smem: gl.shared_memory_descriptor
    k_smem: gl.shared_memory_descriptor
    v_smem: gl.shared_memory_descriptor
    o_smem: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, o_smem):
        self.q_desc, self.k_desc, self.v_desc, self.o_desc = q_desc, k_desc, v_desc, o_desc
        self.q_smem, self.k_smem, self.v_smem, self.o_smem = q_smem, k_smem, v_smem, o_smem


@gluon.constexpr_function
def _worker_warps(consumers, loaders=1):
    """Warps of each worker partition: with three consumers all of them (4 each; the
    producer is the default partition), else consumers 1.. (4 each), then the producer (1)
    (and with two loaders the value loader, 1)."""
    if consumers == 3:
        return [4] * 3
    return [4] * (consumers - 1) + [1] * loaders


@gluon.constexpr_function
def _worker_regs(consumers, consumer_regs, producer_regs, loaders=1):
    """setmaxnreg budget of each worker partition, in :func:`_worker_warps` order (the
    default partition gets what is left of the 64K registers)."""
    if consumers == 3:
        return [consumer_regs] * 3
    return [consumer_regs] * (consumers - 1) + [producer_regs] * loaders


@gluon.jit
def _stamp(Trace, pid, part: gl.constexpr, r, slot: gl.constexpr, TRACE: gl.constexpr,
           value=None):
    """With TRACE = R > 0, Trace[pid, part, r, slot] (int64 [P, 4, R, 8]) = the SM's
    clock64 now, or ``value``; work tiles r >= R are not recorded. part: the consumer,
    3 the producer. The clock read is volatile, so ptxas keeps it in program order; the
    stores are fire-and-forget. :mod:`flashscope.profile.timeline` reads the buffer."""
    if TRACE > 0:
        if value is None:
            value = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [pid],
                                              dtype=gl.int64, is_pure=False, pack=1)
        at = ((pid * 4 + part) * TRACE + r) * 8 + slot
        gl.store(Trace + at, value.to(gl.int64), mask=r < TRACE)


# -- the producer --------------------------------------------------------------------------

@gluon.jit
def _load_rows(desc, smem, ready, off_b, off_h, row, tail):
    """Rows [row, row + block) of head (off_b, off_h) into ``smem`` (and with a ``tail``,
    (descriptor, shared tile, first column), its columns into the tail's tile), all
    signalling ``ready``."""
    if len(tail) > 0:
        mbarrier.expect(ready, desc.block_type.nbytes + tail[0].block_type.nbytes)
    else:
        mbarrier.expect(ready, desc.block_type.nbytes)
    tma_load(desc, [off_b, off_h, row, 0], ready, smem)
    if len(tail) > 0:
        tma_load(tail[0], [off_b, off_h, row, tail[2]], ready, tail[1])


@gluon.jit
def _load_tokens(desc, smem, ready, b, h, token):
    """GROUPED: 64 rows of kv head ``h`` of sequence ``b`` from the caller's q (B, Nq,
    Hkv, G, D): tokens [token, token + 64 / G), their G query heads each (TMA zero-fills
    the tokens past Nq)."""
    mbarrier.expect(ready, desc.block_type.nbytes)
    tma_load(desc, [b, token, h, 0, 0], ready, smem)


@gluon.constexpr_function
def _row_slots(n, width, grouped, group):
    """The shape of ``n`` shared-memory slots of 64 rows x ``width`` as the Q and output
    descriptors' blocks take them: (1, 1, 64, width), or with ``grouped`` (1, 64 / G, 1,
    G, width), 64 / G query tokens of G heads in the caller's (B, Nq, Hkv, G, D). Both
    are the same 64 x width tile in memory."""
    n, width, group = int(n), int(width), int(group)
    if grouped:
        return [n, 1, 64 // group, 1, group, width]
    return [n, 1, 1, 64, width]


@gluon.constexpr_function
def _page_rows(page, block_n):
    """Rows one TMA copy of a paged cache brings: a page, or a key tile of a larger one."""
    return min(int(page), int(block_n))


@gluon.jit
def _load_kv(desc, smem, ready, empty, off_b, off_hkv, k0, j, g,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, tail, pages=(),
             PAGE: gl.constexpr = 0):
    """Key (or value) tile j of this work tile (rows from k0: a packed sequence's first
    key, else 0) into slot g % STAGES of its ring (g counts every tile this program
    loaded). The slot's use number g // STAGES first waits for
    release number g // STAGES - 1 on ``empty``: the K ring's own barriers with K_EARLY
    (a K slot goes back when its Q K^T completes), else the V ring's (K and V together,
    when the P V completes; the V load's wait then passes at once). ``tail``: () or the
    tail's (descriptor, ring, first column).

    PAGE > 0 (a paged KV cache; ``pages``: the sequence's row of the block table and its
    columns): the tile's keys come a page (or a tile of a larger page) at a time, each
    copy to the rows of the slot it fills, from the row the table names. A column past
    the table's reads its last one: its keys lie past the sequence's, masked and (their
    values) zeroed like a dense cache's spare slots; a page index out of range reads as
    zeros (TMA fills rows outside the tensor)."""
    s = g % STAGES
    _acquire(empty, s, (g // STAGES + 1) & 1, g >= STAGES)
    if PAGE > 0:
        SUB: gl.constexpr = _page_rows(PAGE, BLOCK_N)
        slot = smem.index(s)
        mbarrier.expect(ready.index(s), desc.block_type.nbytes * (BLOCK_N // SUB))
        for i in gl.static_range(BLOCK_N // SUB):
            key = j * BLOCK_N + i * SUB
            page = gl.load(pages[0] + gl.minimum(key // PAGE, pages[1] - 1))
            tma_load(desc, [off_b, off_hkv, page * PAGE + key % PAGE, 0], ready.index(s),
                     slot.slice(i * SUB, SUB, dim=2))
    else:
        if len(tail) > 0:
            tail = (tail[0], tail[1].index(s), tail[2])
        _load_rows(desc, smem.index(s), ready.index(s), off_b, off_hkv, k0 + j * BLOCK_N,
                   tail)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
              v_ready, k_empty, v_empty, Sched, pid, nprog, total, n_m, H, GROUP, N_Q, N_K,
              Div, Band, Trace, T, Pages, Cache, K, ROLE: gl.constexpr = 0):
    """One warp; TMA copies land in issue order, so the order is what the consumers wait
    for: Q first (queued behind a ring of K/V tiles it took 30% at N = 1024), then K0, V0,
    K1, ... From the second work tile on, K0 goes before Q: it needs only a ring slot,
    which frees while the
    consumers finish the previous tile, whereas Q's slot waits for that tile's output
    store. With SPLIT a work tile loads the positions of its key range only; with a band
    the key tiles from the band's first (:func:`_work`). With VARLEN the rows are a
    packed sequence's (:func:`_sequence`). With a head-dim tail every copy also brings its
    tile's tail columns (:func:`_load_rows`). With PAGE, K and V come through the block
    table (``Pages``: its address, row stride and columns; :func:`_load_kv`). With two
    LOADERS, ROLE 0 brings Q and K and ROLE 1 (a warp of its own) V."""
    KQ: gl.constexpr = ROLE == 0
    VS: gl.constexpr = ROLE == 1 or K.LOADERS == 1
    BAND: gl.constexpr = K.HAS_LEFT or K.HAS_RIGHT or K.SHIFTED
    if K.HEAD_TAIL > 0:  # (descriptor, shared tiles, first column) of Q, K and V
        tk = (T.k_desc, T.k_smem, K.HEAD_DIM)
        tv = (T.v_desc, T.v_smem, K.HEAD_DIM)
    else:
        tk = ()
        tv = ()
    g = 0
    i = 0
    n_work, base, L = _share(pid, nprog, total, Sched, K.LPT, K.SPLIT, K.VARLEN)
    t_next, kr_next, _, q0_next, nq_next, k0_next, nk_next = _tile(
        0, n_work, base, L, nprog, Sched, Cache, K.LPT, K.SPLIT, K.VARLEN)
    for r in range(0, n_work):
        seq = (q0_next, nq_next, k0_next, nk_next)
        t = t_next
        kr = kr_next
        t_next, kr_next, _, q0_next, nq_next, k0_next, nk_next = _tile(
            r + 1, n_work, base, L, nprog, Sched, Cache, K.LPT, K.SPLIT, K.VARLEN)
        q0, n_q, k0, n_k, band = _sequence(seq, N_Q, N_K, Band, K.VARLEN, K.SHIFTED,
                                           K.ROW_GROUP)
        pid_bh, off_b, off_h, off_hkv, start_m, t0, n_tiles, mask_from, seq_id = _work(
            t, n_m, H, GROUP, n_k, Div, band, K.BLOCK_M, K.BLOCK_N, K.IS_CAUSAL,
            K.HAS_LEFT, K.HAS_RIGHT, K.SHIFTED, K.VARLEN, K.ROW_GROUP)
        lo, hi, live = _range(kr, n_tiles, K.SPLIT, K.VARLEN)
        first = _key_tile(lo, n_tiles, mask_from, K.BLOCK_N, K.MASKED_FIRST)
        if K.PAGE > 0:  # the sequence's row of the block table
            pages = (Pages[0] + seq_id * Pages[1], Pages[2])
        else:
            pages = ()
        if BAND:
            first += t0
        if KQ:
            _stamp(Trace, pid, 3, r, 0, K.TRACE)
            _stamp(Trace, pid, 3, r, 5, K.TRACE, t)
            _stamp(Trace, pid, 3, r, 6, K.TRACE, n_tiles)
            if i > 0:
                _load_kv(k_desc, k_smem, k_ready, k_empty, off_b, off_hkv, k0, first, g,
                         K.BLOCK_N, K.STAGES, tk, pages, K.PAGE)
                _stamp(Trace, pid, 3, r, 4, K.TRACE)
            for c in gl.static_range(K.CONSUMERS):
                mbarrier.wait(q_empty.index(c), (i + 1) & 1, pred=i > 0)
                if K.HEAD_TAIL > 0:
                    tq = (T.q_desc, T.q_smem.index(c), K.HEAD_DIM)
                else:
                    tq = ()
                if K.GROUPED:
                    _load_tokens(q_desc, q_smem.index(c), q_ready.index(c), seq_id, off_h,
                                 (start_m + 64 * c) // K.ROW_GROUP)
                else:
                    _load_rows(q_desc, q_smem.index(c), q_ready.index(c), off_b, off_h,
                               q0 + start_m + 64 * c, tq)
            _stamp(Trace, pid, 3, r, 1, K.TRACE)
            if i == 0:
                _load_kv(k_desc, k_smem, k_ready, k_empty, off_b, off_hkv, k0, first, g,
                         K.BLOCK_N, K.STAGES, tk, pages, K.PAGE)
        if VS:
            _load_kv(v_desc, v_smem, v_ready, v_empty, off_b, off_hkv, k0, first, g,
                     K.BLOCK_N, K.STAGES, tv, pages, K.PAGE)
        if KQ:
            _stamp(Trace, pid, 3, r, 2, K.TRACE)
        for pos in range(lo + 1, hi):
            j = _key_tile(pos, n_tiles, mask_from, K.BLOCK_N, K.MASKED_FIRST)
            if BAND:
                j += t0
            if KQ:
                _load_kv(k_desc, k_smem, k_ready, k_empty, off_b, off_hkv, k0, j,
                         g + pos - lo, K.BLOCK_N, K.STAGES, tk, pages, K.PAGE)
            if VS:
                _load_kv(v_desc, v_smem, v_ready, v_empty, off_b, off_hkv, k0, j,
                         g + pos - lo, K.BLOCK_N, K.STAGES, tv, pages, K.PAGE)
        if KQ:
            _stamp(Trace, pid, 3, r, 3, K.TRACE)
        g += hi - lo
        i += 1


# -- the consumers -------------------------------------------------------------------------

@gluon.constexpr_function
def _products(head_tail):
    """wgmma products a P V issues: one, two with a head-dim tail."""
    return 2 if head_tail else 1


@gluon.jit
def _tail_tile(ring, slot, K):
    """Slot ``slot`` of a head-dim tail's K or V ring as a [BLOCK_N, HEAD_TAIL] tile."""
    return ring.index(slot).reshape([K.BLOCK_N, K.HEAD_TAIL])


@gluon.jit
def _tail_keys(T, qt, slot, K):
    """The tail's operands of one Q K^T: (Q's tail, K's tail transposed), or () without
    a tail."""
    if K.HEAD_TAIL > 0:
        out = (qt, _tail_tile(T.k_smem, slot, K).permute((1, 0)))
    else:
        out = ()
    return out


@gluon.jit
def _scores(q, kt, s_zero, tail):
    """Q K^T issued as one async wgmma, and with a head-dim ``tail`` (its Q and K^T
    operands, or ()) a second one accumulating onto it."""
    s = warpgroup_mma(q, kt, s_zero, use_acc=False, is_async=True)
    if len(tail) > 0:
        s = warpgroup_mma(tail[0], tail[1], s, is_async=True)
    return s


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
              v_empty, pin, o_desc, Lse, Sched, Part, pid, nprog, total, n_m, H, GROUP, N_Q,
              N_K, qk_scale, Div, Band, Cap, C: gl.constexpr, Trace, Out, T, Cache, K):
    """One warpgroup, query rows [start_m + 64 C, + 64) of each work tile: the
    software-pipelined loop of the module docstring. Each consumer is its own partition,
    so the barriers Gluon puts around shared-memory hand-offs (one thread arrives for the
    group) span 4 warps, and the warpgroups drift apart freely: one's softmax runs under
    the other's wgmma. PINGPONG orders that instead (FlashAttention-3's warpgroup
    ping-pong): each issue of wgmma is a turn (:func:`_take_turn`), passed round-robin to
    the next consumer once issued, so the tensor cores serve the warpgroups in turn and
    each one's softmax falls under the others' products. With SPLIT a work tile runs the
    positions [lo, hi) of its key range, and a piece of a cut block (slot >= 0) writes
    its partial O, m and l (:func:`_store_part`) after its output rows (which the merge
    overwrites).

    With a band (HAS_LEFT, HAS_RIGHT or SHIFTED; Band = (OFFSET, LEFT, RIGHT)) each
    consumer computes the key tiles its own rows see, passes the work tile's others and
    masks those its band's edges cross (:func:`_band_own`); a row may then meet tiles
    it sees nothing of before its first key, which :func:`_row_max` keeps at zero instead
    of NaN. SOFTCAP (Cap = (scale / c, c log2 e), qk_scale 1): scores become c tanh(s / c)
    in the exp2 domain before the mask and the row maximum.

    VARLEN: the work tile's rows and keys are a packed sequence's (:func:`_sequence`),
    whose lengths stand for N_Q and N_K; rows may then see no key (a sequence without
    keys), so the softmax is guarded as a band's is, and the output rows past the
    sequence are not stored (:func:`_store_out`).

    A head-dim tail (HEAD_TAIL > 0; ``T``, a :class:`Tail`) adds a
    second wgmma to each Q K^T, accumulating onto the scores, and a second accumulator
    ``acc_t`` with its own P V; the waits count the tail's products (``PV``)."""
    ROWS: gl.constexpr = 64
    TAILED: gl.constexpr = K.HEAD_TAIL > 0
    PV: gl.constexpr = _products(K.HEAD_TAIL)
    BAND: gl.constexpr = K.HAS_LEFT or K.HAS_RIGHT or K.SHIFTED
    GUARD: gl.constexpr = BAND or K.VARLEN
    CONSUMERS: gl.constexpr = K.CONSUMERS
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K.BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K.HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

    q_slot = q_smem.index(C)
    if not K.Q_REGS:
        q = q_slot.reshape([ROWS, K.HEAD_DIM])
    if TAILED:
        t_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K.HEAD_TAIL, 16])
        pt_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=t_layout,
                                                      k_width=2)
        qt_slot = T.q_smem.index(C)
        if not K.Q_REGS:
            qt = qt_slot.reshape([ROWS, K.HEAD_TAIL])
    else:
        qt = None
    s_zero = gl.zeros([ROWS, K.BLOCK_N], gl.float32, s_layout)
    g = 0
    i = 0
    k = 0  # wgmma issue turns taken (counted always, waited on with PINGPONG)
    n_work, base, L = _share(pid, nprog, total, Sched, K.LPT, K.SPLIT, K.VARLEN)
    t_next, kr_next, slot_next, q0_next, nq_next, k0_next, nk_next = _tile(
        0, n_work, base, L, nprog, Sched, Cache, K.LPT, K.SPLIT, K.VARLEN)
    for r in range(0, n_work):
        seq = (q0_next, nq_next, k0_next, nk_next)
        t = t_next
        kr = kr_next
        part = slot_next
        t_next, kr_next, slot_next, q0_next, nq_next, k0_next, nk_next = _tile(
            r + 1, n_work, base, L, nprog, Sched, Cache, K.LPT, K.SPLIT, K.VARLEN)
        q0, n_q, _, n_k, band = _sequence(seq, N_Q, N_K, Band, K.VARLEN, K.SHIFTED,
                                          K.ROW_GROUP)
        pid_bh, off_b, off_h, _, start_m, t0, n_tiles, mask_from, seq_id = _work(
            t, n_m, H, GROUP, n_k, Div, band, K.BLOCK_M, K.BLOCK_N, K.IS_CAUSAL, K.HAS_LEFT,
            K.HAS_RIGHT, K.SHIFTED, K.VARLEN, K.ROW_GROUP)
        lo, hi, live = _range(kr, n_tiles, K.SPLIT, K.VARLEN)
        row0 = start_m + ROWS * C
        n_own, mask_own = _own_tiles(row0, n_q, n_k, n_tiles, mask_from, ROWS, K.BLOCK_N,
                                     K.IS_CAUSAL, K.LPT, BAND, K.VARLEN)
        if BAND:  # it computes [own_lo, own_hi) and masks outside [mask_lo, mask_own)
            own_lo, own_hi, mask_lo, mask_own = _band_own(
                row0, n_k, band, t0, n_tiles, ROWS, K.BLOCK_N, K.IS_CAUSAL, K.HAS_LEFT,
                K.HAS_RIGHT, K.SHIFTED, K.ROW_GROUP)
        else:
            mask_lo = 0
        _stamp(Trace, pid, C, r, 0, K.TRACE)
        mbarrier.wait(q_ready.index(C), i & 1)
        _stamp(Trace, pid, C, r, 1, K.TRACE)
        if K.Q_REGS:
            q = q_slot.reshape([ROWS, K.HEAD_DIM]).load(q_layout)
            if TAILED:
                qt = qt_slot.reshape([ROWS, K.HEAD_TAIL]).load(q_layout)
        k_slot = g % K.STAGES
        k_phase = (g // K.STAGES) & 1
        # the tiles this consumer processes are positions first .. end - 1 of the work
        # tile's order (within [lo, hi)); with MASKED_FIRST those past its rows come
        # before them, and a band's consumer may need neither the first nor the last
        # tiles of its work tile: pass those before, then those after (below)
        if K.MASKED_FIRST:
            first = n_tiles - n_own
            if K.SPLIT:
                first = gl.maximum(first, lo)
            end = hi
        elif BAND:
            first = gl.minimum(gl.maximum(own_lo, lo), hi - 1)
            end = gl.maximum(gl.minimum(own_hi, hi), first + 1)
        elif K.IS_CAUSAL or K.LPT == 2:
            first = lo
            end = n_own
            if K.SPLIT:
                end = gl.minimum(end, hi)
        else:  # every consumer takes every key tile
            first = lo
            end = hi
        if K.MASKED_FIRST or BAND:
            k_slot, k_phase = _pass_tiles(k_ready, v_ready, k_empty, v_empty, k_slot,
                                          k_phase, first - lo, k, C, CONSUMERS, K.STAGES,
                                          K.K_EARLY, K.PINGPONG)
        _stamp(Trace, pid, C, r, 7, K.TRACE, end - first)
        # the first tile (with MASKED_FIRST the only one it may mask): scores, then the
        # first softmax (m starts at its row maximum: a row's diagonal tile holds a key at
        # or before it, and so does every other tile it owns)
        kk = k + first - lo
        mbarrier.wait(k_ready.index(k_slot), k_phase)
        _stamp(Trace, pid, C, r, 2, K.TRACE)
        kt = k_smem.index(k_slot).reshape([K.BLOCK_N, K.HEAD_DIM]).permute((1, 0))
        _take_turn(C, kk, K.PINGPONG)
        s = _scores(q, kt, s_zero, _tail_keys(T, qt, k_slot, K))
        _pass_turn(C, CONSUMERS, K.PINGPONG)
        kk += 1
        s = warpgroup_mma_wait(0, deps=(s,))
        _stamp(Trace, pid, C, r, 3, K.TRACE)
        if K.Q_REGS:
            _scores_done(k_empty, q_empty, k_slot, C, True, K.K_EARLY, K.EARLY_Q)
        else:
            _scores_done(k_empty, q_empty, k_slot, C, first == end - 1, K.K_EARLY, K.EARLY_Q)
        if K.SOFTCAP:
            s, _ = softcapped(s, Cap[0], Cap[1])
        if BAND:
            p0 = t0 + first
        elif K.IS_CAUSAL or K.MASKED_FIRST:
            p0 = _key_tile(first, n_tiles, mask_from, K.BLOCK_N, K.MASKED_FIRST)
        else:  # only the last key tile masks, and no piece starts there (split_points);
            p0 = 0  # a position read from the list here cost the loop 0.3%
        s = _masked(s, p0, row0, n_k, mask_own, mask_lo, band, ROWS, K.BLOCK_N, K.IS_CAUSAL,
                    K.HAS_LEFT, K.HAS_RIGHT, K.SHIFTED, s_layout, K.ROW_GROUP, 0)
        m_i = gl.max(s, 1) * qk_scale
        p = gl.exp2(s * qk_scale - gl.expand_dims(_row_max(m_i, GUARD), 1))
        l_part = _quad_sums(p)
        p_op = _p_operand(p, dtype, p_layout)
        acc = gl.zeros([ROWS, K.HEAD_DIM], gl.float32, o_layout)
        if TAILED:
            acc_t = gl.zeros([ROWS, K.HEAD_TAIL], gl.float32, t_layout)

        # Without MASKED_FIRST the loop counts from the first position and the mask's
        # bounds move with it, so LLVM keeps one induction variable (the key offset) for
        # the mask and the exit test; a start read from the list (SPLIT) gave it two.
        # MASKED_FIRST's loop carries no mask.
        origin = first
        if K.MASKED_FIRST:
            origin = 0
        if BAND:  # positions count from the band's first tile
            shift = (origin + t0) * K.BLOCK_N
        else:
            shift = origin * K.BLOCK_N
        for it in range(first + 1 - origin, end - origin):
            v_slot = k_slot  # the previous tile's V shares its K's slot number
            v_phase = k_phase
            k_slot, k_phase = _next_slot(k_slot, k_phase, K.STAGES)
            mbarrier.wait(k_ready.index(k_slot), k_phase)
            kt = k_smem.index(k_slot).reshape([K.BLOCK_N, K.HEAD_DIM]).permute((1, 0))
            mbarrier.wait(v_ready.index(v_slot), v_phase)
            v = v_smem.index(v_slot).reshape([K.BLOCK_N, K.HEAD_DIM])
            _take_turn(C, kk, K.PINGPONG)
            s = _scores(q, kt, s_zero, _tail_keys(T, qt, k_slot, K))
            acc = warpgroup_mma(p_op, v, acc, is_async=True)
            if TAILED:
                acc_t = warpgroup_mma(gl.convert_layout(p_op, pt_layout),
                                      _tail_tile(T.v_smem, v_slot, K), acc_t, is_async=True)
            _pass_turn(C, CONSUMERS, K.PINGPONG)
            kk += 1
            s = warpgroup_mma_wait(PV, deps=(s,))  # S_j done; P_{j-1} V_{j-1} may run
            if K.SOFTCAP:
                s, _ = softcapped(s, Cap[0], Cap[1])
            _scores_done(k_empty, q_empty, k_slot, C, it == end - origin - 1, K.K_EARLY,
                         K.EARLY_Q and not K.Q_REGS)

            if not K.MASKED_FIRST:  # positions are tiles
                s = _masked(s, it, row0 - shift, n_k - shift, mask_own - shift,
                            mask_lo - shift, band, ROWS, K.BLOCK_N, K.IS_CAUSAL, K.HAS_LEFT,
                            K.HAS_RIGHT, K.SHIFTED, s_layout, K.ROW_GROUP, shift)
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            if K.RESCALE_TAU > 0:
                # a row keeps its old maximum unless the tile raises it by more than TAU
                m_new = gl.where(m_new - m_i > K.RESCALE_TAU, m_new, m_i)
            # the row maxima go to shared memory, so they are computed under the P V
            # product; ptxas would otherwise hoist the wait above them (:func:`_pin`)
            _pin(pin, C, gl.expand_dims(m_new, 1))
            m_use = _row_max(m_new, GUARD)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))
            alpha = gl.exp2(m_i - m_use)
            l_part = l_part * gl.expand_dims(
                gl.convert_layout(alpha, gl.SliceLayout(1, l_part.type.layout)), 1) \
                + _quad_sums(p)
            m_i = m_new

            if TAILED:
                acc, acc_t, p_op = warpgroup_mma_wait(0, deps=(acc, acc_t, p_op))
            else:
                acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
            _release(v_empty, v_slot)
            acc = _rescaled(acc, alpha, K.RESCALE_TAU)
            if TAILED:
                acc_t = _rescaled(acc_t, alpha, K.RESCALE_TAU)
            p_op = _p_operand(p, dtype, p_layout)

        _stamp(Trace, pid, C, r, 4, K.TRACE)
        mbarrier.wait(v_ready.index(k_slot), k_phase)  # the last tile's V
        v = v_smem.index(k_slot).reshape([K.BLOCK_N, K.HEAD_DIM])
        if K.CACHE:  # the sequence's last tile: its keys past n_k are a cache's spare slots
            if BAND:
                _zero_past(v, (t0 + end - 1) * K.BLOCK_N, n_k, K.BLOCK_N)
            else:
                _zero_past(v, (end - 1) * K.BLOCK_N, n_k, K.BLOCK_N)
        _take_turn(C, kk, K.PINGPONG)
        acc = warpgroup_mma(p_op, v, acc, is_async=True)
        if TAILED:
            acc_t = warpgroup_mma(gl.convert_layout(p_op, pt_layout),
                                  _tail_tile(T.v_smem, k_slot, K), acc_t, is_async=True)
        _pass_turn(C, CONSUMERS, K.PINGPONG)
        if TAILED:
            acc, acc_t, p_op = warpgroup_mma_wait(0, deps=(acc, acc_t, p_op))
        else:
            acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        _stamp(Trace, pid, C, r, 5, K.TRACE)
        _release(v_empty, k_slot)
        if not K.MASKED_FIRST and (K.IS_CAUSAL or BAND or K.LPT == 2):
            # the tiles past this consumer's rows, after its last slot went back: passing
            # them waits for their loads, which may need that slot
            n_slot, n_phase = _next_slot(k_slot, k_phase, K.STAGES)
            _pass_tiles(k_ready, v_ready, k_empty, v_empty, n_slot, n_phase,
                        hi - end, k + end - lo + 1, C, CONSUMERS, K.STAGES, K.K_EARLY,
                        K.PINGPONG)

        # a piece of a cut block writes its rows too (the merge overwrites them), so the
        # epilogue is the one without SPLIT: a branch choosing between the two stores
        # moved ptxas's loop schedule, 0.5-1% a key tile
        if TAILED:
            out_tail = (acc_t, T.o_smem, T.o_desc, K.HEAD_DIM)
            part_tail = (acc_t, K.HEAD_DIM)
        else:
            out_tail = ()
            part_tail = ()
        if K.GROUPED:  # the sequence, the output's first coordinate
            off_b = seq_id
        _store_out(acc, l_part, m_i, o_smem, q_empty, o_desc, Lse, C, off_b, off_h, row0,
                   pid_bh, n_q, K.RETURN_LSE, K.EARLY_Q, K.OUT_RCP, row_s, GUARD, q0, Out,
                   K.VARLEN, out_tail, K.ROW_GROUP, K.GROUPED)
        if K.SPLIT:
            if part >= 0:
                if K.VARLEN:  # an empty piece ran another's tile: it weighs nothing
                    keep = live.to(gl.float32)
                    acc = acc * keep
                    l_part = l_part * keep
                    m_i = gl.where(live, m_i, float("-inf"))
                _store_part(acc, l_part, m_i, Part, part, C, K.BLOCK_M, row_s, part_tail)
        _stamp(Trace, pid, C, r, 6, K.TRACE)
        k += hi - lo + 1  # wgmma turns: every consumer takes T + 1 per work tile
        g += hi - lo
        i += 1
    if C == 0:  # one turn more: the last consumer's final pass gets its sync, so no named
        _take_turn(C, k, K.PINGPONG)  # barrier is left half-arrived when the CTA exits
    if K.EARLY_Q:  # the last work tile's output store was not waited for
        tma.store_wait(0)


# -- the kernel ----------------------------------------------------------------------------

@gluon.jit(do_not_specialize=["DIV_M", "SHIFT_M", "DIV_H", "SHIFT_H", "DIV_G", "SHIFT_G"])
def _attn_fwd_sm90(
    q_desc, k_desc, v_desc, o_desc, Lse, Sched, Part,
    H, GROUP, N_Q, N_K, BH, qk_scale, DIV_M, SHIFT_M, DIV_H, SHIFT_H, DIV_G, SHIFT_G, Trace,
    OFFSET, LEFT, RIGHT, cap_in, cap_out, Out, q_tail, k_tail, v_tail, o_tail,
    Table, TABLE_STRIDE, TABLE_COLS, ADDED_K, PIECES, HEAD_DIM: gl.constexpr,
    HEAD_TAIL: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    K_EARLY: gl.constexpr, IS_CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr,
    LPT: gl.constexpr, PINGPONG: gl.constexpr,
    RESCALE_TAU: gl.constexpr, EARLY_Q: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, MASKED_FIRST: gl.constexpr, TRACE: gl.constexpr,
    OUT_RCP: gl.constexpr, Q_REGS: gl.constexpr, SPLIT: gl.constexpr,
    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SHIFTED: gl.constexpr,
    SOFTCAP: gl.constexpr, VARLEN: gl.constexpr, ROW_GROUP: gl.constexpr,
    CACHE: gl.constexpr, PAGE: gl.constexpr = 0, GROUPED: gl.constexpr = False,
    LOADERS: gl.constexpr = 1,
):
    """1-D grid of P programs (at most one per SM) over cdiv(N_Q, BLOCK_M) * BH work tiles
    (BH = B * H), each program looping over its tiles: round robin (program p takes tiles
    p, p + P, ...), or with LPT its share of the host's work list. num_warps = 4, BLOCK_M
    in {64, 128, 192}: one consumer warpgroup per 64 rows and a producer. One or two
    consumers: the first in the default partition, the second a 4-warp worker with
    CONSUMER_REGS registers, the producer a 1-warp worker with PRODUCER_REGS. Three: the
    producer in the default partition (it keeps what the workers leave, 32 registers), the
    consumers 4-warp workers. qk_scale = scale * log2(e) > 0. Q/O descriptors have block
    (1, 1, 64, D); K/V (1, 1, BLOCK_N, D).

    LPT (causal, or with BALANCE or SPLIT): each program runs its share of the host's work
    list ``Sched`` (int32, :func:`flashscope.schedule.lpt_schedule`; unread otherwise), and
    with LPT = 2 (causal, or BALANCE) consumers whose rows are all past N_Q pass their key
    tiles (:func:`_own_tiles`); LPT = 1 (SPLIT alone, non-causal) computes them, so the
    consumer's loop has no passing after it, as without a list. PINGPONG (2-3 consumers):
    the consumers issue their wgmma in turn (:func:`_take_turn`). RESCALE_TAU > 0: the row
    maximum moves only by more than that. EARLY_Q: Q handed back at its last use, the
    output staged in slots of its own. K_EARLY: K slots handed back at their Q K^T (the
    module docstring). MASKED_FIRST: the masked key tiles of each work tile first
    (:func:`_key_tile`). OUT_RCP: the output scaled by one reciprocal of l per row
    (:func:`_store_out`). Q_REGS: each consumer's Q in registers, the A operand of its
    Q K^T (the module docstring). SPLIT (with LPT): the list's entries carry key ranges,
    and pieces of cut blocks write fp32 partials to ``Part`` (:func:`_store_part`; unread
    otherwise), which a second kernel merges; with VARLEN (a KV cache's, CACHE) every
    row block is cut, its entries naming piece j of S (:func:`~flashscope.kernels.
    sm90_worklist._range`), with or without a list (below). TRACE = R > 0 stamps the
    clock (``Trace``; :func:`_stamp`). HAS_LEFT, HAS_RIGHT, SHIFTED: a window's bounds
    and bottom-right alignment, with OFFSET, LEFT and RIGHT as
    :meth:`flashscope.masks.Mask.scalars` gives them (a band: every work tile visits the
    key tiles its rows see, round robin, each consumer masking its band's edges; unread
    otherwise). SOFTCAP: scores capped as
    c tanh(s / c), cap_in = scale / c, cap_out = c log2(e), qk_scale = 1 (unread
    otherwise). VARLEN: a packed batch, q and out (1, H, total_q, D), k and v
    (1, Hkv, total_k, D), BH = B * H over its B sequences and N_Q, N_K its longest; the
    work list (:mod:`flashscope.kernels.packed_worklist`) holds the row blocks that hold
    rows, each with its sequence's place and lengths, and ``Out`` is the output's address
    for the row blocks that cross a sequence's end (unread otherwise). A KV cache's
    (CACHE) may run without a list (LPT = 0) where the grid has a program for every
    entry: its entries then follow the program index, PIECES a row block (1 without
    SPLIT), each sequence's keys its first ``Sched[b] + ADDED_K`` (``Sched`` is then the
    cache's lengths; :func:`~flashscope.kernels.sm90_worklist._tile`; ADDED_K and PIECES
    unread otherwise). HEAD_TAIL > 0: the head dim is HEAD_DIM + HEAD_TAIL, its last
    HEAD_TAIL columns read and written through
    q_tail, k_tail, v_tail and o_tail (blocks (1, 1, rows, HEAD_TAIL), None otherwise;
    the module docstring). ROW_GROUP = G > 1 (VARLEN): a decoding call's packed rows, G
    consecutive rows a query position (:func:`~flashscope.kernels.sm90_worklist.
    _positions`). CACHE (VARLEN): the keys are a KV cache's, each sequence's list entry
    giving its keys in use, the slots past them anyone's: each consumer zeroes those V
    rows of its last key tile before the product reads them
    (:func:`~flashscope.kernels.sm90_softmax._zero_past`). PAGE > 0 (CACHE): a paged
    cache, k and v its pages seen as one packed batch (1, Hkv, pages x PAGE, D), key i of
    sequence b in page Table[b TABLE_STRIDE + i / PAGE] (TABLE_COLS columns a row;
    unread otherwise; :func:`_load_kv`), the K and V descriptors' blocks min(PAGE,
    BLOCK_N) rows. LOADERS = 2 (one or two consumers): a second one-warp producer
    partition brings V while the first brings Q and K, so a key tile's copies (one a
    page) are issued by two warps. GROUPED (CACHE, G = ROW_GROUP dividing 64): q and out
    are the caller's (B, Nq, Hkv, G, D), rank-5 descriptors with blocks (1, 64 / G, 1, G,
    D), the packed row r of sequence b, kv head h being token r / G of query head
    h G + r % G: no copy of either into the packed layout; Lse is the caller's (B, Hkv G,
    Nq)."""
    CONSUMERS: gl.constexpr = BLOCK_M // 64
    gl.static_assert(CONSUMERS * 64 == BLOCK_M and CONSUMERS <= 3, "BLOCK_M: 64, 128 or 192")
    gl.static_assert(gl.num_warps() == 4, "num_warps must be 4 (one warpgroup)")
    gl.static_assert(ROW_GROUP == 1 or (VARLEN and (SHIFTED or not IS_CAUSAL)),
                     "ROW_GROUP > 1: a packed batch, causal only aligned bottom-right")
    gl.static_assert(not CACHE or (VARLEN and not MASKED_FIRST and HEAD_TAIL == 0),
                     "CACHE: a packed batch, its last key tile last, no head-dim tail")
    gl.static_assert(not (SPLIT and VARLEN) or CACHE, "SPLIT with VARLEN: a KV cache's")
    gl.static_assert(not VARLEN or LPT > 0 or CACHE, "VARLEN without a list: a KV cache's")
    gl.static_assert(PAGE == 0 or (CACHE and PAGE % 16 == 0
                                   and (PAGE % BLOCK_N == 0 or BLOCK_N % PAGE == 0)),
                     "PAGE: a KV cache's, 16 keys or more, a divisor or multiple of BLOCK_N")
    gl.static_assert(LOADERS == 1 or (LOADERS == 2 and CONSUMERS < 3),
                     "LOADERS: 1, or 2 beside one or two consumers")
    gl.static_assert(not GROUPED or (CACHE and 64 % ROW_GROUP == 0),
                     "GROUPED: a KV cache's rows, the group dividing 64")
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    n_m = gl.cdiv(N_Q, BLOCK_M)
    total = n_m * BH
    if VARLEN and LPT == 0:  # a KV cache's entries in index order (_tile), PIECES a block
        total = total * PIECES
        Cache = (ADDED_K, PIECES, n_m * H, N_Q, N_K)
    else:  # nothing to carry into the partitions
        Cache = ()

    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(
        dtype, _row_slots(CONSUMERS, HEAD_DIM, GROUPED, ROW_GROUP), q_desc.layout)
    if EARLY_Q:
        o_smem = gl.allocate_shared_memory(
            dtype, _row_slots(CONSUMERS, HEAD_DIM, GROUPED, ROW_GROUP), o_desc.layout)
    else:
        o_smem = q_smem
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    if K_EARLY:
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    else:  # slot j's K and V go back together, after its P V
        v_empty = k_empty
    if HEAD_TAIL > 0:  # the tail's descriptors, then its tiles: Q, K, V and the output
        qt_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, 1, 1, 64, HEAD_TAIL],
                                            q_tail.layout)
        if EARLY_Q:
            ot_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, 1, 1, 64, HEAD_TAIL],
                                                o_tail.layout)
        else:
            ot_smem = qt_smem
        T = Tail(q_tail, k_tail, v_tail, o_tail, qt_smem,
                 gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_TAIL],
                                           k_tail.layout),
                 gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_TAIL],
                                           v_tail.layout), ot_smem)
    else:
        T = ()
    pin = gl.allocate_shared_memory(gl.float32, [CONSUMERS, 64, 4],
                                    gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_ready.index(c), count=1)
        mbarrier.init(q_empty.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_ready.index(i), count=1)
        if K_EARLY:
            mbarrier.init(v_empty.index(i), count=CONSUMERS)

    Div = (DIV_M, SHIFT_M, DIV_H, SHIFT_H, DIV_G, SHIFT_G)
    if HAS_LEFT or HAS_RIGHT or SHIFTED:
        Band = (OFFSET, LEFT, RIGHT)
    else:  # nothing to carry into the partitions
        Band = ()
    if SOFTCAP:
        Cap = (cap_in, cap_out)
    else:
        Cap = ()
    K = Knobs(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, HEAD_TAIL=HEAD_TAIL,
              STAGES=STAGES, CONSUMERS=CONSUMERS, IS_CAUSAL=IS_CAUSAL, RETURN_LSE=RETURN_LSE,
              LPT=LPT, PINGPONG=PINGPONG, RESCALE_TAU=RESCALE_TAU, EARLY_Q=EARLY_Q,
              K_EARLY=K_EARLY, MASKED_FIRST=MASKED_FIRST, OUT_RCP=OUT_RCP, Q_REGS=Q_REGS,
              SPLIT=SPLIT, TRACE=TRACE, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT,
              SHIFTED=SHIFTED, SOFTCAP=SOFTCAP, VARLEN=VARLEN, ROW_GROUP=ROW_GROUP,
              CACHE=CACHE, PAGE=PAGE, GROUPED=GROUPED, LOADERS=LOADERS)
    if PAGE > 0:
        Pages = (Table, TABLE_STRIDE, TABLE_COLS)
    else:  # nothing to carry into the partitions
        Pages = ()
    if CACHE:  # launched early (launch_pdl): the list or the append may still be running
        _grid_wait(pid)
        if SPLIT:  # the merge after this cut grid may start: it waits for the grid itself
            _grid_launch_next(pid)
    # One list, in partition order (_worker_warps): consumer c, or the producer where c is
    # -1. The arguments are spelled out in place: a tuple bound to a name first would turn
    # its constexprs into tensors (an aggregate such as K keeps them).
    gl.warp_specialize(
        [(_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty,
                      k_ready, v_ready, k_empty, v_empty, Sched, pid, nprog, total, n_m, H,
                      GROUP, N_Q, N_K, Div, Band, Trace, T, Pages, Cache, K, -1 - c))
         if c < 0 else
         (_consumer, (q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready,
                      k_empty, v_empty, pin, o_desc, Lse, Sched, Part, pid, nprog,
                      total, n_m, H, GROUP, N_Q, N_K, qk_scale, Div, Band, Cap, c, Trace, Out,
                      T, Cache, K))
         for c in ((0, -1), (0, 1, -1), (-1, 0, 1, 2), (0, -1, -2),
                   (0, 1, -1, -2))[CONSUMERS - 1 if LOADERS == 1 else CONSUMERS + 2]],
        _worker_warps(CONSUMERS, LOADERS),
        _worker_regs(CONSUMERS, CONSUMER_REGS, PRODUCER_REGS, LOADERS))
