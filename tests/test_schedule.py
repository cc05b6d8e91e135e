"""flashscope.schedule: the persistent causal work list (sections of heads that fit in
L2, longest row block first, greedy placement)."""

import math

import numpy as np
import pytest

from flashscope.schedule import (TILE_OVERHEAD, key_tiles, lpt_schedule, makespan,
                                 section_heads)


def _split(s, programs):
    offsets, blocks = s[:programs + 1], s[programs + 1:]
    return [blocks[offsets[p]:offsets[p + 1]] for p in range(programs)]


@pytest.mark.parametrize("n,bh,bm,programs", [(16384, 32, 192, 132), (4096, 128, 192, 132),
                                              (1024, 512, 128, 132), (1000, 6, 128, 7),
                                              (64, 3, 192, 5)])
def test_every_block_once_and_balanced(n, bh, bm, programs):
    n_m = math.ceil(n / bm)
    section = section_heads(n, 64, 2, 50 << 20, bh)
    s = lpt_schedule(n_m, bh, bm, 128, n, programs, section)
    assert s.dtype == np.int32 and s[0] == 0 and s[programs] == n_m * bh
    parts = _split(s, programs)
    assert sorted(int(t) for p in parts for t in p) == list(range(n_m * bh))
    largest, mean = makespan(s, programs, n_m, bm, 128, n)
    longest = key_tiles(n_m - 1, bm, 128, n) + TILE_OVERHEAD
    # greedy list scheduling, longest first within a section: within one block of even
    assert largest <= max(mean, longest) + longest


def test_programs_start_on_the_longest_blocks_of_one_section():
    n, bh, bm, programs = 4096, 128, 192, 132
    n_m = math.ceil(n / bm)
    section = section_heads(n, 64, 2, 50 << 20, bh)
    assert section == 25  # 1 MB of K and V per head against half of 50 MB
    parts = _split(lpt_schedule(n_m, bh, bm, 128, n, programs, section), programs)
    first = [int(p[0]) for p in parts]
    assert {t // n_m for t in first} == set(range(section))  # 25 heads, not 128
    assert min(t % n_m for t in first) >= n_m - math.ceil(programs / section)


def test_section_heads_bounds():
    assert section_heads(16384, 64, 2, 50 << 20, 32) == 6
    assert section_heads(1 << 20, 128, 2, 50 << 20, 32) == 1  # never below one head
    assert section_heads(128, 64, 2, 50 << 20, 8) == 8  # never above all heads


def test_rejects_empty_arguments():
    with pytest.raises(ValueError, match="programs=0"):
        lpt_schedule(4, 2, 128, 128, 512, 0, 1)


def test_cached_result_is_read_only():
    s = lpt_schedule(8, 4, 128, 128, 1024, 3, 2)
    with pytest.raises(ValueError):
        s[0] = 1
