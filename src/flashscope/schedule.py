"""The persistent causal grid's work list: which program runs which (head, row block), in
what order.

Two things pull against each other. Balance: causal row blocks differ in length (block m
of BLOCK_M rows reads ceil(min(Nk, (m + 1) BLOCK_M) / BLOCK_N) key tiles), so programs
must draw long and short blocks in the right mix. Locality: the programs running at one
moment should read the K and V of few heads, so those stay in L2. Sorting every head's
blocks by length (all heads' last block first) balances well and ruins locality: at
N = 4096, D = 64 the 132 programs of one moment read 124 heads' K and V, 124 MB against
the H100's 50 MB of L2, and Nsight Compute counted a 9% L2 hit rate and DRAM at 67-70%
of its peak (run 39).

So the list is cut into sections of S heads whose K and V fit in half the L2 (other
data streams through the rest), each section sorted longest block first, and the
blocks are assigned greedily: in list order, each to the program with the least work so
far (cost: key tiles + ``TILE_OVERHEAD`` for the prologue and epilogue), which is what a
dynamic scheduler with an atomic counter would do if the cost model held. The programs
then move through the list together (locality), and greedy longest-first list
scheduling ends within one block of the best balance.

The result is a CSR array of int32: ``offsets[P + 1]`` then the blocks of program 0,
program 1, ..., each ``pid_bh * n_m + pid_m``. Program p runs
``blocks[offsets[p]:offsets[p + 1]]`` in order.
"""

from __future__ import annotations

import functools
import heapq
import math

import numpy as np

#: key tiles' worth of time per work tile outside the loop (Q load, first product, the
#: last P V, the epilogue): a cost-model constant, not a measurement to three digits.
TILE_OVERHEAD = 2.0
#: share of the L2 cache the K and V of one section may fill.
L2_SHARE = 0.5


def key_tiles(m: int, block_m: int, block_n: int, n_k: int) -> int:
    """Key tiles of causal row block m (rows m*block_m ..; keys up to the block's last row)."""
    return math.ceil(min(n_k, (m + 1) * block_m) / block_n)


def section_heads(n_k: int, head_dim: int, elt_bytes: int, l2_bytes: int, bh: int) -> int:
    """Heads per section: as many as have K and V (2 n_k head_dim elt_bytes each) within
    L2_SHARE of the L2, at least one, at most all."""
    per_head = 2 * n_k * head_dim * elt_bytes
    return max(1, min(bh, int(l2_bytes * L2_SHARE) // per_head))


@functools.lru_cache(maxsize=256)
def lpt_schedule(n_m: int, bh: int, block_m: int, block_n: int, n_k: int, programs: int,
                 section: int) -> np.ndarray:
    """The CSR work list of the module docstring, for ``programs`` programs over n_m row
    blocks of each of bh heads, sections of ``section`` heads. Read-only (cached)."""
    if min(n_m, bh, block_m, block_n, n_k, programs, section) < 1:
        raise ValueError(f"lpt_schedule: every argument must be >= 1, got n_m={n_m}, "
                         f"bh={bh}, block_m={block_m}, block_n={block_n}, n_k={n_k}, "
                         f"programs={programs}, section={section}")
    heap = [(0.0, p) for p in range(programs)]
    lists = [[] for _ in range(programs)]
    for first in range(0, bh, section):
        heads = range(first, min(bh, first + section))
        for m in range(n_m - 1, -1, -1):
            cost = key_tiles(m, block_m, block_n, n_k) + TILE_OVERHEAD
            for h in heads:
                load, p = heapq.heappop(heap)
                lists[p].append(h * n_m + m)
                heapq.heappush(heap, (load + cost, p))
    offsets = np.zeros(programs + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in lists])
    flat = np.fromiter((t for x in lists for t in x), dtype=np.int64, count=n_m * bh)
    out = np.concatenate([offsets, flat]).astype(np.int32)
    out.setflags(write=False)
    return out


def makespan(schedule: np.ndarray, programs: int, n_m: int, block_m: int, block_n: int,
             n_k: int) -> tuple:
    """(largest, mean) per-program cost of a schedule under the cost model."""
    offsets, blocks = schedule[:programs + 1], schedule[programs + 1:]
    loads = [sum(key_tiles(int(t) % n_m, block_m, block_n, n_k) + TILE_OVERHEAD
                 for t in blocks[offsets[p]:offsets[p + 1]]) for p in range(programs)]
    return max(loads), sum(loads) / programs
