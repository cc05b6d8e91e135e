"""The device-built work list of a packed batch (:mod:`flashscope.kernels.packed_worklist`),
run by Triton's interpreter (compiled for the GPU with --device cuda) and compared with
the list written out here in Python: every row block that holds rows exactly once, the
sequences longest first, then heads, then row blocks (causal: folded, dealt in pairs),
dealt in rounds (every other one backwards), with its sequence's place and lengths; and
that this order evens out the programs' shares where batch order does not. The Hopper
backward's program order (``_key_list``) likewise: every key tile once, longest sequences
first, and its launches' wiring. Also what the Hopper forward refuses for a packed batch
and how its plan is sized."""

import itertools

import pytest
import torch

from flashscope import kernels
from flashscope.errors import ConfigError
from flashscope.families import sm90_fwd
from flashscope.launch import Packed
from flashscope.masks import Mask


def cdiv(a, b):
    return -(-a // b)


def folded(blocks, odd_start):
    """A causal head's row blocks in list order: last, first, next-to-last, second, ..;
    the middle one first for an odd count starting on an odd entry."""
    order = [blocks - 1 - j // 2 if j % 2 == 0 else j // 2 for j in range(blocks)]
    if odd_start and blocks % 2 == 1:
        order = [order[-1], *order[:-1]]
    return order


def dealt(n_entries, P, pairs):
    """Program of each list entry: rounds of P units (pairs of entries with ``pairs``),
    every other round backwards."""
    owner = []
    for e in range(n_entries):
        r, k = divmod(e // 2 if pairs else e, P)
        owner.append(k if r % 2 == 0 else P - 1 - k)
    return owner


def expected(lq, lk, H, block_m, n_m, P, causal, top_left=None, ck=None):
    """(offsets, [(t, q0, n_q, k0, n_k) in slot order]) of the list; ``ck``: each
    sequence's first key (default: the keys packed one sequence after another)."""
    top_left = causal if top_left is None else top_left
    cq = [0, *itertools.accumulate(lq)]
    ck = [0, *itertools.accumulate(lk)] if ck is None else ck
    reach = [min(q, k) if top_left else k for q, k in zip(lq, lk)]
    order = sorted(range(len(lq)), key=lambda b: (-reach[b], -lq[b], b))
    entries = []
    for b in order:
        blocks = min(cdiv(lq[b], block_m), n_m)
        for h in range(H):
            rows = folded(blocks, len(entries) % 2 == 1) if causal else range(blocks)
            entries += [((b * H + h) * n_m + m, cq[b], lq[b], ck[b], lk[b]) for m in rows]
    shares = [[] for _ in range(P)]
    for entry, p in zip(entries, dealt(len(entries), P, causal)):
        shares[p].append(entry)
    offsets = [0, *itertools.accumulate(len(s) for s in shares)]
    return offsets, [entry for share in shares for entry in share]


def built(device, lq, lk, H, block_m, P, causal, block_b=4, block_e=16, longest=None,
          top_left=None, used=None, added=0, pieces=0):
    """The list the kernel writes (the interpreter on "cpu", else compiled for the
    GPU), on the CPU, and its slot count L; ``longest``: the max_seqlen_q the grid is
    sized for (default: the longest sequence); ``used``: each sequence's keys in use
    (plus ``added``) out of the ``lk`` slots it has (a KV cache); ``pieces`` > 0: each
    row block cut into that many pieces (SPLIT, never folded)."""
    n_m = max(1, cdiv(longest or max(lq), block_m))
    L = len(lq) * H * n_m * max(1, pieces)
    dev = "cuda" if device == "cuda" else "cpu"
    cu_q = torch.tensor([0, *itertools.accumulate(lq)], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, *itertools.accumulate(lk)], dtype=torch.int32, device=dev)
    lens = cu_q if used is None else torch.tensor(used, dtype=torch.int32, device=dev)
    sched = torch.full((P + 1 + (7 if pieces else 5) * L,), -7, dtype=torch.int32,
                       device=dev)
    kernel = kernels.load("packed_worklist", interpret=dev == "cpu")._packed_list
    kernel[(max(1, cdiv(len(lq), block_b)), H)](
        cu_q, cu_k, lens, added, sched, len(lq), H, n_m, P, L, max(1, pieces),
        BLOCK_M=block_m, BLOCK_B=block_b, BLOCK_E=block_e, FOLD=causal and not pieces,
        TOP_LEFT=causal if top_left is None else top_left, USED=used is not None,
        SPLIT=pieces > 0)
    return sched.cpu(), L, n_m


CASES = [  # (query lengths, key lengths, heads, BLOCK_M, programs)
    ((5, 0, 33, 1, 20, 18), (7, 3, 21, 0, 20, 30), 2, 16, 3),  # empty and keyless ones
    ((64, 65, 128, 1), (64, 65, 128, 1), 3, 64, 5),  # tile multiples and one over
    ((300,), (200,), 1, 128, 7),  # fewer row blocks than programs
    ((90,) * 4, (90,) * 4, 3, 16, 6),  # programs a multiple of a head's blocks
    ((0, 0, 0), (4, 0, 2), 2, 64, 4),  # nothing to do
    (tuple(range(1, 40)), tuple(range(39, 0, -1)), 2, 8, 11),  # ten chunks of sequences
]


@pytest.mark.parametrize("lq,lk,H,block_m,P", CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_list_holds_each_live_row_block_once_in_order(device, lq, lk, H, block_m, P,
                                                    causal):
    sched, L, n_m = built(device, lq, lk, H, block_m, P, causal)
    offsets, placed = expected(lq, lk, H, block_m, n_m, P, causal)
    T = len(placed)
    assert sched[:P + 1].tolist() == offsets
    body = sched[P + 1:].view(5, L)
    got = [tuple(body[:, i].tolist()) for i in range(T)]
    assert got == placed
    # slots past the live entries are not written (the kernel never reads them)
    assert (body[:, T:] == -7).all()


@pytest.mark.parametrize("causal", [False, True])
def test_cache_lengths_give_each_sequence_its_keys_in_use(device, causal):
    """USED (a KV cache, FlashAttention's seqused_k): sequence b's keys start where its
    slots do and number its length plus the appended keys, clamped into its slots (a
    length past them, or below 0 from a bad value, stays harmless); the list orders the
    sequences by those keys, as it does packed ones."""
    cap, lens, added = 50, [0, 49, 7, 60, -5, 20], 2
    lq = (16, 16, 16, 16, 16, 16)
    n_k = [min(max(n + added, 0), cap) for n in lens]
    sched, L, n_m = built(device, lq, [cap] * len(lens), 2, 16, 5, causal, top_left=False,
                          used=lens, added=added)
    offsets, placed = expected(lq, n_k, 2, 16, n_m, 5, causal, top_left=False,
                               ck=[cap * b for b in range(len(lens) + 1)])
    assert sched[:6].tolist() == offsets
    body = sched[6:].view(5, L)
    assert [tuple(body[:, i].tolist()) for i in range(len(placed))] == placed


@pytest.mark.parametrize("pieces,P", [(3, 5), (1, 4), (16, 7)])
def test_split_list_cuts_each_row_block_into_pieces(device, pieces, P):
    """SPLIT (a decoding call's under-filled grid): each row block is ``pieces``
    consecutive entries, piece j naming (j, pieces) and workspace slot t pieces + j,
    dealt one entry at a time, never folded, the seven fields T (the live entries)
    apart; the sequences' order and fields are the unsplit list's."""
    cap, lens, added = 40, [0, 39, 7, 12], 1
    lq = (24, 24, 24, 24)
    n_k = [min(max(n + added, 0), cap) for n in lens]
    sched, L, n_m = built(device, lq, [cap] * 4, 2, 16, P, True, top_left=False,
                          used=lens, added=added, pieces=pieces)
    _, unsplit = expected(lq, n_k, 2, 16, n_m, 1, False, top_left=False,
                          ck=[cap * b for b in range(5)])
    entries = [(*e, j | pieces << 16, e[0] * pieces + j) for e in unsplit
               for j in range(pieces)]
    shares = [[] for _ in range(P)]
    for entry, p in zip(entries, dealt(len(entries), P, False)):
        shares[p].append(entry)
    T = len(entries)
    assert sched[:P + 1].tolist() == [0, *itertools.accumulate(len(x) for x in shares)]
    body = sched[P + 1:P + 1 + 7 * T].view(7, T)
    assert [tuple(body[:, i].tolist()) for i in range(T)] == [e for x in shares for e in x]
    assert T == len(lq) * 2 * n_m * pieces == L
    assert (sched[P + 1 + 7 * T:] == -7).all()


@pytest.mark.parametrize("causal", [False, True])
def test_list_is_the_same_whatever_the_block_sizes(device, causal):
    lq, lk = (17, 3, 0, 90, 41), (2, 50, 9, 90, 0)
    a = built(device, lq, lk, 3, 16, 6, causal, block_b=2, block_e=8)[0]
    b = built(device, lq, lk, 3, 16, 6, causal, block_b=8, block_e=64)[0]
    assert torch.equal(a, b)


def test_bottom_right_causal_lists_by_keys_and_top_left_by_the_rows_that_see_them(device):
    """Causal with Nq < Nk per sequence: bottom-right rows see all n_k keys, top-left
    ones at most n_q: the two orders differ here, and each matches its reference."""
    lq, lk = (40, 9, 25), (41, 90, 30)
    top = built(device, lq, lk, 2, 8, 3, True, top_left=True)
    right = built(device, lq, lk, 2, 8, 3, True, top_left=False)
    for (sched, L, n_m), top_left in ((top, True), (right, False)):
        offsets, placed = expected(lq, lk, 2, 8, n_m, 3, True, top_left=top_left)
        body = sched[4:].view(5, L)
        assert sched[:4].tolist() == offsets
        assert [tuple(body[:, i].tolist()) for i in range(len(placed))] == placed
    assert not torch.equal(top[0], right[0])


def busiest_share(offsets, placed, n_m, block_m, block_n, causal):
    """The costliest program's share over the mean, an entry costing the key tiles its
    row block visits plus one (its prologue and output)."""
    def cost(entry):
        t, _, n_q, _, n_k = entry
        m = t % n_m
        keys = min(n_k, (m + 1) * block_m) if causal else n_k
        return cdiv(keys, block_n) + 1

    shares = [sum(cost(e) for e in placed[a:b]) for a, b in zip(offsets, offsets[1:])]
    return max(shares) / (sum(shares) / len(shares))


@pytest.mark.parametrize("causal", [False, True])
def test_longest_first_evens_out_a_mixed_batch(device, causal):
    """On lengths drawn as the bench's mixed batches are (54 sequences of 16-1024), the
    list's busiest program holds 0.5% (non-causal) and 1.9% (causal) over the mean
    share, where the batch's own order dealt one entry at a time left 5% and 17%."""
    from flashscope.bench.suite import draw_seqlens

    lq = draw_seqlens(2, 12288, 16, 1024)
    H, block_m, P = 4, 32, 24
    sched, L, n_m = built(device, lq, lq, H, block_m, P, causal, block_b=8, block_e=32)
    offsets = sched[:P + 1].tolist()
    body = sched[P + 1:].view(5, L)
    placed = [tuple(body[:, i].tolist()) for i in range(offsets[-1])]
    assert (offsets, placed) == expected(lq, lq, H, block_m, n_m, P, causal)
    assert busiest_share(offsets, placed, n_m, block_m, 64, causal) <= 1.03
    # the same entries in batch order, one at a time: the order this one replaced
    in_order = [((b * H + h) * n_m + m, 0, n, 0, n) for b, n in enumerate(lq)
                for h in range(H) for m in range(cdiv(n, block_m))[::-1 if causal else 1]]
    shares = [[] for _ in range(P)]
    for entry, p in zip(in_order, dealt(len(in_order), P, False)):
        shares[p].append(entry)
    old = [0, *itertools.accumulate(len(s) for s in shares)]
    assert busiest_share(old, [e for s in shares for e in s], n_m, block_m, 64,
                         causal) >= (1.15 if causal else 1.04)


def test_rows_past_the_longest_length_given_are_left_out(device):
    """A sequence longer than max_seqlen_q (unchecked on a GPU) keeps the row blocks the
    grid was sized for: no entry names a row block past them (it would decode as
    another head's)."""
    lq, lk = (40, 100, 7), (40, 100, 7)
    sched, L, n_m = built(device, lq, lk, 2, 16, 3, True, longest=50)
    offsets, placed = expected(lq, lk, 2, 16, n_m, 3, True)
    assert n_m == 4 and len(placed) == 2 * (3 + 4 + 1)
    body = sched[4:].view(5, L)
    assert [tuple(body[:, i].tolist()) for i in range(len(placed))] == placed


def meta_packed(lq, lk, H=4, Hkv=2, D=128):
    q = torch.empty(1, H, sum(lq), D, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, Hkv, sum(lk), D, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(len(lq) + 1, dtype=torch.int32, device="meta")
    return q, k, Packed(cu, cu, max(lq), max(lk))


@pytest.mark.parametrize("knob", sm90_fwd.PACKED_KNOBS)
def test_packed_batch_refuses_host_list_knobs_by_name(knob):
    q, k, packed = meta_packed((100, 30), (100, 30))
    cfg = sm90_fwd.Sm90FwdConfig(**{knob: True})
    with pytest.raises(ConfigError, match=knob):
        sm90_fwd.call(q, k, k, q, None, mask=Mask.of(False), scale=0.1, cfg=cfg,
                      packed=packed)


def test_packed_plan_covers_the_longest_sequence_and_passes_its_list():
    q, k, packed = meta_packed((100, 300, 7), (100, 50, 7))
    cfg = sm90_fwd.Sm90FwdConfig()
    grid, args, consts = sm90_fwd.call(q, k, k, q, None, mask=Mask.of(True), scale=0.1,
                                       cfg=cfg, packed=packed)
    n_m = cdiv(300, cfg.BLOCK_M)
    L = 3 * 4 * n_m
    assert consts["VARLEN"] and consts["LPT"] == 2
    sched = args[5]
    assert sched.shape == (grid[0] + 1 + 5 * L,) and sched.dtype == torch.int32
    assert 1 <= grid[0] <= L  # at most one program a row block


def key_order(lq, lk, Hkv, block_n, n_n, section):
    """The backward's program order, written out: sequences by query rows, most first
    (ties: more keys, then batch order), each with its min(cdiv(n_k, block_n), n_n) key
    tiles per kv head, heads one after another, or with ``section`` in sections of that
    many heads taken key tile by key tile."""
    order = sorted(range(len(lq)), key=lambda b: (-lq[b], -lk[b], b))
    entries = []
    for b in order:
        tiles = min(cdiv(lk[b], block_n), n_n)
        if section:
            for h0 in range(0, Hkv, section):
                heads = range(h0, min(h0 + section, Hkv))
                entries += [(b * Hkv + h) * n_n + n for n in range(tiles) for h in heads]
        else:
            entries += [(b * Hkv + h) * n_n + n for h in range(Hkv) for n in range(tiles)]
    return entries


def key_list(device, lq, lk, Hkv, block_n, section, block_b=4, block_e=16, longest=None):
    """The backward's list as the kernel writes it, with the family's slot count: the
    key tiles of all keys plus one partial tile a sequence, per kv head."""
    n_n = max(1, cdiv(longest or max(lk), block_n))
    L = min((cdiv(sum(lk), block_n) + len(lk)) * Hkv, len(lk) * Hkv * n_n)
    dev = "cuda" if device == "cuda" else "cpu"
    cu_q = torch.tensor([0, *itertools.accumulate(lq)], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, *itertools.accumulate(lk)], dtype=torch.int32, device=dev)
    out = torch.full((max(1, L),), -7, dtype=torch.int32, device=dev)
    kernel = kernels.load("packed_worklist", interpret=dev == "cpu")._key_list
    kernel[(max(1, cdiv(len(lq), block_b)), Hkv)](
        cu_q, cu_k, out, len(lq), Hkv, n_n, L, BLOCK_N=block_n, BLOCK_B=block_b,
        BLOCK_E=block_e, SECTION=section)
    return out.cpu(), n_n


KEY_CASES = [  # (query lengths, key lengths, kv heads, BLOCK_N)
    ((5, 0, 33, 1, 20, 18), (7, 3, 21, 0, 20, 30), 3, 16),  # empty and keyless ones
    ((128, 129, 256, 1), (128, 129, 256, 1), 2, 128),  # tile multiples and one over
    ((90,) * 4, (90,) * 4, 5, 16),  # ties: batch order
    ((0, 0), (0, 0), 2, 64),  # nothing to do
    (tuple(range(1, 40)), tuple(range(39, 0, -1)), 2, 8),  # ten chunks of sequences
]


@pytest.mark.parametrize("lq,lk,Hkv,block_n", KEY_CASES)
@pytest.mark.parametrize("section", [0, 2])
def test_key_list_holds_each_key_tile_once_longest_first(device, lq, lk, Hkv, block_n,
                                                         section):
    got, n_n = key_list(device, lq, lk, Hkv, block_n, section)
    want = key_order(lq, lk, Hkv, block_n, n_n, section)
    assert got[:len(want)].tolist() == want
    assert (got[len(want):] == -1).all()  # the empty slots say so: the kernel reads them
    assert sorted(want) == sorted(
        (b * Hkv + h) * n_n + n for b, n_k in enumerate(lk) for h in range(Hkv)
        for n in range(cdiv(n_k, block_n)))


def test_key_list_is_the_same_whatever_the_block_sizes(device):
    lq, lk = (17, 3, 0, 90, 41), (2, 50, 9, 90, 0)
    a = key_list(device, lq, lk, 3, 16, 2, block_b=2, block_e=8)[0]
    b = key_list(device, lq, lk, 3, 16, 2, block_b=8, block_e=64)[0]
    assert torch.equal(a, b)


def test_key_list_leaves_out_key_tiles_past_the_longest_length_given(device):
    """A sequence longer than max_seqlen_k (unchecked on a GPU) keeps the key tiles the
    list was sized for: no entry names a tile past them (it would decode as another
    head's)."""
    lq, lk = (40, 100, 7), (40, 100, 7)
    got, n_n = key_list(device, lq, lk, 2, 16, 0, longest=50)
    want = key_order(lq, lk, 2, 16, n_n, 0)
    assert n_n == 4 and len(want) == 2 * (3 + 4 + 1)
    assert got[:len(want)].tolist() == want and (got[len(want):] == -1).all()


def makespan(costs, programs):
    """When the last of ``costs`` ends, each started in order on the first of
    ``programs`` slots to free up, as a GPU hands out a grid's blocks."""
    import heapq

    free = [0.0] * programs
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


@pytest.mark.parametrize("causal", [False, True])
def test_key_list_shortens_a_mixed_batch_against_the_grid_it_replaced(device, causal):
    """On lengths drawn as the bench's mixed batches are (128-8192, 64k tokens; 8 kv
    heads, 132 programs at once), a program costing the query tiles it visits plus one
    (K and V in, dK and dV out), the list ends within 1% of the work spread over the
    programs. The grid it replaced, sized by the longest sequence, launched a program of
    that fixed cost for every key tile past a sequence's end, in batch order (causal:
    sections of 8 heads, key tile by key tile) and ended 5% (7%) later."""
    from flashscope.bench.suite import draw_seqlens

    lq = draw_seqlens(0, 65536, 128, 8192)
    Hkv, block_n, block_m, P, section = 8, 128, 64, 132, 8 if causal else 0
    got, n_n = key_list(device, lq, lq, Hkv, block_n, section, block_b=32, block_e=64)

    def cost(bh, n):
        first = n * block_n if causal else 0
        return cdiv(max(lq[bh // Hkv] - first, 0), block_m) + 1

    listed = [cost(e // n_n, e % n_n) for e in got.tolist() if e >= 0]
    assert len(listed) == Hkv * sum(cdiv(n, block_n) for n in lq)
    bound = sum(listed) / P
    BH = len(lq) * Hkv
    if causal:  # the dense grid's sections (the kernel's SECTION)
        grid = [cost(h0 + r, n) for h0 in range(0, BH, section)
                for n in range(n_n) for r in range(min(section, BH - h0))]
    else:
        grid = [cost(bh, n) for bh in range(BH) for n in range(n_n)]
    assert makespan(listed, P) <= 1.01 * bound
    assert makespan(grid, P) >= 1.05 * bound


@pytest.mark.parametrize("causal", [False, True])
def test_packed_backward_runs_its_list_and_the_dense_one_its_grid(causal):
    """The Hopper backward's launches on a packed batch: the list first, sized for every
    key tile plus a partial one a sequence per kv head, then one program a slot reading
    it (sections in the list, none in the kernel); a dense problem keeps its grid of key
    tiles by (batch, kv head), sectioned under a causal mask."""
    from flashscope.families import sm90_bwd

    cfg = sm90_bwd.Sm90BwdConfig(BLOCK_M=64)
    lq, lk, H, Hkv = (700, 5, 300), (1000, 9, 200), 8, 2
    q, k, packed = meta_packed(lq, lk, H, Hkv)
    f32 = dict(dtype=torch.float32, device="meta")
    rows = torch.empty(sm90_bwd.row_shape(q, packed, cfg), **f32)
    acc = torch.empty(sm90_bwd.acc_shape(q, packed, cfg), **f32)
    lse = torch.empty(q.shape[:3], **f32)
    launches = sm90_bwd.calls(q, q, k, k, q, lse, rows, acc, k, k, mask=Mask.of(causal),
                              scale=0.1, cfg=cfg, packed=packed, lse_rows=rows)
    assert list(launches) == ["bwd_preprocess", "key_list", sm90_bwd.KERNEL]
    _, grid, args, consts, _ = launches["key_list"]
    slots = min((cdiv(sum(lk), cfg.BLOCK_N) + 3) * Hkv, 3 * Hkv * cdiv(1000, cfg.BLOCK_N))
    listed = args[2]
    assert listed.shape == (slots,) and listed.dtype == torch.int32
    assert grid == (1, Hkv) and args[3:] == (3, Hkv, cdiv(1000, cfg.BLOCK_N), slots)
    assert consts["SECTION"] == (sm90_bwd.CAUSAL_SECTION if causal else 0)
    _, grid, args, consts, _ = launches[sm90_bwd.KERNEL]
    names = kernels.load(sm90_bwd.MODULE)._attn_bwd_sm90.arg_names
    assert grid == (slots, 1) and args[names.index("LIST")] is listed
    assert args[names.index("N_K")] == 1000  # the list's key tiles: the longest sequence's
    assert consts["VARLEN"] and consts["SECTION"] == 0
    dense = torch.empty(sm90_bwd.row_shape(q, None, cfg), **f32)  # 1005 rows: lse copied
    launches = sm90_bwd.calls(q, q, k, k, q, lse, dense, acc, k, k, mask=Mask.of(causal),
                              scale=0.1, cfg=cfg, lse_rows=dense)
    assert "key_list" not in launches
    _, grid, _, consts, _ = launches[sm90_bwd.KERNEL]
    assert grid == (cdiv(sum(lk), cfg.BLOCK_N), Hkv)  # the tensors as one dense sequence
    assert not consts["VARLEN"]
    assert consts["SECTION"] == (sm90_bwd.CAUSAL_SECTION if causal else 0)
