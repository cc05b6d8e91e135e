"""FlashAttention backward for Hopper (sm_90), written in Gluon: one pass over each key
tile, dQ added by the copy engine.

The maths is :mod:`flashscope.kernels.attention_bwd`'s (P recomputed from the saved
log-sum-exp in base 2, delta = rowsum(dO O) from its preprocess, fp32 accumulators). What
differs is the work per tile pair. The portable backward runs two passes, dK/dV and then
dQ, and the dQ pass recomputes S and dP: 7 products a tile pair. Here one program keeps
a key tile (K, V, dK, dV) and streams the query tiles that see it, doing the 5 products
once, as FlashAttention-2 and -3 do:

    for each query tile (Q, dO):                  keys of this program: BLOCK_N rows
        S^T  = K Q^T,   dP^T = V dO^T - delta    (wgmma, async, both issued; dP^T's
                                                  accumulator starts at -delta)
        P^T  = 2^(S^T c - L)                     (under dP^T's product)
        dV  += P^T dO                            (wgmma, P^T from registers)
        dS^T = P^T dP^T
        dK  += dS^T Q                            (wgmma, dS^T from registers)
        dQ   = dS K                              (wgmma, dS^T through shared memory)
        dQ  -> a shared-memory slot -> added to an fp32 buffer by one TMA reduction

dQ travels in fragment order (:func:`_fragments`): each consumer thread writes its
accumulator registers in 16-byte chunks, chunk c of every thread side by side, so the
tile's 32 KB go out in conflict-free 128-bit stores from one address register, and the
buffer holds each tile in that order; :func:`_dq_unpack` puts it back in (B, H, Nq, D)
order, scaled and cast. Stored as a [BLOCK_M, D] tile the accumulator's 64-bit stores
conflicted two ways (4 shared wavefronts a store against 2).

Each query row takes one dQ addition per key tile, from whichever program gets there
first: the sum's order, hence dQ's last bits, vary from run to run (the two passes stay
the deterministic path, :func:`flashscope.families.sm90_bwd.deterministic`).

Warps: a one-warp producer loads K and V once and streams Q and dO tiles through a ring
of STAGES slots (``q_ready``/``q_empty``); the consumer (the default partition, two
warpgroups, each 64 of the key rows) runs the loop above; a one-warp reducer takes each
finished dQ tile from one of DQ_SLOTS shared-memory slots (``dq_full``), adds it into
the fp32 buffer with ``cp.reduce.async.bulk.tensor`` and hands the slot back once the
copy engine has read it (``dq_empty``). Without that warp the consumer issued the
additions itself (per-element fp32 atomics, or a TMA reduction it then waited for) and
the one pass ran at 0.84-1.13x the two passes; with it, 0.95-1.32x (H200,
docs/experiments.md).

At D = 256 (BLOCK_N = 64, SPLIT_D) both warpgroups take the program's 64 keys, each half
of the head dim for dK, dV and dQ and half of the query columns for S^T and dP^T, with
P^T and dS^T exchanged through shared memory (:func:`_split_products`): dK and dV of
[64, 256] take 128 registers a thread so, 256 with a warpgroup per 64 keys. No dQ slot
fits there beside the rings (64 KB), so the consumer adds dQ itself by 16-byte atomics
in the buffer's order (DQ_SLOTS = 0, :func:`_add_dq`) and the reducer has nothing to do.

A GQA group is summed in the program: the query tiles of each of its GROUP heads in turn
against the one kv head's K and V. Causal masks are top-left (query i sees keys <= i): a
key tile starts at the query tile holding its first key, and only tiles that cross the
diagonal are masked. TMA zero-fills rows past N of each head. A query row there reads
L = 0 and delta = 0 (or +inf and 0 where the consumer loads them): P = 1 against zero Q
and dO, so it adds nothing (its dQ row lands in the buffer's padding, which
:func:`_dq_unpack` does not read). A key
row there scores 0, which a query row of very negative L (every score far below zero)
would turn into P = inf and dS K = inf 0 = NaN: the key tile that runs past N_K runs
every query tile in the masked loop, its keys past N_K masked (KEYS), as a packed
sequence's last key tile does (KEY_TAIL: N_K not a tile multiple, or a packed batch);
dK and dV rows past N_K are not stored: they leave through the free Q and dO rings by
TMA stores, which clip at N_K (DKV_TMA), or, for a packed sequence's last key tile, from
registers with a row mask.

Windows and bottom-right alignment (HAS_LEFT, HAS_RIGHT, SHIFTED, the forward's
switches): a key tile's query tiles come from :func:`~flashscope.kernels.keyrange.
query_range`, the rows of the band that reach it, [lo, hi), of which [full_lo, full_hi)
see all its keys. Producer, consumer and reducer visit the whole tiles first, unmasked,
then the lower and the upper masked edge, each in a loop of its own with
:func:`~flashscope.kernels.keyrange.visible`. With both edges in one loop beside the
whole tiles' loop, the band's scalars stayed live across the latter and it spilled 48-56
registers (sm_90, D = 128; 0.60-0.72x against 1.03-1.38x the two passes' GPU time, H200);
with the edges first, the whole tiles' loop took 15-22 instructions a tile more than in
this order (1.01-1.03x the GPU time at D = 96 and 128, level at D = 64). In a packed
batch (VARLEN) each sequence is aligned on its own lengths (shift n_k - n_q), and a key
tile that holds the next sequence's keys runs every query tile in the edge loops, where
they are masked.

SOFTCAP caps the scores as the forward does (``softcapped``: c tanh(s / c)) and carries
the cap's derivative into dS (:func:`_tile`).

The producer also brings each query tile's log-sum-exp and delta into the ring slot
(TMA copies from (heads, Nq) views whose heads start N_ROWS apart, zero past a head's
end), so the consumer reads them from shared memory and keeps no row offsets live across
its loop (sm_90 at D = 128 causal: 10 spilled registers against 49). A dense head's
vector starts 16-byte aligned: N_ROWS is Nq rounded up to 4 (where Nq is not a multiple
of 4 the delta launch copies the log-sum-exp into such a vector). A packed batch's
vectors are padded so that each sequence starts on a tile (VARLEN, below).

HEAD_DIM is the tiles' width (64, 128 or 256), HEAD_COLS the head dim D (0: HEAD_DIM). A head
narrower than its tiles runs padded: TMA zero-fills Q, K, V and dO past D (the scores
and dP are those of the D columns, dK, dV and dQ come out zero there) and clips the dK
and dV stores; the register stores and the dQ unpacking mask the columns.

HEAD_TAIL > 0 (D = 72-96): 64 columns and a tail of 16 or 32 more (``Tail``: its
descriptors and shared tiles), as the forward's tail. The tail's columns add a second
wgmma onto S^T and dP^T and have dV, dK and dQ products and accumulators of their own;
every wait counts a product's two groups (``_chain``); its dQ part leaves through dQ
slots of its own by a second TMA reduction into the same buffer rows (each row: the 64
columns' values, then the tail's). Against the 128 columns it was padded to (GPU time,
H200, bf16, ABBA medians): D = 80 1.07x / 1.11x (causal), 72 1.09x, 88 1.03x, 96
0.99x / 1.02x, GQA 32/8 D = 96 1.04x; 49 KB less shared memory at D = 96.

The file reads top down: the tail's bundle (``Tail``, ``_chain``), the split test
(``_split_d``), the order a program visits its query tiles in (``_visit``), the producer
and the reducer, dQ's fragment order and its unpacking launch (``_fragments``,
``_dq_unpack``), one query tile's products (``_tile``; its masks in ``_masked``; with the
head dim split, its last three in ``_split_products``; dQ by atomics in ``_add_dq``), the
consumer and its dK/dV stores (``_consumer``, ``_store_rows``, ``_stage_store``), and the
kernel, which allocates the shared memory and barriers and starts the partitions
(``_attn_bwd_sm90``).

Shapes: Q, dO (B, H, Nq, D), K, V (B, Hkv, Nk, D), all through rank-4 TMA descriptors
(block (1, 1, rows, HEAD_DIM)); the log-sum-exp (base e) and delta, fp32, N_ROWS a head
((B, H, N_ROWS) dense, (H, N_ROWS) padded packed), through rank-2 descriptors (block
(1, rows)); the dQ buffer fp32, zeroed by the delta launch, cdiv(N_ROWS, BLOCK_M) tiles a
head of FRAG_ROWS rows each (B H heads dense, H packed), through a rank-2 descriptor
(block (FRAG_ROWS, BLOCK_M HEAD_DIM / FRAG_ROWS)); DK, DV (B, Hkv, Nk, D), any strides.
"""

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.language.nvidia.hopper.tma import store_wait, tensor_descriptor

from flashscope.compat import (aggregate, cta_barrier, smem_reinterpret, tma_load,
                               tma_reduce_add, tma_store)
from flashscope.kernels.attention_bwd import padded_start
from flashscope.kernels.common import in_units, softcapped
from flashscope.kernels.sm90_softmax import _p_operand
from flashscope.kernels.keyrange import query_range, segment, visible, visible_from

LOG2E = gl.constexpr(1.4426950408889634)
#: the consumer's threads (two warpgroups): rows of a dQ tile in fragment order
FRAG_ROWS = gl.constexpr(256)
#: a dQ slot seen as (chunk, thread, 4): the same bytes as its unswizzled TMA block
CHUNKS = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))


@aggregate
class Tail:
    """A head-dim tail's TMA descriptors (blocks (1, 1, rows, HEAD_TAIL)) over Q, K, V,
    dO, dK and dV, and over the dQ buffer (block (FRAG_ROWS, BLOCK_M HEAD_TAIL /
    FRAG_ROWS)), and its shared tiles (the Q and dO rings, K and V, the dQ slots), carried
    into the partitions as one argument (``()`` without a tail)."""

    q_desc: tensor_descriptor
    k_desc: tensor_descriptor
    v_desc: tensor_descriptor
    do_desc: tensor_descriptor
    dk_desc: tensor_descriptor
    dv_desc: tensor_descriptor
    dq_desc: tensor_descriptor
    q_smem: gl.shared_memory_descriptor
    do_smem: gl.shared_memory_descriptor
    k_smem: gl.shared_memory_descriptor
    v_smem: gl.shared_memory_descriptor
    dq_smem: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, q_smem,
                 do_smem, k_smem, v_smem, dq_smem):
        self.q_desc, self.k_desc, self.v_desc, self.do_desc = q_desc, k_desc, v_desc, do_desc
        self.dk_desc, self.dv_desc, self.dq_desc = dk_desc, dv_desc, dq_desc
        self.q_smem, self.do_smem, self.k_smem, self.v_smem = q_smem, do_smem, k_smem, v_smem
        self.dq_smem = dq_smem


@gluon.constexpr_function
def _chain(head_tail):
    """wgmma groups one product issues: one, two with a head-dim tail (its columns')."""
    return 2 if head_tail else 1


@gluon.constexpr_function
def _split_d(block_n, warps):
    """Whether the consumer's warpgroups (64 key rows each with a tile of their own) share
    the key tile instead and split the head dim: BLOCK_N half their rows (D = 256)."""
    return 2 * block_n == 16 * warps


@gluon.jit
def _first_query(start_n, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr):
    """The first query row a key tile's program visits: under a top-left causal mask the
    query tile that holds the key tile's first key (rows above it see none of its keys)."""
    if IS_CAUSAL:
        return (start_n // BLOCK_M) * BLOCK_M
    return 0


@gluon.jit
def _visit(SEG: gl.constexpr, lo, full_lo, full_hi, hi):
    """Query rows [a, b) of the SEG-th range a program visits, as all three partitions
    visit them (``keyrange.segment``'s ranges: [lo, full_lo) and [full_hi, hi) masked,
    [full_lo, full_hi) whole): the whole tiles, then the masked ones, a band's lower edge
    before its upper one (segments 1, 0, 2; without a band the last is empty, full_hi is
    hi: the tiles the causal diagonal or a ragged key tile masks come second). With the
    whole tiles' loop first, sm_90's D = 64 build keeps it free of spills: 551-564
    instructions a tile and no spill store, against 600-605 and 11-12 after the masked
    loop (causal, or Nk not a multiple of 128)."""
    return segment((1 - SEG) % 3, lo, full_lo, full_hi, hi)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, do_desc, lse_desc, dl_desc, q_smem, do_smem, k_smem,
              v_smem, lse_smem, dl_smem, kv_ready, q_ready, q_empty, tb, off_hkv, q0, r0,
              k0, start_n, lo, full_lo, full_hi, hi, H, N_ROWS, GROUP, BLOCK_M: gl.constexpr,
              STAGES: gl.constexpr, T, HEAD_DIM: gl.constexpr, HEAD_TAIL: gl.constexpr):
    """K and V once, then Q and dO of every query tile of every head of the group; with
    a head-dim tail (``T``) each copy brings its tile's tail columns too."""
    if HEAD_TAIL > 0:
        mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes
                        + T.k_desc.block_type.nbytes + T.v_desc.block_type.nbytes)
        tma_load(T.k_desc, [tb, off_hkv, k0 + start_n, HEAD_DIM], kv_ready, T.k_smem)
        tma_load(T.v_desc, [tb, off_hkv, k0 + start_n, HEAD_DIM], kv_ready, T.v_smem)
    else:
        mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [tb, off_hkv, k0 + start_n, 0], kv_ready, k_smem)
    tma_load(v_desc, [tb, off_hkv, k0 + start_n, 0], kv_ready, v_smem)
    i = 0
    for g in range(0, GROUP):
        off_h = off_hkv * GROUP + g
        for seg in gl.static_range(3):  # the consumer's order
            a, b = _visit(seg, lo, full_lo, full_hi, hi)
            for start_m in range(a, b, BLOCK_M):
                s = i % STAGES
                mbarrier.wait(q_empty.index(s), ((i // STAGES) + 1) & 1, pred=i >= STAGES)
                # Q and dO, the rows' vectors, with a tail its columns
                nbytes: gl.constexpr = (q_desc.block_type.nbytes + do_desc.block_type.nbytes
                                        + lse_desc.block_type.nbytes
                                        + dl_desc.block_type.nbytes)
                if HEAD_TAIL > 0:
                    mbarrier.expect(q_ready.index(s), nbytes + T.q_desc.block_type.nbytes
                                    + T.do_desc.block_type.nbytes)
                else:
                    mbarrier.expect(q_ready.index(s), nbytes)
                row = [tb * H + off_h, r0 + start_m]
                tma_load(lse_desc, row, q_ready.index(s), lse_smem.index(s))
                tma_load(dl_desc, row, q_ready.index(s), dl_smem.index(s))
                if HEAD_TAIL > 0:
                    at = [tb, off_h, q0 + start_m, HEAD_DIM]
                    tma_load(T.q_desc, at, q_ready.index(s), T.q_smem.index(s))
                    tma_load(T.do_desc, at, q_ready.index(s), T.do_smem.index(s))
                tma_load(q_desc, [tb, off_h, q0 + start_m, 0], q_ready.index(s), q_smem.index(s))
                tma_load(do_desc, [tb, off_h, q0 + start_m, 0], q_ready.index(s),
                         do_smem.index(s))
                i += 1


@gluon.jit
def _reducer(dq_desc, dq_smem, dq_full, dq_empty, tb, off_hkv, r0, lo, full_lo, full_hi, hi, H,
             GROUP, N_ROWS, BLOCK_M: gl.constexpr, DQ_SLOTS: gl.constexpr, T,
             HEAD_TAIL: gl.constexpr):
    """Each finished dQ tile added into the fp32 buffer by the copy engine (a head-dim
    tail's part by a second reduction); its slot goes back once the engine has read it
    (the ``.read`` wait), not when the sum lands. DQ_SLOTS = 0: the consumer adds dQ
    itself; nothing to do."""
    if DQ_SLOTS > 0:
        i = 0
        for g in range(0, GROUP):
            off_h = off_hkv * GROUP + g
            for seg in gl.static_range(3):  # the consumer's order
                a, b = _visit(seg, lo, full_lo, full_hi, hi)
                for start_m in range(a, b, BLOCK_M):
                    d = i % DQ_SLOTS
                    mbarrier.wait(dq_full.index(d), (i // DQ_SLOTS) & 1)
                    tile = (tb * H + off_h) * gl.cdiv(N_ROWS, BLOCK_M) + (r0 + start_m) // BLOCK_M
                    tma_reduce_add(dq_desc, [tile * FRAG_ROWS, 0], dq_smem.index(d))
                    if HEAD_TAIL > 0:
                        tma_reduce_add(T.dq_desc, [tile * FRAG_ROWS, dq_desc.block_type.shape[1]],
                                       T.dq_smem.index(d))
                    store_wait(0)
                    mbarrier.arrive(dq_empty.index(d), count=1)
                    i += 1


@gluon.jit
def _fragments(dq, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr):
    """A dQ tile [BLOCK_M, HEAD_DIM] in the wgmma accumulator's layout seen as [chunks,
    FRAG_ROWS, 4]: element (c, t, j) is consumer thread t's register 4 c + j. A
    relabelling (no data moves): stored unswizzled, each thread writes 16-byte chunks a
    warp's 512 bytes apart, conflict-free, from one address register. The accumulator's
    bits: a row is (M warp, register bit 1, lane bits 2-4), a column (N warp, register
    bits 2 up, lane bits 0-1, register bit 0); :func:`_dq_unpack` undoes the order."""
    W: gl.constexpr = gl.num_warps()
    gl.static_assert(32 * W == FRAG_ROWS, "a fragment row per consumer thread")
    WM: gl.constexpr = BLOCK_M // 16 if BLOCK_M // 16 < W else W
    WN: gl.constexpr = W // WM
    CH: gl.constexpr = HEAD_DIM // WN // 8
    f = gl.reshape(dq, [WM, 2, 8, WN, CH, 4, 2])
    f = gl.permute(f, [4, 3, 0, 2, 5, 1, 6])
    return gl.reshape(f, [CH, FRAG_ROWS, 4])


@triton.jit
def _unpack_part(src, dst, keep, stride_d, scale, HEAD_COLS: tl.constexpr,
                 BLOCK_M: tl.constexpr, WARPS: tl.constexpr, COLS: tl.constexpr,
                 COL0: tl.constexpr, ROW: tl.constexpr, PADDED: tl.constexpr):
    """COLS columns of a dQ tile from ``src`` (its BLOCK_M x COLS values in
    :func:`_fragments`' order, in rows of ROW values of which this part's are the first
    BLOCK_M COLS / FRAG_ROWS) into columns COL0.. of the rows ``dst`` points at (``keep``:
    those to write), scaled and cast; PADDED: columns from HEAD_COLS on are not written."""
    CHUNK: tl.constexpr = BLOCK_M * COLS // (32 * WARPS)
    WM: tl.constexpr = BLOCK_M // 16 if BLOCK_M // 16 < WARPS else WARPS
    WN: tl.constexpr = WARPS // WM
    CH: tl.constexpr = COLS // WN // 8
    idx = tl.arange(0, BLOCK_M * COLS)
    if ROW == BLOCK_M * COLS // (32 * WARPS):  # one part: the tile's values in order
        f = tl.load(src + idx)
    else:  # a buffer row: CHUNK values of this part, then the other part's
        f = tl.load(src + idx // CHUNK * ROW + idx % CHUNK)
    f = tl.permute(tl.reshape(f, [CH, WN, WM, 8, 4, 2, 2]), [2, 5, 3, 1, 0, 4, 6])
    f = tl.reshape(f, [BLOCK_M, COLS])
    cols = COL0 + tl.arange(0, COLS)
    if PADDED:
        keep = keep & (cols < HEAD_COLS)[None, :]
    tl.store(dst + cols[None, :] * stride_d, (f * scale).to(dst.dtype.element_ty), mask=keep)


@triton.jit
def _dq_unpack(Acc, DQ, CU_Q, stride_b, stride_h, stride_n, stride_d, H, N_Q, N_ROWS, scale,
               HEAD_DIM: tl.constexpr, HEAD_COLS: tl.constexpr, BLOCK_M: tl.constexpr,
               WARPS: tl.constexpr, VARLEN: tl.constexpr, HEAD_TAIL: tl.constexpr = 0,
               ROW_UNIT: tl.constexpr = 1):
    """Grid (query tiles, B * H): tile t of head (b, h) of the fp32 buffer the one pass
    added dQ into, in :func:`_fragments`' order (the tiles of a head one after another,
    cdiv(N_ROWS, BLOCK_M) of them, FRAG_ROWS rows each), scaled and cast into DQ (B, H,
    Nq, D), any strides (a row of a tile: the HEAD_DIM columns' chunks, then the tail's).
    VARLEN: DQ is (1, H, total, D) and tile t of sequence b sits from its
    padded start (the row vectors' placement), its rows written from CU_Q[b]. ROW_UNIT:
    the strides' unit (:func:`~flashscope.kernels.common.in_units`)."""
    stride_b, stride_h, stride_n = in_units(stride_b, stride_h, stride_n, ROW_UNIT)
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    if VARLEN:
        q0 = tl.load(CU_Q + b)
        n_q = tl.load(CU_Q + b + 1) - q0
        tile = h * tl.cdiv(N_ROWS, BLOCK_M) + padded_start(q0, b, BLOCK_M) // BLOCK_M + t
        ob = b * 0
    else:
        q0 = 0
        n_q = N_Q
        tile = bh * tl.cdiv(N_ROWS, BLOCK_M) + t
        ob = b
    if t * BLOCK_M < n_q:
        PADDED: tl.constexpr = HEAD_COLS % (HEAD_DIM + HEAD_TAIL) != 0  # a padded head
        ROW: tl.constexpr = BLOCK_M * (HEAD_DIM + HEAD_TAIL) // (32 * WARPS)
        base = Acc + tile.to(tl.int64) * (BLOCK_M * (HEAD_DIM + HEAD_TAIL))
        rows = t * BLOCK_M + tl.arange(0, BLOCK_M)
        dst = (DQ + ob.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
               + (q0 + rows)[:, None].to(tl.int64) * stride_n)
        keep = (rows < n_q)[:, None]
        _unpack_part(base, dst, keep, stride_d, scale, HEAD_COLS, BLOCK_M, WARPS, HEAD_DIM, 0,
                     ROW, PADDED and HEAD_TAIL == 0)
        if HEAD_TAIL > 0:  # its chunks follow the others' in each row
            _unpack_part(base + BLOCK_M * HEAD_DIM // (32 * WARPS), dst, keep, stride_d, scale,
                         HEAD_COLS, BLOCK_M, WARPS, HEAD_TAIL, HEAD_DIM, ROW, PADDED)


@gluon.jit
def _tile(acc, i, start_m, q_smem, do_smem, lse_smem, dl_smem, k, v, ds_smem, dq_smem,
          q_ready, q_empty, dq_full, dq_empty, offs_n, n_q, n_k,
          qk_scale, s_zero, dq_zero, a_layout: gl.constexpr, BLOCK_M: gl.constexpr,
          HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, DQ_SLOTS: gl.constexpr,
          CAUSAL: gl.constexpr, KEYS: gl.constexpr,
          OFFSET=0, LEFT=0, RIGHT=0, BAND: gl.constexpr = False, IS_CAUSAL: gl.constexpr = False,
          HAS_LEFT: gl.constexpr = False, HAS_RIGHT: gl.constexpr = False,
          SHIFTED: gl.constexpr = False, cap_in=0.0, cap_out=0.0,
          SOFTCAP: gl.constexpr = False, T=(), dqt_zero=0.0, at_layout: gl.constexpr = None,
          HEAD_TAIL: gl.constexpr = 0, p_smem=None,
          acc_base=None, ROWS_IN: gl.constexpr = False):
    """One query tile's five products against the key tile; dQ handed to the reducer,
    or with DQ_SLOTS = 0 added into the buffer (``acc_base``: this head's first tile)
    by the consumer's own atomics (:func:`_add_dq`).
    ``acc``: (dK, dV), with a head-dim tail (dK, dV, dK's tail, dV's tail); returns it
    and i + 1. CAUSAL: the tile crosses the causal diagonal; KEYS: the key tile runs past
    the sequence's n_k keys (a packed batch's next sequence follows them). ROWS_IN: the
    tile's rows all lie below n_q, as a band's lower edge's do where no ragged key tile
    sent every tile there (``query_range``): no row mask (sm_90 D = 128 causal window
    1024: 565 instructions a tile against 601; GPU time 1.00-1.01x on causal windows of
    512 and 1024, H200). SOFTCAP: scores
    c tanh(s / c) (cap_in = scale / c, cap_out = c log2 e), their derivative 1 - tanh^2
    folded into P's copy for dS before dP's product is waited for, so no tanh tile stays
    live beside P. A head-dim tail (HEAD_TAIL > 0, ``T``) adds its columns' products to
    S^T and dP^T (onto the same accumulators) and has dV, dK and dQ products of its own
    (``at_layout``: P^T and dS^T as its operands; ``dqt_zero``: its dQ tile's zeros);
    every wait counts the products of a chain (``_chain``).

    SPLIT_D (:func:`_split_d` of the key tile: 64 keys, D = 256): the warpgroups share
    the key tile. Each forms S^T and
    dP^T for half of the query columns, P^T and dS^T go through shared memory (``p_smem``,
    ``ds_smem``) whole, and each warpgroup's dV, dK and dQ products take its half of the
    head dim from there: dK and dV of 64 keys at D = 256 take 128 registers a thread
    this way, 256 with a warpgroup per key row block."""
    dtype: gl.constexpr = q_smem.dtype
    TAILED: gl.constexpr = HEAD_TAIL > 0
    PAIR: gl.constexpr = _chain(HEAD_TAIL)
    SPLIT_D: gl.constexpr = _split_d(k.shape[0], gl.num_warps())
    s = i % STAGES
    col: gl.constexpr = gl.SliceLayout(0, s_zero.type.layout)
    mbarrier.wait(q_ready.index(s), (i // STAGES) & 1)
    q = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
    do = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
    st = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if TAILED:
        qt = T.q_smem.index(s).reshape([BLOCK_M, HEAD_TAIL])
        dot = T.do_smem.index(s).reshape([BLOCK_M, HEAD_TAIL])
        kt = T.k_smem.reshape([k.shape[0], HEAD_TAIL])
        st = warpgroup_mma(kt, qt.permute((1, 0)), st, is_async=True)
    # dP^T accumulates onto -delta, so dS^T = P^T dP^T: no delta vector (BLOCK_M / 4
    # values a thread) stays live beside P^T and dP^T
    delta = dl_smem.index(s).reshape([BLOCK_M]).load(col)
    dpt = warpgroup_mma(v, do.permute((1, 0)), s_zero - gl.expand_dims(delta, 0),
                        is_async=True)
    if TAILED:
        dpt = warpgroup_mma(T.v_smem.reshape([k.shape[0], HEAD_TAIL]), dot.permute((1, 0)),
                            dpt, is_async=True)
    # L read once both products are issued: a product's issue waits for every
    # shared-memory read before it (read before S^T's and dP^T's, the stall at dP's issue
    # was 10% of the loop's samples; 1.01-1.08x the GPU time this way, H200)
    lse2 = lse_smem.index(s).reshape([BLOCK_M]).load(col) * LOG2E
    st = warpgroup_mma_wait(PAIR, deps=(st,))
    tt = 0.0
    if SOFTCAP:
        st, tt = softcapped(st, cap_in, cap_out)
        pt = gl.exp2(st - gl.expand_dims(lse2, 0))
    else:
        pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
    if CAUSAL or KEYS or BAND:
        pt = _masked(pt, start_m, offs_n, n_q, n_k, OFFSET, LEFT, RIGHT, BLOCK_M, CAUSAL, KEYS,
                     BAND, ROWS_IN, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED, SPLIT_D)
    if SPLIT_D:
        acc = _split_products(acc, s, i, pt, dpt, tt, q, do, k, p_smem, ds_smem, acc_base,
                              start_m, BLOCK_M, HEAD_DIM, SOFTCAP, dq_zero)
    else:
        p_op = _p_operand(pt, dtype, a_layout)
        dv = warpgroup_mma(p_op, do, acc[1], is_async=True)
        if TAILED:
            dvt = warpgroup_mma(gl.convert_layout(p_op, at_layout), dot, acc[3],
                                is_async=True)
        if SOFTCAP:
            pt = pt * (1.0 - tt * tt)  # d(c tanh(s / c)) / ds
        dpt = warpgroup_mma_wait(PAIR, deps=(dpt,))
        dst = pt * dpt
        # one conversion for dK's register operand and dQ's shared one (1.02-1.04x the
        # GPU time of converting twice under a causal mask, H200); the previous tile's dQ
        # product read ds_smem: it was waited for below
        ds_op = _p_operand(dst, dtype, a_layout)
        ds_smem.store(ds_op)
        fence_async_shared()
        cta_barrier()
        dq = warpgroup_mma(ds_smem.permute((1, 0)), k, dq_zero, use_acc=False,
                           is_async=True)
        if TAILED:
            dqt = warpgroup_mma(ds_smem.permute((1, 0)), kt, dqt_zero, use_acc=False,
                                is_async=True)
        dk = warpgroup_mma(ds_op, q, acc[0], is_async=True)
        if TAILED:
            dkt = warpgroup_mma(gl.convert_layout(ds_op, at_layout), qt, acc[2],
                                is_async=True)
            dq, dqt = warpgroup_mma_wait(2, deps=(dq, dqt))
        else:
            dq = warpgroup_mma_wait(1, deps=(dq,))
        if DQ_SLOTS == 0:
            _add_dq(dq, acc_base, start_m, BLOCK_M, HEAD_DIM)
        else:
            d = i % DQ_SLOTS
            mbarrier.wait(dq_empty.index(d), ((i // DQ_SLOTS) + 1) & 1, pred=i >= DQ_SLOTS)
            frag = _fragments(dq, BLOCK_M, HEAD_DIM)
            smem_reinterpret(dq_smem.index(d), gl.float32, frag.type.shape,
                             CHUNKS).store(frag)
            if TAILED:
                frag = _fragments(dqt, BLOCK_M, HEAD_TAIL)
                smem_reinterpret(T.dq_smem.index(d), gl.float32, frag.type.shape,
                                 CHUNKS).store(frag)
            fence_async_shared()
            cta_barrier()
            mbarrier.arrive(dq_full.index(d), count=1)
        if TAILED:
            dk, dv, dkt, dvt = warpgroup_mma_wait(0, deps=(dk, dv, dkt, dvt))
            acc = (dk, dv, dkt, dvt)
        else:
            dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
            acc = (dk, dv)
    mbarrier.arrive(q_empty.index(s), count=1)
    return acc, i + 1


@gluon.jit
def _masked(pt, start_m, offs_n, n_q, n_k, OFFSET, LEFT, RIGHT, BLOCK_M: gl.constexpr,
            CAUSAL: gl.constexpr, KEYS: gl.constexpr, BAND: gl.constexpr,
            ROWS_IN: gl.constexpr, IS_CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr,
            HAS_RIGHT: gl.constexpr, SHIFTED: gl.constexpr, SPLIT_D: gl.constexpr):
    """P^T with zeros where its query columns (from start_m) do not see its keys
    ``offs_n``: past the diagonal (CAUSAL), past n_k (KEYS), outside the band (BAND, with
    :func:`~flashscope.kernels.keyrange.visible`'s switches) and, unless ROWS_IN, past n_q.

    With a warpgroup per 64 key rows a thread's query columns are 2 (lane % 4) plus a
    constant of the register (0, 1, 8, 9, 16, ...). The thread's share (bits 1 and 2) goes
    to the keys' side, two values a thread, and each element compares its register's
    constant against them (:func:`~flashscope.kernels.keyrange.visible_from`): sm_90,
    D = 64, 128 rows, causal window 1024, 840 and 937 instructions a tile in the edges'
    loops against 1,443 and 1,516 comparing the indices, and the whole tiles' loop no
    longer spills (8 loads a tile before); 1.07-1.10x the GPU time of the dense causal
    backward (H200). With the warpgroups side by side along the queries (SPLIT_D) the
    indices are compared as they are: moved there, D = 256's builds spilled 3-6
    registers more."""
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, pt.type.layout))
    if SPLIT_D:
        own = gl.expand_dims(start_m + cols, 0)
        keys = gl.expand_dims(offs_n, 1)
        rows_left = n_q
    else:
        own = gl.expand_dims(cols & ~6, 0)
        first = start_m + (cols & 6)
        keys = gl.expand_dims(offs_n, 1) - gl.expand_dims(first, 0)
        rows_left = gl.expand_dims(n_q - first, 0)
    if CAUSAL:
        pt = gl.where(own >= keys, pt, 0.0)
    if KEYS:
        pt = gl.where(gl.expand_dims(offs_n < n_k, 1), pt, 0.0)
    if BAND:
        if SPLIT_D:
            keep = visible(own, keys, OFFSET, LEFT, RIGHT, IS_CAUSAL, HAS_LEFT, HAS_RIGHT,
                           SHIFTED)
        else:
            keep = visible_from(own, keys, OFFSET, LEFT, RIGHT, IS_CAUSAL, HAS_LEFT,
                                HAS_RIGHT, SHIFTED)
        if not ROWS_IN:
            keep = keep & (own < rows_left)
        pt = gl.where(keep, pt, 0.0)
    return pt


@gluon.jit
def _split_products(acc, s, i, pt, dpt, tt, q, do, k, p_smem, ds_smem, acc_base, start_m,
                    BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, SOFTCAP: gl.constexpr,
                    dq_zero):
    """:func:`_tile`'s last three products where the warpgroups split the head dim
    (SPLIT_D): P^T and dS^T (each warpgroup's query columns) into shared memory, then
    dQ = dS K, dV += P^T dO and dK += dS^T Q from there, each over this warpgroup's half
    of D, dQ added by atomics under dV's and dK's products. P^T and dS^T take one of two
    slots by the tile's parity: the other warpgroup may still be reading the last tile's
    (one barrier a tile fewer; 0.94-1.04x the GPU time of one slot, median 1.01x, H200).
    dV waits for dS^T: issued as soon as P^T was stored, under dP^T's wait, it read
    0.92-1.01x (median 0.96x)."""
    dtype: gl.constexpr = q.dtype
    pts = p_smem.index(i % 2)
    dsts = ds_smem.index(i % 2)
    if SOFTCAP:
        pt_ds = pt * (1.0 - tt * tt)  # d(c tanh(s / c)) / ds
    else:
        pt_ds = pt
    dpt = warpgroup_mma_wait(0, deps=(dpt,))
    dst = pt_ds * dpt
    pts.store(pt.to(dtype))
    dsts.store(dst.to(dtype))
    fence_async_shared()
    cta_barrier()
    dq = warpgroup_mma(dsts.permute((1, 0)), k, dq_zero, use_acc=False, is_async=True)
    dv = warpgroup_mma(pts, do, acc[1], is_async=True)
    dk = warpgroup_mma(dsts, q, acc[0], is_async=True)
    dq = warpgroup_mma_wait(2, deps=(dq,))
    _add_dq(dq, acc_base, start_m, BLOCK_M, HEAD_DIM)
    dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
    return dk, dv


@gluon.jit
def _add_dq(dq, acc_base, start_m, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr):
    """dQ [BLOCK_M, HEAD_DIM] added into query tile start_m // BLOCK_M of the buffer at
    ``acc_base`` (a head's tiles one after another) by 16-byte fp32 atomics, in
    :func:`_fragments`' order, where the TMA reduction puts it: each thread adds its
    registers 4 c .. 4 c + 3 at chunk c, a warp's 512 bytes side by side."""
    W: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32, 1], [1, W, 1], [2, 1, 0])
    frag = gl.convert_layout(_fragments(dq, BLOCK_M, HEAD_DIM), layout)
    CH: gl.constexpr = frag.shape[0]
    c = gl.arange(0, CH, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    t = gl.arange(0, FRAG_ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    j = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    offs = ((gl.expand_dims(gl.expand_dims(c, 1), 2) * FRAG_ROWS
             + gl.expand_dims(gl.expand_dims(t, 0), 2)) * 4
            + gl.expand_dims(gl.expand_dims(j, 0), 1))
    base = acc_base + (start_m // BLOCK_M).to(gl.int64) * (BLOCK_M * HEAD_DIM)
    gl.atomic_add(base + offs, frag, sem="relaxed")


@gluon.jit
def _consumer(q_smem, do_smem, k_smem, v_smem, lse_smem, dl_smem, ds_smem, dq_smem, kv_ready,
              q_ready, q_empty,
              dq_full, dq_empty, DK, DV, stride_dkb, stride_dkh, stride_dkn,
              stride_dvb, stride_dvh, stride_dvn, tb, off_hkv, r0, k0, n_q, n_k, start_n,
              lo, full_lo, full_hi, hi, H, GROUP, N_ROWS, qk_scale, scale, OFFSET, LEFT, RIGHT,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, DQ_SLOTS: gl.constexpr,
              VARLEN: gl.constexpr, BAND: gl.constexpr,
              HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SHIFTED: gl.constexpr,
              cap_in, cap_out, SOFTCAP: gl.constexpr, KEY_TAIL: gl.constexpr,
              dk_desc, dv_desc, DKV_TMA: gl.constexpr, HEAD_COLS: gl.constexpr, T,
              HEAD_TAIL: gl.constexpr, p_smem, ACC):
    """The five products of every query tile against this key tile (:func:`_tile`); dK
    and dV (and a head-dim tail's, ``T``) stored at the end. The whole tiles [full_lo,
    full_hi) first, then in a loop of their own the masked ones: under a causal mask
    those that cross the diagonal (below start_n + BLOCK_N), and every one where the key
    tile runs past n_k (zero-filled rows, or a packed sequence's next keys); under a band
    its two edges after them, each in a loop of its own (:func:`_visit`)."""
    W: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = k_smem.dtype
    SPLIT_D: gl.constexpr = _split_d(BLOCK_N, W)
    if SPLIT_D:  # S^T and dP^T: each warpgroup half the query columns; dK, dV: half of D
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[W // 2, 2], instr_shape=[16, BLOCK_M // 2, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[W // 2, 2], instr_shape=[16, HEAD_DIM // 2, 16])
    else:  # S^T and dP^T: [BLOCK_N, BLOCK_M], a warpgroup per 64 key rows; dK, dV too
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BLOCK_M, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, HEAD_DIM, 16])
    # dQ: [BLOCK_M, D], the warpgroups side by side along D
    WM: gl.constexpr = BLOCK_M // 16 if BLOCK_M // 16 < W else W
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WM, W // WM],
        instr_shape=[16, HEAD_DIM // (W // WM), 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    TAILED: gl.constexpr = HEAD_TAIL > 0

    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    if TAILED:  # the tail's dK, dV and dQ tiles, laid out as the others
        t_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, HEAD_TAIL, 16])
        at_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=t_layout,
                                                      k_width=2)
        dqt_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WM, W // WM],
            instr_shape=[16, HEAD_TAIL // (W // WM), 16])
        dqt_zero = gl.zeros([BLOCK_M, HEAD_TAIL], gl.float32, dqt_layout)
        acc = (dk, dv, gl.zeros([BLOCK_N, HEAD_TAIL], gl.float32, t_layout),
               gl.zeros([BLOCK_N, HEAD_TAIL], gl.float32, t_layout))
    else:
        at_layout: gl.constexpr = a_layout
        dqt_zero = 0.0
        acc = (dk, dv)
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))

    mbarrier.wait(kv_ready, 0)
    k = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v = v_smem.reshape([BLOCK_N, HEAD_DIM])
    i = 0
    for g in range(0, GROUP):
        bh = tb * H + off_hkv * GROUP + g
        acc_base = ACC + (bh.to(gl.int64) * gl.cdiv(N_ROWS, BLOCK_M) + r0 // BLOCK_M) * (
            BLOCK_M * HEAD_DIM)
        # the whole tiles (seg 0) and the masked ones (seg 1; a band's upper edge seg 2) in
        # loops of their own, so the whole tiles' carries no mask (13 spilled registers
        # fewer in sm_90's loop, 1.02-1.05x the GPU time of one loop masking where start_m
        # < start_n + BLOCK_N, H200), in :func:`_visit`'s order, which the producer and
        # reducer follow
        for seg in gl.static_range(3 if BAND else 2):
            a, b = _visit(seg, lo, full_lo, full_hi, hi)
            for start_m in range(a, b, BLOCK_M):
                acc, i = _tile(acc, i, start_m, q_smem, do_smem, lse_smem, dl_smem, k, v,
                               ds_smem, dq_smem, q_ready, q_empty, dq_full, dq_empty, offs_n,
                               n_q, n_k, qk_scale, s_zero, dq_zero, a_layout, BLOCK_M,
                               HEAD_DIM, STAGES, DQ_SLOTS, IS_CAUSAL and seg > 0 and not BAND,
                               KEY_TAIL and seg > 0, OFFSET, LEFT, RIGHT, BAND and seg > 0,
                               IS_CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED, cap_in=cap_in,
                               cap_out=cap_out, SOFTCAP=SOFTCAP, T=T, dqt_zero=dqt_zero,
                               at_layout=at_layout, HEAD_TAIL=HEAD_TAIL,
                               p_smem=p_smem, acc_base=acc_base,
                               ROWS_IN=seg == 1 and not KEY_TAIL)

    dk = (acc[0] * scale).to(dtype)
    dv = acc[1].to(dtype)
    PADDED: gl.constexpr = HEAD_COLS % (HEAD_DIM + HEAD_TAIL) != 0  # columns past D
    # DKV_TMA: dK and dV staged in the Q and dO rings (every tile there was consumed) and
    # stored by TMA, which clips at Nk: 1.01-1.12x the GPU time of storing the registers
    # (H200, D = 64 and 128, 512-32k keys, bands and packed batches), whose 4-byte stores
    # stalled on the store queue. A packed sequence's tile past its end would overwrite
    # the next sequence's rows: that one stores from registers. (A runtime test in the
    # dense build too: Triton 3.6 fails to build the consumer with the register path
    # compiled out.)
    staged = False
    if DKV_TMA:
        if VARLEN:
            staged = start_n + BLOCK_N <= n_k
        else:
            staged = start_n < n_k
    if staged:
        _stage_store(dk, q_smem, dk_desc, tb, off_hkv, k0 + start_n)
        _stage_store(dv, do_smem, dv_desc, tb, off_hkv, k0 + start_n)
        if TAILED:
            _stage_store((acc[2] * scale).to(dtype), T.q_smem, T.dk_desc, tb, off_hkv,
                         k0 + start_n, HEAD_DIM)
            _stage_store(acc[3].to(dtype), T.do_smem, T.dv_desc, tb, off_hkv, k0 + start_n,
                         HEAD_DIM)
        store_wait(0)
    else:
        _store_rows(dk, dv, DK, DV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh,
                    stride_dvn, tb, off_hkv, k0, start_n, n_k, 0, HEAD_COLS,
                    PADDED and not TAILED)
        if TAILED:
            _store_rows((acc[2] * scale).to(dtype), acc[3].to(dtype), DK, DV, stride_dkb,
                        stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn, tb,
                        off_hkv, k0, start_n, n_k, HEAD_DIM, HEAD_COLS, PADDED)


@gluon.jit
def _store_rows(dk, dv, DK, DV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh,
                stride_dvn, tb, off_hkv, k0, start_n, n_k, COL0: gl.constexpr,
                HEAD_COLS: gl.constexpr, PADDED: gl.constexpr):
    """``dk`` and ``dv`` (16-bit [BLOCK_N, cols] in the accumulators' layout) from
    registers into columns COL0.. of key rows start_n.. of head (tb, off_hkv), the rows
    from n_k on left out (a packed sequence's last tile would overwrite the next one's);
    PADDED: columns from HEAD_COLS on left out too."""
    layout: gl.constexpr = dk.type.layout
    kr = start_n + gl.arange(0, dk.shape[0], layout=gl.SliceLayout(1, layout))
    kc = COL0 + gl.arange(0, dk.shape[1], layout=gl.SliceLayout(0, layout))
    kmask = gl.expand_dims(kr < n_k, 1)
    if PADDED:  # a padded head: its columns past D are not stored
        kmask = kmask & gl.expand_dims(kc < HEAD_COLS, 0)
    ob = tb.to(gl.int64)
    oh = off_hkv.to(gl.int64)
    kr64 = gl.expand_dims((k0 + kr).to(gl.int64), 1)
    gl.store(DK + ob * stride_dkb + oh * stride_dkh + kr64 * stride_dkn + kc[None, :],
             dk, mask=kmask)
    gl.store(DV + ob * stride_dvb + oh * stride_dvh + kr64 * stride_dvn + kc[None, :],
             dv, mask=kmask)


@gluon.jit
def _stage_store(x, ring, desc, b, h, row, col=0):
    """``x`` (16-bit [BLOCK_N, cols], both consumer warpgroups' rows) to rows [row, row +
    BLOCK_N), columns from ``col``, of head (b, h) through a ring's shared memory (STAGES x
    BLOCK_M >= BLOCK_N rows, the same swizzle as the descriptor's) and one TMA store."""
    slot = smem_reinterpret(ring, x.dtype, [1, 1, x.shape[0], x.shape[1]], desc.layout)
    slot.store(gl.reshape(x, [1, 1, x.shape[0], x.shape[1]]))
    fence_async_shared()
    cta_barrier()
    tma_store(desc, [b, h, row, col], slot)


@gluon.jit
def _attn_bwd_sm90(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_desc, dl_desc, dk_desc,
                   dv_desc, DK, DV, ACC, CU_Q, CU_K, LIST,
                   stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                   H, HKV, N_Q, N_K, N_ROWS, qk_scale, scale, OFFSET, LEFT, RIGHT, cap_in,
                   cap_out, q_tail, k_tail, v_tail, do_tail, dk_tail, dv_tail, dq_tail,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr, DQ_SLOTS: gl.constexpr, IS_CAUSAL: gl.constexpr,
                   WORKER_REGS: gl.constexpr, SECTION: gl.constexpr,
                   VARLEN: gl.constexpr, HAS_LEFT: gl.constexpr = False,
                   HAS_RIGHT: gl.constexpr = False, SHIFTED: gl.constexpr = False,
                   SOFTCAP: gl.constexpr = False, KEY_TAIL: gl.constexpr = False,
                   DKV_TMA: gl.constexpr = False, HEAD_COLS: gl.constexpr = 0,
                   HEAD_TAIL: gl.constexpr = 0):
    """Grid (cdiv(N_K, BLOCK_N), B * HKV): a program owns one key tile of one kv head of
    one batch. qk_scale = scale * log2(e). dK, dV last dims contiguous.

    HEAD_TAIL > 0: the head dim runs as HEAD_DIM columns and HEAD_TAIL more, read and
    written through the ``*_tail`` descriptors (blocks (1, 1, rows, HEAD_TAIL); None
    without a tail); in the dQ buffer a row of a tile holds its HEAD_DIM columns' chunks,
    then the tail's (``dq_tail``: block (FRAG_ROWS, the tail's), from the column after).

    ACC: the fp32 dQ buffer ``dq_desc`` reads, which the consumer adds into by atomics
    where DQ_SLOTS = 0.

    VARLEN: a packed batch. The tensors are (1, H, total, D) (N_Q = total_q), CU_Q and
    CU_K the (B + 1,) int32 prefix sums, N_K the longest sequence's keys; the grid (L,)
    runs LIST, the device-built order of the batch's key tiles
    (:func:`~flashscope.kernels.packed_worklist._key_list`, longest sequences first);
    an entry of -1 has nothing to do. Tiles are placed from the sequence's first row, so a
    tile's rows past the sequence are the next one's: a key row there is masked
    (:func:`_consumer`);
    a query row reads a log-sum-exp of +inf (P = 0, its dQ row adds zeros) from the row
    vectors, where the delta launch put sequence b's rows from r0, a multiple of BLOCK_M
    (:func:`~flashscope.kernels.attention_bwd.padded_start`), followed by +inf and 0 to its
    last tile's end.

    Dense, SECTION = 0: program (n, bh) takes key tile n of bh, so programs start head by
    head. SECTION = S: the programs are ordered in sections of S (batch, kv head) pairs, key
    tile by key tile within a section, so under a causal mask (where key tile n's program
    visits the query tiles from n on) a section's longest programs start first and the
    shortest fill the last wave."""
    if VARLEN:
        N_N = gl.cdiv(N_K, BLOCK_N)
        listed = gl.load(LIST + gl.program_id(0))
        entry = gl.maximum(listed, 0)
        pid_n = entry % N_N
        pid_bh = entry // N_N
    elif SECTION > 0:
        T = gl.num_programs(0)
        BHN = gl.num_programs(1)
        pid = gl.program_id(1) * T + gl.program_id(0)
        sec = pid // (SECTION * T)
        r = pid - sec * SECTION * T
        width = gl.minimum(BHN - sec * SECTION, SECTION)
        pid_n = r // width
        pid_bh = sec * SECTION + r % width
    else:
        pid_n = gl.program_id(0)
        pid_bh = gl.program_id(1)
    off_b = pid_bh // HKV
    off_hkv = pid_bh % HKV
    GROUP = H // HKV
    start_n = pid_n * BLOCK_N
    lo = _first_query(start_n, IS_CAUSAL, BLOCK_M)
    if VARLEN:
        q0 = gl.load(CU_Q + off_b)
        n_q = gl.load(CU_Q + off_b + 1) - q0
        k0 = gl.load(CU_K + off_b)
        n_k = gl.load(CU_K + off_b + 1) - k0
        n_k = gl.where(listed >= 0, n_k, 0)  # an empty slot: no keys, nothing stored
        r0 = padded_start(q0, off_b, BLOCK_M)  # where the delta launch put its rows
        tb = off_b * 0  # the views' batch index, 0, as a tensor like the dense one's
        hi = n_q
        if start_n >= n_k:  # a key tile past the sequence's end: nothing to visit
            hi = lo
    else:
        q0 = 0
        r0 = 0
        n_q = N_Q
        k0 = 0
        n_k = N_K
        tb = off_b
        hi = N_Q
    BAND: gl.constexpr = HAS_LEFT or HAS_RIGHT or SHIFTED
    # without a band every query tile sees the whole key tile but those the causal
    # diagonal crosses (up to start_n + BLOCK_N) and, where the key tile runs past n_k,
    # every one (its zero-filled keys would score 0: P = 2^(0 - L), inf for a row whose
    # scores were all very negative)
    full_lo = lo
    if IS_CAUSAL:
        full_lo = gl.minimum(start_n + BLOCK_N, hi)
    if KEY_TAIL:
        if start_n + BLOCK_N > n_k:
            full_lo = hi
    full_hi = hi
    shift = OFFSET
    if BAND:
        if VARLEN:
            shift = n_k - n_q  # each sequence aligned on its own lengths
        lo, full_lo, full_hi, hi = query_range(start_n, n_q, shift, LEFT, RIGHT, BLOCK_N,
                                               BLOCK_M, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
        if KEY_TAIL:
            if start_n + BLOCK_N > n_k:  # keys past n_k in the tile: every query tile masked
                full_lo = hi
                full_hi = hi
        if VARLEN:
            if start_n >= n_k:
                hi = lo
                full_lo = lo
                full_hi = lo
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM],
                                        do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    st_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    if _split_d(BLOCK_N, gl.num_warps()):  # P^T and dS^T through here, 2 slots each
        ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], st_layout)
        p_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], st_layout)
    else:
        ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], st_layout)
        p_smem = ds_smem
    if DQ_SLOTS > 0:
        dq_smem = gl.allocate_shared_memory(
            gl.float32, [DQ_SLOTS, FRAG_ROWS, BLOCK_M * HEAD_DIM // FRAG_ROWS], dq_desc.layout)
    else:  # dQ by the consumer's atomics: a slot's handle, no slot
        dq_smem = gl.allocate_shared_memory(gl.float32, [1, 1, 4], dq_desc.layout)
    if HEAD_TAIL > 0:  # the tail's columns of the Q and dO rings, K, V and the dQ slots
        ring_t: gl.constexpr = [STAGES, 1, 1, BLOCK_M, HEAD_TAIL]
        T = Tail(q_tail, k_tail, v_tail, do_tail, dk_tail, dv_tail, dq_tail,
                 gl.allocate_shared_memory(dtype, ring_t, q_tail.layout),
                 gl.allocate_shared_memory(dtype, ring_t, do_tail.layout),
                 gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_TAIL], k_tail.layout),
                 gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_TAIL], v_tail.layout),
                 gl.allocate_shared_memory(
                     gl.float32, [DQ_SLOTS, FRAG_ROWS, BLOCK_M * HEAD_TAIL // FRAG_ROWS],
                     dq_tail.layout))
    else:
        T = ()
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], lse_desc.layout)
    dl_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], dl_desc.layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    SLOTS: gl.constexpr = DQ_SLOTS + (DQ_SLOTS == 0)  # barriers for at least one
    dq_full = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(SLOTS):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    gl.warp_specialize(
        [(_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, dl_smem, ds_smem, dq_smem,
                      kv_ready, q_ready, q_empty, dq_full, dq_empty, DK, DV,
                      stride_dkb, stride_dkh,
                      stride_dkn, stride_dvb, stride_dvh, stride_dvn, tb, off_hkv, r0, k0,
                      n_q, n_k, start_n, lo, full_lo, full_hi, hi, H, GROUP, N_ROWS, qk_scale,
                      scale, shift, LEFT, RIGHT,
                      HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL, DQ_SLOTS,
                      VARLEN, BAND, HAS_LEFT, HAS_RIGHT, SHIFTED, cap_in, cap_out, SOFTCAP,
                      KEY_TAIL, dk_desc, dv_desc, DKV_TMA, HEAD_COLS, T, HEAD_TAIL,
                      p_smem, ACC)),
         (_producer, (q_desc, k_desc, v_desc, do_desc, lse_desc, dl_desc, q_smem, do_smem,
                      k_smem, v_smem, lse_smem, dl_smem, kv_ready, q_ready, q_empty, tb,
                      off_hkv, q0, r0, k0, start_n, lo, full_lo, full_hi, hi, H, N_ROWS, GROUP,
                      BLOCK_M, STAGES, T, HEAD_DIM, HEAD_TAIL)),
         (_reducer, (dq_desc, dq_smem, dq_full, dq_empty, tb, off_hkv, r0, lo, full_lo,
                     full_hi, hi, H, GROUP, N_ROWS, BLOCK_M, DQ_SLOTS, T, HEAD_TAIL))],
        [1, 1], [WORKER_REGS, WORKER_REGS])
