"""The persistent grid's work list: which program runs which (head, row block), in what
order.

Two things pull against each other. Balance: causal row blocks differ in length (block m
of BLOCK_M rows reads ceil(min(Nk, (m + 1) BLOCK_M) / BLOCK_N) key tiles), so programs
must draw long and short blocks in the right mix. Locality: the programs running at one
moment should read the K and V of few heads, so those stay in L2. Sorting every head's
blocks by length (all heads' last block first) balances well and ruins locality: at
N = 4096, D = 64 the 132 programs of one moment read 124 heads' K and V, 124 MB against
the H100's 50 MB of L2, and Nsight Compute counted a 9% L2 hit rate and DRAM at 67-70%
of its peak.

So the list is cut into sections of S heads whose K and V fit in half the L2 (other
data streams through the rest), each section sorted longest block first, and the
blocks are assigned greedily: in list order, each to the program with the least work so
far (cost: key tiles + ``TILE_OVERHEAD`` for the prologue and epilogue), which is what a
dynamic scheduler with an atomic counter would do if the cost model held. The programs
then move through the list together (locality), and greedy longest-first list
scheduling ends within one block of the best balance.

With ``BALANCE`` (:class:`flashscope.families.sm90_fwd.Sm90FwdConfig`) the list knows the
padding. When BLOCK_M does not divide Nq, a head's last row block holds ``Nq mod
BLOCK_M`` real rows, and its consumers whose rows are all padding pass their key tiles
on, so the block costs less than a whole one (:func:`block_cost`, :data:`LONE_SHARE`);
and the heads are split into sections of nearly equal size (:func:`_sections`). A
non-causal grid has a list only with BALANCE. Its blocks all read every key tile, so
dealt round-robin they leave the programs a ragged last round: at Nq = 4096 and BLOCK_M
= 192, 2816 blocks over 132 programs take 22 rounds, where the last block of each head
costs about two thirds of a whole one and the work is 21.0. The list deals the whole
blocks head by head, as round-robin would (the programs of one moment then read the K
and V of one or two heads), then the cheap ones greedily, where the others' last round
leaves room; each program runs a cheap block after its whole blocks of the same
section, while that head's K and V may still be in L2.

The result is a CSR array of int32: ``offsets[P + 1]`` then the blocks of program 0,
program 1, ..., each ``pid_bh * n_m + pid_m``. Program p runs
``blocks[offsets[p]:offsets[p + 1]]`` in order.
"""

from __future__ import annotations

import functools
import heapq
import math
from typing import Optional

import numpy as np

#: key tiles' worth of time per work tile outside the loop (Q load, first product, the
#: last P V, the epilogue): a cost-model constant, not a measurement to three digits.
TILE_OVERHEAD = 2.0
#: share of the L2 cache the K and V of one section may fill.
L2_SHARE = 0.5


#: query rows of one consumer warpgroup: the unit a row block's padding is passed in.
CONSUMER_ROWS = 64
#: time per key tile of a block with one consumer of real rows, as a share of a whole
#: block's: 0.63 at D = 64, 192 x 128, three consumers (the kernel's clock stamps:
#: 0.635 of a whole block's time at Nq = 16384, 0.70 at 1024 where
#: the fixed cost per block weighs more; 0.63 too for the padded last block of a causal
#: head at 16384). The lone consumer's chain is latency-bound, so it takes far
#: more than the third of the block its rows are. Two of three: interpolated.
LONE_SHARE = 0.63


def key_tiles(m: int, block_m: int, block_n: int, n_k: int, causal: bool = True) -> int:
    """Key tiles of row block m (rows m*block_m ..): causal, keys up to the block's last
    row; else all of them."""
    return math.ceil((min(n_k, (m + 1) * block_m) if causal else n_k) / block_n)


def block_cost(m: int, block_m: int, block_n: int, n_k: int, causal: bool = True,
               n_q: Optional[int] = None) -> float:
    """Cost of row block m in key tiles: its key tiles + ``TILE_OVERHEAD``. Given the
    query rows ``n_q``, a block whose k of C consumers (64 rows each) hold a row below
    it (the others pass) costs its key tiles times ``LONE_SHARE`` for k = 1, rising
    linearly to 1 at k = C; without, every block is costed whole."""
    tiles = key_tiles(m, block_m, block_n, n_k, causal)
    if n_q is not None:
        consumers = math.ceil(block_m / CONSUMER_ROWS)
        k = max(1, math.ceil(min(block_m, n_q - m * block_m) / CONSUMER_ROWS))
        if k < consumers:
            tiles *= LONE_SHARE + (1 - LONE_SHARE) * (k - 1) / (consumers - 1)
    return tiles + TILE_OVERHEAD


def section_heads(n_k: int, head_dim: int, elt_bytes: int, l2_bytes: int, bh: int) -> int:
    """Heads per section: as many as have K and V (2 n_k head_dim elt_bytes each) within
    L2_SHARE of the L2, at least one, at most all."""
    per_head = 2 * n_k * head_dim * elt_bytes
    return max(1, min(bh, int(l2_bytes * L2_SHARE) // per_head))


def _sections(bh: int, section: int, even: bool) -> list:
    """Section boundaries [0, .., bh]: ``section`` heads each and the rest last, or with
    ``even`` as many sections, of sizes that differ by at most one head. A last section
    of one or two heads has too few blocks to even out the programs' last round: at
    N = 4096, D = 64, 128 heads in sections of 25 leave 3 heads (66 blocks) for 132
    programs, and the list's cost model puts the longest program 5.6% over the mean
    where six sections of 21-22 heads leave it 0.6% over."""
    n = -(-bh // section)
    if not even:
        return [min(bh, i * section) for i in range(n + 1)]
    return [i * (bh // n) + min(i, bh % n) for i in range(n + 1)]


@functools.lru_cache(maxsize=256)
def lpt_schedule(n_m: int, bh: int, block_m: int, block_n: int, n_k: int, programs: int,
                 section: int, causal: bool = True, n_q: Optional[int] = None) -> np.ndarray:
    """The CSR work list of the module docstring, for ``programs`` programs over n_m row
    blocks of each of bh heads, sections of ``section`` heads. ``n_q`` (query rows,
    ``n_m = ceil(n_q / block_m)``; needed non-causal): blocks are costed by the
    consumers that hold real rows (:func:`block_cost`), else whole. Read-only (cached)."""
    if min(n_m, bh, block_m, block_n, n_k, programs, section) < 1:
        raise ValueError(f"lpt_schedule: every argument must be >= 1, got n_m={n_m}, "
                         f"bh={bh}, block_m={block_m}, block_n={block_n}, n_k={n_k}, "
                         f"programs={programs}, section={section}")
    if (n_q is not None or not causal) and math.ceil((n_q or 0) / block_m) != n_m:
        raise ValueError(f"lpt_schedule: n_q must have ceil(n_q / block_m) = n_m = {n_m} "
                         f"(and is needed non-causal), got n_q={n_q}")
    costs = [block_cost(m, block_m, block_n, n_k, causal, n_q) for m in range(n_m)]
    bounds = _sections(bh, section, even=n_q is not None)
    if causal:  # by section: the dearest first (among equals the later block), each
        # across the section's heads
        order = sorted(range(n_m - 1, -1, -1), key=lambda m: -costs[m])
        items = [(h, m) for a, b in zip(bounds[:-1], bounds[1:])
                 for m in order for h in range(a, b)]
    else:  # whole blocks head by head (round-robin, as without a list), then the rest
        items = sorted(((h, m) for h in range(bh) for m in range(n_m)),
                       key=lambda hm: -costs[hm[1]])
    heap = [(0.0, p) for p in range(programs)]
    lists = [[] for _ in range(programs)]
    for h, m in items:
        load, p = heapq.heappop(heap)
        lists[p].append((h, m))
        heapq.heappush(heap, (load + costs[m], p))
    if not causal:  # each cheap block runs after its program's whole ones of its section
        sec = np.searchsorted(bounds, np.arange(bh), side="right") - 1  # each head's
        lists = [sorted(x, key=lambda hm: (sec[hm[0]], -costs[hm[1]], hm)) for x in lists]
    lists = [[h * n_m + m for h, m in x] for x in lists]
    offsets = np.zeros(programs + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in lists])
    flat = np.fromiter((t for x in lists for t in x), dtype=np.int64, count=n_m * bh)
    out = np.concatenate([offsets, flat]).astype(np.int32)
    out.setflags(write=False)
    return out


def makespan(schedule: np.ndarray, programs: int, n_m: int, block_m: int, block_n: int,
             n_k: int, causal: bool = True, n_q: Optional[int] = None,
             split: bool = False) -> tuple:
    """(largest, mean) per-program cost of a schedule under the cost model
    (:func:`block_cost`); ``split``: a list of :func:`split_schedule`, whose pieces cost
    their share of the block's key tiles and a whole ``TILE_OVERHEAD`` each."""
    offsets = schedule[:programs + 1]
    n = int(offsets[-1])
    blocks = schedule[programs + 1:programs + 1 + n]
    ranges = schedule[programs + 1 + n:programs + 1 + 2 * n] if split else None
    loads = []
    for p in range(programs):
        load = 0.0
        for e in range(offsets[p], offsets[p + 1]):
            m = int(blocks[e]) % n_m
            cost = block_cost(m, block_m, block_n, n_k, causal, n_q)
            if split:
                share = (int(ranges[e]) >> 16) - (int(ranges[e]) & 0xFFFF)
                cost = TILE_OVERHEAD + (cost - TILE_OVERHEAD) * share / key_tiles(
                    m, block_m, block_n, n_k, causal)
            load += cost
        loads.append(load)
    return max(loads), sum(loads) / programs


#: fewest key tiles a piece of a split row block holds: each piece pays a work tile's
#: fixed cost (``TILE_OVERHEAD``) and a pass of the merge.
MIN_PIECE = 4


def split_points(m: int, block_m: int, block_n: int, n_k: int, n_q: int, causal: bool,
                 masked_first: bool, passing: bool = True) -> "tuple | None":
    """(lo, hi): the positions s at which row block m may be cut into [.., s) and [s, ..)
    in its order of key tiles (:func:`flashscope.kernels.sm90_worklist._key_tile`),
    lo <= s <= hi; None when it may not be cut at all.

    Every piece must give every consumer warpgroup (64 rows) at least one of its own key
    tiles: its first one sets the row maximum, and a piece with none would need a
    separate empty output. Consumer 0 owns the fewest, the first ``own`` tiles (causal:
    up to its last row's diagonal), or with MASKED_FIRST the last ``own`` positions.
    Where consumers of padding only (rows at or past Nq) pass their tiles (``passing``:
    causal, or BALANCE) a block holding one is never cut; else they compute like the
    others. Non-causal without MASKED_FIRST no piece starts at the last key tile, the only
    one that may mask: the kernel masks a piece's first tile as key tile 0."""
    consumers = math.ceil(block_m / CONSUMER_ROWS)
    if passing and math.ceil(min(block_m, n_q - m * block_m) / CONSUMER_ROWS) < consumers:
        return None
    tiles = key_tiles(m, block_m, block_n, n_k, causal)
    own = math.ceil(min(n_k, m * block_m + CONSUMER_ROWS) / block_n) if causal else tiles
    lo, hi = ((tiles - own + 1, tiles - 1) if masked_first else
              (1, own - 1) if causal else (1, tiles - 2))
    return (lo, hi) if lo <= hi else None


def _place(pool, loads, cap):
    """Place pooled blocks (t, key tiles, split points or None, cost per key tile) on the
    programs, the least loaded first, cutting a block where a program's room under
    ``cap`` ends: McNaughton's wrap-around rule for preemptive scheduling, with each
    piece paying ``TILE_OVERHEAD`` and cut only at its split points. Returns (final
    loads, placed [(p, t, lo, hi)])."""
    heap = [(load, p) for p, load in enumerate(loads)]
    heapq.heapify(heap)
    placed = []
    for t, tiles, cuts, per_tile in pool:
        lo = 0
        while lo < tiles:
            load, p = heapq.heappop(heap)
            room = (cap - load - TILE_OVERHEAD) / per_tile
            s = tiles
            if tiles - lo > room and cuts is not None:
                s = min(lo + int(room), cuts[1], tiles - MIN_PIECE)
                if s - lo < MIN_PIECE or s < cuts[0]:
                    s = tiles  # no cut fits: the rest goes whole where most room is
            placed.append((p, t, lo, s))
            heapq.heappush(heap, (load + (s - lo) * per_tile + TILE_OVERHEAD, p))
            lo = s
    return [load for load, _ in heap], placed


def pack_entries(entries: list, slot_of: dict) -> np.ndarray:
    """The kernel's SPLIT_KV list (int32) of each program's entries [(tile, lo, hi)]:
    offsets[P + 1], then the L tiles, key ranges ``lo | hi << 16`` and workspace slots
    (``slot_of[tile, lo]``, -1 for a whole block written out directly)."""
    flat = [e for x in entries for e in x]
    offs = np.zeros(len(entries) + 1, dtype=np.int64)
    offs[1:] = np.cumsum([len(x) for x in entries])
    cols = np.array([(t, lo | hi << 16, slot_of.get((t, lo), -1)) for t, lo, hi in flat],
                    dtype=np.int64).reshape(-1, 3)
    return np.concatenate([offs, cols[:, 0], cols[:, 1], cols[:, 2]]).astype(np.int32)


@functools.lru_cache(maxsize=256)
def split_schedule(n_m: int, bh: int, block_m: int, block_n: int, n_k: int, programs: int,
                   section: int, causal: bool, n_q: int, priced: bool = False,
                   masked_first: bool = False) -> tuple:
    """A persistent grid's work list (:func:`lpt_schedule`'s, or round-robin) with its
    ragged end cut along the keys: (schedule, merges, slots).

    Blocks dealt whole leave the programs' loads up to a block apart: at Nq = 16384,
    D = 64, 192 x 128, 2752 blocks over 132 programs take 21 rounds where the work is
    20.76 (1.1%), and a causal list ends 1-4% over its mean (the kernel's clock stamps).
    Here each program over a target load gives up its last blocks, and those are
    placed again on the programs with room, cut along the key tiles where a program's
    room ends (:func:`_place`). A piece of a cut block accumulates O over its key range
    only and writes (O, m, l) unnormalized to a slot of a float32 workspace, and a merge
    kernel combines a block's pieces (:mod:`flashscope.kernels.attention_merge`). The
    target is the smallest (bisected) whose placement fits under it.

    ``schedule`` (int32): offsets[P + 1], then the L entries' tiles (as
    :func:`lpt_schedule`), their key ranges ``lo | hi << 16`` in positions of the block's
    order of key tiles, and their slots (-1: a whole block, written out directly).
    ``merges`` (int32 [M, 3]): (tile, first slot, pieces) of each cut block, its pieces in
    consecutive slots. ``priced`` (BALANCE): the list prices blocks by their real
    consumers, whose padding ones pass (causal lists always pass them); non-causal
    without it, the blocks start round-robin and every consumer computes, so any block
    may be cut. ``masked_first``: the order of MASKED_FIRST."""
    if key_tiles(n_m - 1, block_m, block_n, n_k, causal) > 0xFFFF:
        raise ValueError(f"split_schedule: a key range is packed in 16 bits, so at most "
                         f"{0xFFFF} key tiles of {block_n}; got n_k={n_k}")
    passing = causal or priced
    if passing:
        base = lpt_schedule(n_m, bh, block_m, block_n, n_k, programs, section, causal,
                            n_q if priced or not causal else None)
        offsets, blocks = base[:programs + 1], base[programs + 1:]
        lists = [[int(t) for t in blocks[offsets[p]:offsets[p + 1]]]
                 for p in range(programs)]
    else:
        lists = [list(range(p, n_m * bh, programs)) for p in range(programs)]
    tiles = [key_tiles(m, block_m, block_n, n_k, causal) for m in range(n_m)]
    costs = [block_cost(m, block_m, block_n, n_k, causal, n_q if passing else None)
             for m in range(n_m)]
    cuts = [split_points(m, block_m, block_n, n_k, n_q, causal, masked_first, passing)
            for m in range(n_m)]
    per_tile = [(c - TILE_OVERHEAD) / n for c, n in zip(costs, tiles)]

    def attempt(cap):
        kept, pool, loads = [], [], []
        for p, x in enumerate(lists):
            load = sum(costs[t % n_m] for t in x)
            n = len(x)
            while n > 0 and load > cap:
                n -= 1
                load -= costs[x[n] % n_m]
                pool.append((n, p, x[n]))
            kept.append(x[:n])
            loads.append(load)
        pool.sort()  # by round, then program: the order the grid reached them in
        loads, placed = _place([(t, tiles[t % n_m], cuts[t % n_m], per_tile[t % n_m])
                                for _, _, t in pool], loads, cap)
        return max(loads), kept, placed

    loads0 = [sum(costs[t % n_m] for t in x) for x in lists]
    lo_cap, hi_cap = sum(loads0) / programs, max(loads0)
    best = (hi_cap, [list(x) for x in lists], [])
    for _ in range(24):
        cap = (lo_cap + hi_cap) / 2
        span, kept, placed = attempt(cap)
        if span <= cap + 1e-9:
            hi_cap = cap
            if span < best[0]:
                best = (span, kept, placed)
        else:
            lo_cap = cap
    _, kept, placed = best
    entries = [[(t, 0, tiles[t % n_m]) for t in x] for x in kept]
    for p, t, lo, hi in placed:
        entries[p].append((t, lo, hi))
    pieces = {}
    for x in entries:
        for t, lo, hi in x:
            if hi - lo < tiles[t % n_m]:
                pieces.setdefault(t, []).append(lo)
    slot_of, merges, slots = {}, [], 0
    for t in sorted(pieces):
        merges.append((t, slots, len(pieces[t])))
        for lo in sorted(pieces[t]):
            slot_of[t, lo] = slots
            slots += 1
    sched = pack_entries(entries, slot_of)
    merge = np.array(merges, dtype=np.int32).reshape(-1, 3)
    for a in (sched, merge):
        a.setflags(write=False)
    return sched, merge, slots

