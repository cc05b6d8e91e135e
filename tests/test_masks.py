"""The key-range helper: the host's ranges (flashscope.masks) against brute force over the
mask's definition, and the device's (flashscope.kernels.keyrange, run by Triton's
interpreter) against the host's, tile for tile, on random shapes and masks."""

import os
import random

import pytest
import triton
import triton.language as tl

from flashscope.errors import FlashscopeError
from flashscope.masks import Mask, key_range, query_range, visible_pairs

SEED = int(os.environ.get("FLASHSCOPE_TEST_SEED", random.randrange(1 << 30)))


def _masks(rng):
    causal = rng.random() < 0.5
    window = None
    if rng.random() < 0.6:
        window = (rng.choice([None, -1, 0, 1, 5, 17, 64, 130, 1000]),
                  rng.choice([None, -1, 0, 3, 33, 200]))
    return Mask.of(causal, window, rng.choice(["top_left", "bottom_right"]))


def _shapes(rng, n):
    for _ in range(n):
        yield (rng.choice([1, 7, 16, 63, 64, 100, 129, 300]),
               rng.choice([1, 5, 16, 64, 65, 127, 256, 333]),
               rng.choice([16, 32, 64, 128]), rng.choice([16, 32, 64, 128]), _masks(rng))


def _check_key_range(mask, m0, bm, n_q, n_k, bn):
    r = key_range(mask, m0, bm, n_q, n_k, bn)
    assert r.lo <= r.full_lo <= r.full_hi <= r.hi or r.hi <= r.lo, r
    rows = range(m0, min(m0 + bm, n_q))
    for i in rows:
        for j in range(n_k):
            if mask.visible(i, j, n_q, n_k):
                assert r.lo <= j < r.hi, (mask, m0, i, j, r)
    # no row of the block (real rows; padding rows are free) masks a key of the full part
    for j in range(r.full_lo, r.full_hi):
        assert j < n_k
        for i in rows:
            assert mask.visible(i, j, n_q, n_k), (mask, m0, i, j, r)
    if r.hi > r.lo:  # tile multiples, or the end of the range
        assert r.lo % bn == 0
        assert all(x % bn == 0 or x == r.hi for x in (r.full_lo, r.full_hi))


def _check_query_range(mask, n0, bn, n_q, n_k, bm):
    r = query_range(mask, n0, bn, n_q, n_k, bm)
    keys = range(n0, min(n0 + bn, n_k))
    for j in keys:
        for i in range(n_q):
            if mask.visible(i, j, n_q, n_k):
                assert r.lo <= i < r.hi, (mask, n0, i, j, r)
    for i in range(r.full_lo, r.full_hi):
        assert i < n_q
        for j in keys:
            assert mask.visible(i, j, n_q, n_k), (mask, n0, i, j, r)
    # the masked part before the full one holds only rows below the last whole tile
    assert r.full_lo <= max((n_q // bm) * bm, r.lo) or r.full_lo == r.hi


def test_host_ranges_cover_every_visible_pair():
    rng = random.Random(SEED)
    for n_q, n_k, bm, bn, mask in _shapes(rng, 150):
        for m0 in range(0, n_q, bm):
            _check_key_range(mask, m0, bm, n_q, n_k, bn)
        for n0 in range(0, n_k, bn):
            _check_query_range(mask, n0, bn, n_q, n_k, bm)


def test_plain_and_causal_ranges_are_the_classic_ones():
    plain, causal = Mask(), Mask.of(True)
    assert key_range(plain, 128, 128, 1000, 1000, 64) == (0, 0, 960, 1000)
    assert key_range(causal, 128, 128, 1000, 1000, 64) == (0, 0, 128, 256)
    assert key_range(causal, 0, 64, 1000, 1000, 64) == (0, 0, 0, 64)
    # bottom-right: the last query sits at the last key
    assert key_range(Mask.of(True, align="bottom_right"), 0, 64, 64, 1000, 64) == (
        0, 0, 896, 1000)
    # a window of 100 keys to the left: tiles before the band are skipped
    r = key_range(Mask.of(True, (100, 0)), 512, 128, 1000, 1000, 64)
    assert (r.lo, r.hi) == (384, 640) and r.full_lo == r.full_hi


def test_visible_pairs_and_empty_rows():
    assert visible_pairs(Mask(), 3, 5) == 15
    assert visible_pairs(Mask.of(True), 4, 4) == 10
    assert visible_pairs(Mask.of(True, align="bottom_right"), 2, 4) == 7
    assert not Mask.of(True).may_empty(10, 3)
    assert Mask.of(True, align="bottom_right").may_empty(10, 3)
    assert Mask.of(False, (2, 2)).may_empty(10, 3)
    assert not Mask.of(False, (2, 2)).may_empty(3, 3)


@pytest.mark.parametrize("window", [(1.5, 0), ("3", None), (1, 2, 3), 5])
def test_bad_windows_are_refused(window):
    with pytest.raises(FlashscopeError, match="window"):
        Mask.of(False, window)


def test_bands_and_the_switches_of_unknown_lengths():
    """A band is more than causal or none; a packed batch's lengths are unknown to the
    host, so its switches must hold for any: bottom-right shifts whenever it bounds, and
    rows may see nothing wherever a left bound or a shifted right bound can leave them
    empty."""
    assert not Mask.of(True).banded(10, 20) and not Mask().banded(10, 20)
    assert Mask.of(False, (3, None)).banded(10, 10)
    assert Mask.of(False, (None, 3)).banded(10, 10)
    assert not Mask.of(True, None, "bottom_right").banded(10, 10)
    assert Mask.of(True, None, "bottom_right").banded(10, 20)
    assert Mask.of(True, None, "bottom_right").banded()
    assert not Mask.of(False, None, "bottom_right").banded()  # no bound to move
    causal_br = Mask.of(True, None, "bottom_right").switches(None, None)
    assert causal_br["SHIFTED"] and causal_br["GUARD"]
    assert not any(Mask.of(True).switches(None, None)[k] for k in ("SHIFTED", "GUARD"))
    assert Mask.of(False, (4, 0)).switches(None, None)["GUARD"]
    assert Mask.of(True, None, "bottom_right").scalars(None, None) == (0, 0, 0)


def test_bad_align_is_refused():
    with pytest.raises(FlashscopeError, match="align"):
        Mask.of(True, align="center")


def _tiles(r, step):
    """{tile start: masked?} of the loops a kernel runs over a range: [lo, full_lo) and
    [full_hi, hi) with a mask, [full_lo, full_hi) without."""
    lo, full_lo, full_hi, hi = r
    out = [(t, True) for t in range(lo, full_lo, step)]
    out += [(t, False) for t in range(full_lo, full_hi, step)]
    out += [(t, True) for t in range(full_hi, hi, step)]
    assert len({t for t, _ in out}) == len(out), f"a tile visited twice: {r}"
    return out


kr = None  # the device helper, built for the interpreter by the test below


@triton.jit
def _probe(Out, N_Q, N_K, OFFSET, LEFT, RIGHT, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
          HAS_RIGHT: tl.constexpr, SHIFTED: tl.constexpr, GUARD: tl.constexpr):
    pid = tl.program_id(0)
    a, b, c, d = kr.key_range(pid * BLOCK_M, N_K, OFFSET, LEFT, RIGHT, BLOCK_M,
                              BLOCK_N, CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
    e, f, g, h = kr.query_range(pid * BLOCK_N, N_Q, OFFSET, LEFT, RIGHT, BLOCK_N,
                                BLOCK_M, CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
    base = Out + pid * 8
    tl.store(base + 0, a)
    tl.store(base + 1, b)
    tl.store(base + 2, c)
    tl.store(base + 3, d)
    tl.store(base + 4, e)
    tl.store(base + 5, f)
    tl.store(base + 6, g)
    tl.store(base + 7, h)


@pytest.mark.interpreter
def test_device_ranges_match_the_host():
    import torch

    from flashscope import kernels

    global kr
    kr = kernels.load("keyrange", interpret=True)
    rng = random.Random(SEED)
    for n_q, n_k, bm, bn, mask in _shapes(rng, 40):
        blocks = max(-(-n_q // bm), -(-n_k // bn))
        out = torch.full((blocks, 8), -99, dtype=torch.int32)
        _probe[(blocks,)](out, n_q, n_k, *mask.scalars(n_q, n_k), BLOCK_M=bm, BLOCK_N=bn,
                         **mask.switches(n_q, n_k))
        for p in range(blocks):
            want_k = key_range(mask, p * bm, bm, n_q, n_k, bn)
            want_q = query_range(mask, p * bn, bn, n_q, n_k, bm)
            got = out[p].tolist()
            where = (SEED, mask, n_q, n_k, bm, bn, p, got)
            assert _tiles(got[:4], bn) == _tiles(want_k, bn), where
            assert _tiles(got[4:], bm) == _tiles(want_q, bm), where


def test_packed_rows_ranges_cover_their_positions():
    """Decoding's packed rows on the sm_90 forward (ROW_GROUP = G rows a query position):
    the key range of a block's positions, its first row's and ``_position_count`` of
    them as the kernel asks ``key_range``, visits every key a row of the block sees and
    leaves unmasked only keys each of them sees, for groups that divide 64 and groups
    that do not (a block then starts inside a group)."""
    from flashscope.kernels.sm90_worklist import _position_count

    rng = random.Random(SEED)
    for _ in range(300):
        G = rng.choice([1, 2, 3, 5, 6, 8, 12, 16, 64, 100])
        n_pos, n_k = rng.randint(1, 20), rng.randint(0, 700)
        mask = rng.choice([Mask.of(True, None, "bottom_right"),
                           Mask.of(True, (rng.randint(0, 100), 0), "bottom_right"),
                           Mask.of(False, (rng.randint(0, 50), rng.randint(0, 50)),
                                   "bottom_right")])
        rows, bn = rng.choice([64, 128, 192]), rng.choice([64, 128])
        off = mask.offset(n_pos, n_k)
        left = mask.left if mask.left_bounded else None
        right = mask.right if mask.right_bounded else None
        for row0 in range(0, n_pos * G, rows):
            r = key_range(mask, row0 // G, _position_count(rows, G), n_pos, n_k, bn)
            where = (SEED, G, n_pos, n_k, mask, rows, bn, row0, r)
            for row in range(row0, min(row0 + rows, n_pos * G)):
                p = row // G + off
                lo = 0 if left is None else max(0, p - left)
                hi = n_k - 1 if right is None else min(n_k - 1, p + right)
                if lo <= hi:
                    assert r.lo <= lo and hi < r.hi, where
                assert all(lo <= k <= hi for k in range(r.full_lo, min(r.full_hi, n_k))), \
                    where


@triton.jit
def _probe_visible(Out, OFFSET, LEFT, RIGHT, SIDE: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SHIFTED: tl.constexpr):
    rows = tl.arange(0, SIDE)[:, None]
    cols = tl.arange(0, SIDE)[None, :]
    whole = kr.visible(rows, cols, OFFSET, LEFT, RIGHT, CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
    # the rows' share of bits 1 and 2 moved to the keys' side (the backward's tiles), and
    # the keys' share moved to the rows' side (as a tile with keys along its columns would)
    by_row = kr.visible_from(rows & ~6, cols - (rows & 6), OFFSET, LEFT, RIGHT, CAUSAL,
                             HAS_LEFT, HAS_RIGHT, SHIFTED)
    by_col = kr.visible_from(-(cols & ~6), (cols & 6) - rows, OFFSET, LEFT, RIGHT, CAUSAL,
                             HAS_LEFT, HAS_RIGHT, SHIFTED)
    at = Out + (rows * SIDE + cols) * 3
    tl.store(at, whole.to(tl.int32))
    tl.store(at + 1, by_row.to(tl.int32))
    tl.store(at + 2, by_col.to(tl.int32))


@pytest.mark.interpreter
def test_visible_from_answers_as_visible_does():
    """``visible_from`` (the bounds on the keys' side, a thread's share of an index moved
    across) keeps the pairs ``visible`` keeps and the host's definition keeps."""
    import torch

    from flashscope import kernels

    global kr
    kr = kernels.load("keyrange", interpret=True)
    rng = random.Random(SEED)
    side, done = 32, 0
    while done < 30:
        mask = _masks(rng)
        if mask.plain:
            continue
        n_q, n_k = rng.randint(1, side), rng.randint(1, side)
        out = torch.full((side, side, 3), -1, dtype=torch.int32)
        sw = mask.switches(n_q, n_k)
        sw.pop("GUARD")
        _probe_visible[(1,)](out, *mask.scalars(n_q, n_k), SIDE=side, **sw)
        for i in range(n_q):
            for j in range(n_k):
                want = int(mask.visible(i, j, n_q, n_k))
                assert out[i, j].tolist() == [want] * 3, (SEED, mask, n_q, n_k, i, j)
        done += 1
