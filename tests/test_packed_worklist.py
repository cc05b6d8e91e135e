"""The device-built work list of a packed batch (:mod:`flashscope.kernels.packed_worklist`),
run by Triton's interpreter (compiled for the GPU with --device cuda) and compared with
the list written out here in Python: every row block that holds rows exactly once, dealt
in rounds (every other one backwards) in sequence, head and row-block order (the last row
block first when causal), with its sequence's place and lengths.
Also what the Hopper forward refuses for a packed batch and how its plan is sized."""

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


def expected(lq, lk, H, block_m, n_m, P, heavy_first):
    """(offsets, [(t, q0, n_q, k0, n_k) in list order]) of the list."""
    cq = [0, *itertools.accumulate(lq)]
    ck = [0, *itertools.accumulate(lk)]
    entries = []
    for b, n in enumerate(lq):
        blocks = min(cdiv(n, block_m), n_m)
        for h in range(H):
            for m in range(blocks):
                mm = blocks - 1 - m if heavy_first else m
                entries.append(((b * H + h) * n_m + mm, cq[b], n, ck[b], lk[b]))
    shares = [[] for _ in range(P)]  # rounds of P, every other one dealt backwards
    for e, entry in enumerate(entries):
        r, p = divmod(e, P)
        shares[p if r % 2 == 0 else P - 1 - p].append(entry)
    offsets = [0, *itertools.accumulate(len(s) for s in shares)]
    return offsets, [entry for share in shares for entry in share]


def built(device, lq, lk, H, block_m, P, heavy_first, block_b=4, block_e=16,
          longest=None):
    """The list the kernel writes (the interpreter on "cpu", else compiled for the
    GPU), on the CPU, and its slot count L; ``longest``: the max_seqlen_q the grid is
    sized for (default: the longest sequence)."""
    n_m = max(1, cdiv(longest or max(lq), block_m))
    L = len(lq) * H * n_m
    dev = "cuda" if device == "cuda" else "cpu"
    cu_q = torch.tensor([0, *itertools.accumulate(lq)], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, *itertools.accumulate(lk)], dtype=torch.int32, device=dev)
    sched = torch.full((P + 1 + 5 * L,), -7, dtype=torch.int32, device=dev)
    kernel = kernels.load("packed_worklist", interpret=dev == "cpu")._packed_list
    kernel[(cdiv(L, block_e),)](cu_q, cu_k, sched, len(lq), H, n_m, P, L, BLOCK_M=block_m,
                                BLOCK_B=block_b, BLOCK_E=block_e, HEAVY_FIRST=heavy_first)
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
@pytest.mark.parametrize("heavy_first", [False, True])
def test_list_holds_each_live_row_block_once_in_order(device, lq, lk, H, block_m, P,
                                                    heavy_first):
    sched, L, n_m = built(device, lq, lk, H, block_m, P, heavy_first)
    offsets, placed = expected(lq, lk, H, block_m, n_m, P, heavy_first)
    T = len(placed)
    assert sched[:P + 1].tolist() == offsets
    body = sched[P + 1:].view(5, L)
    got = [tuple(body[:, i].tolist()) for i in range(T)]
    assert got == placed
    # slots past the live entries are not written (the kernel never reads them)
    assert (body[:, T:] == -7).all()


@pytest.mark.parametrize("heavy_first", [False, True])
def test_list_is_the_same_whatever_the_block_sizes(device, heavy_first):
    lq, lk = (17, 3, 0, 90, 41), (2, 50, 9, 90, 0)
    a = built(device, lq, lk, 3, 16, 6, heavy_first, block_b=2, block_e=8)[0]
    b = built(device, lq, lk, 3, 16, 6, heavy_first, block_b=8, block_e=64)[0]
    assert torch.equal(a, b)


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
