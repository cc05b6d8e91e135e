"""Backward correctness against float64 autograd, on fresh random inputs each run.

On CPU the kernels run in Triton's interpreter, so shapes are small but each switch is
covered: causal or not, query lengths that are / are not tile multiples (EVEN_M in the dK/dV
kernel), key lengths likewise (EVEN_N in the dQ kernel), Nq != Nk both ways (causal key tiles
no query sees), head dims that need padding, GQA (dK, dV summed over the group), (B, N, H, D)
strided views, fp16 and bf16. Gradient buffers are poisoned with NaN and must be fully
written. ``gpu``-marked tests widen the grid and run the default configs.
"""

import math

import pytest
import torch

import flashscope
from flashscope import api, launch
from flashscope.families import Problem, default_backward, sm90_bwd, triton_bwd
from flashscope.families.sm90_bwd import Sm90BwdConfig
from flashscope.families.triton_bwd import TritonBwdConfig
from flashscope.families.triton_fwd import TritonFwdConfig
from flashscope.masks import Mask
from flashscope.errors import ConfigError
from flashscope.testing.inputs import fresh_seed, make_qkv
from flashscope.testing.reference import (ERROR_BOUND, reference_attention, rel_error,
                                          reference_attention_grads)

from .prebuild import Builds, mark_release_difference, prebuild


SMALL_FWD = TritonFwdConfig(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
# Resident tiles larger than streamed ones (as the defaults), several tiles per length.
SMALL = TritonBwdConfig(BLOCK_M1=16, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=16, num_warps=4,
                           num_stages=1, PRE_BLOCK=16)

# Per-dtype bounds on max|got - ref| / max|ref| (the metric of flashscope.testing.reference).
# Worst gradient measured on the interpreter over 12 random cases per dtype: 5.6e-4 (fp16,
# within the shared output bound) and 1.2e-2 (bf16: ds and p are rounded to bf16 before
# their products, 2^-8 each, so gradients need more room than the output's 1.6e-2 leaves).
GRAD_BOUND = {torch.float16: ERROR_BOUND[torch.float16], torch.bfloat16: 3e-2}
# Gradients that are zero in exact arithmetic (a query that sees one key has dq = 0) are
# measured against this floor instead of their own vanishing maximum.
ABS_FLOOR = 1e-2


def reference_grads(q, k, v, dout, *, is_causal, scale):
    """(out, dq, dk, dv) in float64 by autograd through ``reference_attention`` (GQA by
    repeating kv heads, whose gradients autograd sums back over each group)."""
    qd, kd, vd = (t.detach().double().cpu().requires_grad_() for t in (q, k, v))
    out = reference_attention(qd, kd, vd, is_causal=is_causal, scale=scale)
    out.backward(dout.double().cpu())
    return out.detach(), qd.grad, kd.grad, vd.grad


def grad_error(got, ref) -> float:
    """max|got - ref| / max(max|ref|, ABS_FLOOR); inf if got has NaN/inf (never passes)."""
    g = got.detach().double().cpu()
    if not torch.isfinite(g).all():
        return math.inf
    if ref.numel() == 0:
        return 0.0
    return (g - ref).abs().max().item() / max(ref.abs().max().item(), ABS_FLOOR)


def check_grads(tag, got, ref, dtype):
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert g.shape == r.shape, f"{name} shape {tuple(g.shape)} != {tuple(r.shape)} ({tag})"
        assert not torch.isnan(g).any(), f"{name}: unwritten or NaN elements ({tag})"
        err = grad_error(g, r)
        assert err <= GRAD_BOUND[dtype], \
            f"{name} relative error {err:.2e} > {GRAD_BOUND[dtype]:.0e} ({tag})"


def run_case(device, *, B, H, Hkv, Nq, Nk, D, causal, dtype, bnhd, cfg=SMALL):
    seed = fresh_seed()
    q, k, v = make_qkv(device, B, H, Nq, Nk, D, Hkv=Hkv, dtype=dtype, bnhd=bnhd)
    dout = torch.randn(q.shape, device=q.device).to(dtype)
    scale = 1.0 / math.sqrt(D)
    out, lse = launch.forward(q, k, v, mask=Mask.of(causal), scale=scale, cfg=SMALL_FWD,
                              return_lse=True)
    # Poisoned buffers laid out like the inputs: every element must be written.
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    got = launch.backward(dout, q, k, v, out, lse, mask=Mask.of(causal), scale=scale, cfg=cfg,
                          dq=dq, dk=dk, dv=dv)
    assert got[0] is dq and got[1] is dk and got[2] is dv
    _, *ref = reference_grads(q, k, v, dout, is_causal=causal, scale=scale)
    tag = (f"seed={seed} B={B} H={H}/{Hkv} Nq={Nq} Nk={Nk} D={D} causal={causal} {dtype} "
           f"bnhd={bnhd} {cfg.label}")
    check_grads(tag, got, ref, dtype)


# (causal, Nq, Nk, D, Hkv, bnhd): every switch in a few cases. H = 4.
CPU_CASES = [
    (False, 17, 33, 32, 4, False),    # ragged M and N, non-causal
    (True, 17, 33, 32, 2, True),      # causal, Nq < Nk (keys no query sees), GQA, strided
    (True, 129, 77, 80, 2, False),    # causal, Nq > Nk, padded head dim, GQA
    (False, 1, 37, 64, 1, True),      # one query row, MQA, strided
    (True, 64, 64, 128, 4, False),    # both lengths tile multiples, D = 128
    (False, 129, 16, 80, 4, True),    # Nk one tile, ragged M
]


@pytest.mark.parametrize("causal,Nq,Nk,D,Hkv,bnhd", CPU_CASES,
                         ids=[f"{'causal' if c[0] else 'full'}-q{c[1]}-k{c[2]}-d{c[3]}-kv{c[4]}"
                              f"{'-bnhd' if c[5] else ''}" for c in CPU_CASES])
def test_fp16_grads_match_float64(device, causal, Nq, Nk, D, Hkv, bnhd):
    run_case(device, B=1, H=4, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal,
             dtype=torch.float16, bnhd=bnhd)


@pytest.mark.parametrize("D,extra,unit", [(40, 0, 8), (72, 0, 8), (40, 4, 1), (64, 0, 1)])
def test_rows_in_16_byte_units(device, D, extra, unit):
    """Rows a multiple of 16 bytes apart but not of 16 elements (D = 40, 72: the portable
    kernels take ROW_UNIT = 8 and read them 16 bytes at a time), rows 8 bytes apart (a
    view of 44-wide rows: no unit) and D = 64 (Triton knows its strides: no unit): the
    forward and the gradients against the float64 reference, outputs poisoned, GQA,
    ragged lengths, causal. With the group shared among 2 programs, fp32 partial sums
    take a unit of 4 elements."""
    from flashscope.families.base import row_unit

    seed = fresh_seed()
    dev = "cuda" if device == "cuda" else "cpu"

    def tensor(h, n):
        t = torch.randn(1, h, n, D + extra, device=dev).to(torch.float16)
        return t[..., :D]

    q, k, v = tensor(4, 45), tensor(2, 70), tensor(2, 70)
    assert row_unit(q, k, v) == unit
    if unit > 1:
        assert row_unit(q, torch.empty(1, 2, 70, D, dtype=torch.float32)) == 4
    scale = 1.0 / math.sqrt(D)
    out = torch.full_like(q, float("nan"))
    out, lse = launch.forward(q, k, v, mask=Mask.of(True), scale=scale, cfg=SMALL_FWD,
                              return_lse=True, out=out)
    ref = reference_attention(q, k, v, is_causal=True)
    assert not torch.isnan(out).any() and rel_error(out, ref) <= ERROR_BOUND[q.dtype]
    dout = torch.randn(q.shape, device=q.device).to(q.dtype)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    got = launch.backward(dout, q, k, v, out, lse, mask=Mask.of(True), scale=scale, cfg=SMALL,
                          dq=dq, dk=dk, dv=dv)
    _, *ref = reference_grads(q, k, v, dout, is_causal=True, scale=scale)
    check_grads(f"seed={seed} D={D} rows {D + extra} apart", got, ref, q.dtype)


@pytest.mark.parametrize("splits", [2, 3, 8])
def test_group_shared_among_programs(device, monkeypatch, splits):
    """dK/dV with a GQA group's heads shared among ``splits`` programs (fp32 partial
    sums added after; 3 shares 8 heads unevenly, 8 gives each program one head):
    gradients within the float64 bound, every element written, the same bits on a
    second run, and a dQ that the split does not touch."""
    monkeypatch.setattr(triton_bwd, "splits_for", lambda q, k, cfg: splits)
    run_case(device, B=2, H=8, Hkv=1, Nq=45, Nk=70, D=32, causal=True,
             dtype=torch.float16, bnhd=True)
    q, k, v = make_qkv(device, 1, 4, 40, 40, 32, Hkv=2, dtype=torch.float16)
    dout = torch.randn(q.shape, device=q.device).to(q.dtype)
    out, lse = launch.forward(q, k, v, mask=Mask.of(False), scale=0.2, cfg=SMALL_FWD,
                              return_lse=True)
    a = launch.backward(dout, q, k, v, out, lse, mask=Mask.of(False), scale=0.2, cfg=SMALL)
    b = launch.backward(dout, q, k, v, out, lse, mask=Mask.of(False), scale=0.2, cfg=SMALL)
    assert all(torch.equal(x, y) for x, y in zip(a, b)), "not deterministic"


def test_group_splits_rule():
    """1 without GQA or with a grid already wide; else the least power of two reaching
    SPLIT_BELOW programs an SM, at most the group."""
    sms, below = 132, triton_bwd.SPLIT_BELOW
    assert triton_bwd.group_splits(100, 1, sms) == 1
    assert triton_bwd.group_splits(below * sms, 8, sms) == 1
    s = triton_bwd.group_splits(128, 16, sms)
    assert 128 * s >= below * sms > 128 * s // 2 and s & (s - 1) == 0
    assert triton_bwd.group_splits(2, 4, sms) == 4


@pytest.mark.parametrize("causal,Nq,Nk,D,Hkv", [
    (True, 70, 45, 96, 2),     # 64 + 32 columns, causal, GQA
    (False, 33, 50, 48, 1),    # 32 + 16, MQA, ragged
    (True, 40, 40, 160, 4),    # 128 + 32
])
def test_head_dim_tails_match_float64(device, causal, Nq, Nk, D, Hkv):
    """Head dims between two powers of two run as two column parts
    (:func:`flashscope.families.base.head_parts`): each product sums both parts, each
    gradient is written in both."""
    from flashscope.families.base import head_parts

    assert head_parts(D)[1] > 0
    run_case(device, B=1, H=4, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal,
             dtype=torch.float16, bnhd=bool(Nq % 2))


def test_two_passes_give_24_column_tails_more_columns():
    """A 32-column tail holding 24 columns (D = 88, 152) runs as a 64-column one or the
    whole padded width (Triton 3.6 built its dK/dV product with a shared-memory address
    out of range); the others keep :func:`~flashscope.families.base.head_parts`'."""
    from flashscope.families.base import head_parts

    assert triton_bwd.parts(88) == (128, 0) and triton_bwd.parts(152) == (128, 64)
    for D in (40, 48, 72, 80, 96, 112, 136, 160, 184, 200):
        assert triton_bwd.parts(D) == head_parts(D)
    q = torch.empty(1, 2, 40, 88, dtype=torch.float16, device="meta")
    lse = torch.empty(1, 2, 40, dtype=torch.float32, device="meta")
    launches = triton_bwd.calls(q, q, q, q, q, lse, lse, q, q, q, mask=Mask.of(False),
                                scale=0.1, cfg=SMALL)
    assert (launches["bwd_dkdv"][3]["HEAD_DIM_PAD"], launches["bwd_dkdv"][3]["HEAD_TAIL"]) \
        == (128, 0)


@pytest.mark.parametrize("D", [88, 152])
def test_two_passes_match_float64_at_24_column_tails(device, D):
    """The head dims of the test above, ragged lengths, the default tiles of an sm_90
    (the build that failed: 32 x 64 and 64 x 32 tiles, 4 warps, 3 stages)."""
    cfg = triton_bwd.select(Problem("sm90", "bfloat16", D))
    run_case(device, B=1, H=2, Hkv=2, Nq=127, Nk=127, D=D, causal=False,
             dtype=torch.bfloat16, bnhd=False, cfg=cfg)


def test_head_dim_tails_with_a_window_and_softcap(device):
    fresh_seed()
    q, k, v = make_qkv(device, 1, 4, 37, 52, 80, Hkv=2, dtype=torch.float16,
                       scale_inputs=3.0, bnhd=True)
    dout = torch.randn(q.shape, device=q.device).to(q.dtype)
    mask = Mask.of(True, (11, 0), "bottom_right", 3.0)
    scale = 80 ** -0.5
    out, lse = launch.forward(q, k, v, mask=mask, scale=scale, cfg=SMALL_FWD, return_lse=True)
    got = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    launch.backward(dout, q, k, v, out, lse, mask=mask, scale=scale, cfg=SMALL,
                    dq=got[0], dk=got[1], dv=got[2])
    _, *ref = reference_attention_grads(q, k, v, dout, is_causal=True, window=(11, 0),
                                        align="bottom_right", softcap=3.0, scale=scale)
    check_grads("D=80 window (11, 0) bottom-right softcap 3", got, [r.cpu() for r in ref],
                torch.float16)


def test_backward_launches_take_the_head_dim_parts():
    """D = 80 runs its two main kernels as 64 + 16 columns; the delta kernel, which only
    reads O and dO once, keeps the padded width."""
    q = torch.empty(1, 2, 40, 80, dtype=torch.float16, device="meta")
    lse = torch.empty(1, 2, 40, dtype=torch.float32, device="meta")
    launches = triton_bwd.calls(q, q, q, q, q, lse, lse, q, q, q, mask=Mask.of(True),
                                scale=0.1, cfg=SMALL, side_by_side=True)
    consts = {name: launches[name][3] for name in launches}
    assert (consts["bwd_dkdv"]["HEAD_DIM_PAD"], consts["bwd_dkdv"]["HEAD_TAIL"]) == (64, 16)
    assert (consts["bwd_dq"]["HEAD_DIM_PAD"], consts["bwd_dq"]["HEAD_TAIL"]) == (64, 16)
    assert consts["bwd_preprocess"]["HEAD_DIM_PAD"] == 128
    q = torch.empty(1, 2, 40, 128, dtype=torch.float16, device="meta")
    launches = triton_bwd.calls(q, q, q, q, q, lse, lse, q, q, q, mask=Mask.of(True),
                                scale=0.1, cfg=SMALL)
    assert (launches["bwd_dq"][3]["HEAD_DIM_PAD"], launches["bwd_dq"][3]["HEAD_TAIL"]) == \
        (128, 0)


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_grads_match_float64(device, causal):
    run_case(device, B=1, H=2, Hkv=1, Nq=33, Nk=47, D=64, causal=causal,
             dtype=torch.bfloat16, bnhd=True)


def test_causal_single_query_has_zero_dq_dk(device):
    # Query 0 sees key 0 only: p = 1, so ds = dp - delta = 0 and dq, dk vanish.
    run_case(device, B=1, H=2, Hkv=2, Nq=1, Nk=5, D=16, causal=True, dtype=torch.float16,
             bnhd=False)


def test_large_scores_stay_finite(device):
    fresh_seed()
    q, k, v = make_qkv(device, 1, 2, 33, 40, 64, dtype=torch.float16, scale_inputs=30.0)
    dout = torch.randn(q.shape, device=q.device).to(q.dtype)
    scale = 0.125
    out, lse = launch.forward(q, k, v, mask=Mask.of(True), scale=scale, cfg=SMALL_FWD,
                              return_lse=True)
    got = launch.backward(dout, q, k, v, out, lse, mask=Mask.of(True), scale=scale, cfg=SMALL)
    _, *ref = reference_grads(q, k, v, dout, is_causal=True, scale=scale)
    assert all(torch.isfinite(g).all() for g in got), "exp2 overflow leaked into a gradient"
    # Rows are near one-hot, so the true dq and dk vanish (about 1e-116) and what the
    # kernels return is the fp16 rounding of O carried through delta = rowsum(dO * O), as in
    # every backward that reads the stored O; dv = P^T dO stays well conditioned.
    assert grad_error(got[2], ref[2]) <= GRAD_BOUND[torch.float16]


def test_deterministic(device):
    fresh_seed()
    q, k, v = make_qkv(device, 1, 4, 40, 40, 32, Hkv=1, dtype=torch.float16)
    dout = torch.randn(q.shape, device=q.device).to(q.dtype)
    out, lse = launch.forward(q, k, v, mask=Mask.of(True), scale=0.2, cfg=SMALL_FWD, return_lse=True)
    a = launch.backward(dout, q, k, v, out, lse, mask=Mask.of(True), scale=0.2, cfg=SMALL)
    b = launch.backward(dout, q, k, v, out, lse, mask=Mask.of(True), scale=0.2, cfg=SMALL)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_empty_lengths_give_zero_grads(device):
    for nq, nk in ((0, 5), (4, 0)):
        q, k, v = make_qkv(device, 1, 2, nq, nk, 32, dtype=torch.float16)
        dout = torch.randn(q.shape, device=q.device).to(q.dtype)
        lse = torch.zeros(q.shape[:3], device=q.device)
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        launch.backward(dout, q, k, v, q, lse, mask=Mask(), scale=0.2, cfg=SMALL,
                        dq=dq, dk=dk, dv=dv)
        assert all(torch.count_nonzero(g) == 0 for g in (dq, dk, dv)), (nq, nk)


# --- through the public API (autograd) -------------------------------------------------

def test_autograd_through_attention(device):
    seed = fresh_seed()
    q, k, v = make_qkv(device, 2, 4, 45, 30, 64, Hkv=2, dtype=torch.float16, bnhd=True)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flashscope.attention(q, k, v, is_causal=True, enable_gqa=True)
    assert out.requires_grad
    dout = torch.randn(q.shape, device=q.device).to(q.dtype)
    out.backward(dout)
    _, *ref = reference_grads(q, k, v, dout, is_causal=True, scale=1 / 8)
    check_grads(f"seed={seed} api", (q.grad, k.grad, v.grad), ref, torch.float16)
    assert q.grad.stride() == q.stride(), "dq should be laid out like q"


def test_lse_is_not_differentiable_and_sum_grad_works(device):
    # out.sum() sends a stride-0 (expanded) gradient into the kernels.
    fresh_seed()
    q, k, v = (t.requires_grad_() for t in make_qkv(device, 1, 2, 20, 24, 32,
                                                    dtype=torch.float16))
    out, lse = flashscope.attention(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    out.float().sum().backward()
    ones = torch.ones(q.shape, dtype=q.dtype, device=q.device)
    _, *ref = reference_grads(q, k, v, ones, is_causal=False, scale=1 / math.sqrt(32))
    check_grads("sum", (q.grad, k.grad, v.grad), ref, torch.float16)


def test_repeated_calls_take_the_bound_backward(device):
    """A differentiable call's backward goes through its record's bound backward: on a
    GPU the second call of a geometry builds no launch (no Triton binding), each call's
    gradients match float64 even where the first call passed one tensor as q, k and v
    (the plan marks roles, not tensors), and the plan keeps no tensor alive. On CPU it
    runs the plain backward."""
    from flashscope.api import _BOUND

    fresh_seed()
    _BOUND.clear()  # only this test's records below (a cache: clearing it changes no result)
    shape = (1, 2, 40, 32)
    x = torch.randn(shape, device=device).half().requires_grad_()
    out = flashscope.attention(x, x, x, is_causal=True)
    dout = torch.randn(shape, device=device).half()
    out.backward(dout)
    _, dq, dk, dv = reference_grads(x, x, x, dout, is_causal=True, scale=1 / math.sqrt(32))
    # x.grad is dq + dk + dv added in fp16: each within the bound of its own largest
    # value, so the sum within the bound of theirs added
    got = x.grad.double().cpu()
    assert torch.isfinite(got).all()
    err = (got - (dq + dk + dv)).abs().max() / sum(t.abs().max() for t in (dq, dk, dv))
    assert err <= GRAD_BOUND[torch.float16], f"one tensor: relative error {err:.2e}"
    jit = launch.LAUNCHES["jit"]
    for _ in range(2):
        q, k, v = (torch.randn(shape, device=device).half().requires_grad_()
                   for _ in range(3))
        out = flashscope.attention(q, k, v, is_causal=True)
        dout = torch.randn(shape, device=device).half()
        out.backward(dout)
        _, *ref = reference_grads(q, k, v, dout, is_causal=True, scale=1 / math.sqrt(32))
        check_grads("distinct tensors", (q.grad, k.grad, v.grad), ref, torch.float16)
    if device != "cuda":
        return  # CPU calls keep no record (the plain backward runs, checked above)
    assert launch.LAUNCHES["jit"] == jit, "a bound backward bound its launches again"
    plans = [go for b in _BOUND.values() if b._backward is not None
             for go in b._backward.plans.values()]
    assert len(plans) == 1 and callable(plans[0]), plans
    for go in plans:
        launches = go.__closure__[go.__code__.co_freevars.index("plans")].cell_contents
        assert list(launches) == ["bwd_dq", "bwd_dkdv"]  # dQ forms delta
        for _kernel, _grid, args, fills, *_ in launches.values():
            assert not any(isinstance(a, torch.Tensor) for a in args), \
                "a bound backward keeps tensors of its first call"
            assert len(fills) >= 8  # each pass: q, k, v, dout, lse, delta, two outputs


@pytest.mark.gpu
def test_gqa_passes_run_side_by_side(device, monkeypatch):
    """Under GQA on a GPU the dQ pass runs on a second stream beside dK/dV after the
    delta preprocess: the stream was made, and its gradients and those of the passes in
    turn (dQ forming delta) meet the float64 bound."""
    if device != "cuda":
        pytest.skip("streams are for GPU tensors")
    fresh_seed()
    q, k, v = make_qkv(device, 2, 8, 300, 333, 64, Hkv=2, dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    mask = Mask.of(True)
    out, lse = launch.forward(q, k, v, mask=mask, scale=0.125, cfg=SMALL_FWD, return_lse=True)
    cfg = triton_bwd.select(Problem("sm90", "bfloat16", 64, True))
    assert triton_bwd.concurrent(q, k, mask) and not triton_bwd.concurrent(q, q, mask)
    assert not triton_bwd.concurrent(q, k, Mask.of(False))  # even programs: in turn
    assert triton_bwd.concurrent(q, k, Mask.of(False, (64, 64)))
    triton_bwd._SIDE.clear()
    side = launch.backward(dout, q, k, v, out, lse, mask=mask, scale=0.125, cfg=cfg)
    torch.cuda.synchronize()
    assert triton_bwd._SIDE, "no second stream was used"
    monkeypatch.setattr(triton_bwd, "concurrent", lambda *_: False)
    turns = launch.backward(dout, q, k, v, out, lse, mask=mask, scale=0.125, cfg=cfg)
    _, *ref = reference_grads(q, k, v, dout, is_causal=True, scale=0.125)
    check_grads("side by side", side, ref, torch.bfloat16)
    check_grads("in turn", turns, ref, torch.bfloat16)


def test_second_stream_order_and_threads(monkeypatch):
    """The side-by-side schedule's stream order, with stand-ins for torch's CUDA streams
    and events (no GPU needed): the preprocess on the caller's stream, dQ on the second
    stream after it waits for an event recorded there, dK/dV on the caller's stream, which
    waits for dQ's event before the group sum; another thread gets a stream and events
    of its own."""
    import contextlib
    import threading

    log = []

    class Stream:
        device_index, device = 0, "cuda:0"

        def __init__(self, name="side", device=None):
            self.name = name

        def wait_event(self, e):
            log.append(f"{self.name} waits {e.name}")

    class Event:
        made = 0

        def __init__(self):
            Event.made += 1
            self.name = f"e{Event.made}"

        def record(self, stream):
            log.append(f"{self.name} on {stream.name}")

    current = []

    @contextlib.contextmanager
    def on(stream):
        current.append(stream.name)
        yield
        current.pop()

    main = Stream("main")
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    monkeypatch.setattr(triton_bwd, "_SIDE", {})
    launches = {name: (lambda name=name: log.append(f"{name} on "
                                                   f"{current[-1] if current else 'main'}"))
                for name in ("bwd_preprocess", "bwd_dkdv", "bwd_dq", "bwd_sum")}
    triton_bwd._launch(launches, True, torch.device("cuda", 0))
    assert log == ["bwd_preprocess on main", "e1 on main", "side waits e1", "bwd_dq on side",
                   "bwd_dkdv on main", "e2 on side", "main waits e2", "bwd_sum on main"]
    other = threading.Thread(target=triton_bwd._launch,
                             args=(launches, True, torch.device("cuda", 0)))
    other.start()
    other.join()
    assert Event.made == 4 and len(triton_bwd._SIDE) == 2  # not the first thread's


@pytest.mark.parametrize("splits", [1, 2])
def test_delta_by_the_preprocess_matches_float64(device, monkeypatch, splits):
    """The schedule a GPU runs under GQA (delta by its own launch, then dK/dV and dQ,
    then the group sum), here in order: the gradients meet the float64 bound as those of
    dQ forming delta do (the other tests), with a head-dim tail and ragged lengths."""
    monkeypatch.setattr(triton_bwd, "concurrent", lambda *_: True)
    monkeypatch.setattr(triton_bwd, "splits_for", lambda q, k, cfg: splits)
    run_case(device, B=2, H=4, Hkv=2, Nq=37, Nk=50, D=80, causal=True,
             dtype=torch.float16, bnhd=True)


def test_no_grad_inputs_skip_autograd(device):
    q, k, v = make_qkv(device, 1, 2, 8, 8, 32, dtype=torch.float16)
    assert not flashscope.attention(q, k, v).requires_grad


# --- the config record -------------------------------------------------------------------

@pytest.mark.parametrize("target", ["sm90", "sm80", "gfx942", "gfx1100"])
@pytest.mark.parametrize("head_dim", [1, 64, 80, 128, 160, 192, 256])
def test_default_bwd_configs_pass_their_checks(target, head_dim):
    cfg = triton_bwd.select(Problem(target, "bfloat16", head_dim))
    assert triton_bwd.check(cfg, target, head_dim, "bfloat16") is cfg


@pytest.mark.parametrize("changes,pattern", [
    ({"BLOCK_M1": 24}, r"BLOCK_M1=24: expected a power of two"),
    ({"BLOCK_N2": 8}, r"BLOCK_N2=8: expected a power of two in 16..256"),
    ({"PRE_BLOCK": 512}, r"PRE_BLOCK=512"),
    ({"num_warps": 3}, r"num_warps=3"),
    ({"num_stages": 0}, r"num_stages=0: expected 1..8"),
    ({"waves_per_eu": 2}, r"waves_per_eu=2 is an AMD option"),
    ({"maxnreg": 300}, r"maxnreg=300: expected 16..255"),
    ({"BLOCK_M1": 256, "num_stages": 4}, r"needs at least 768 KB of shared memory"),
])
def test_bad_bwd_configs_are_rejected(changes, pattern):
    with pytest.raises(ConfigError, match=pattern):
        triton_bwd.check(TritonBwdConfig().replace(**changes), "sm90", 256, "bfloat16")


def test_bwd_config_parse_and_key():
    cfg = TritonBwdConfig.parse("BLOCK_M1=64, num_warps=8,maxnreg=128")
    assert (cfg.BLOCK_M1, cfg.num_warps, cfg.maxnreg, cfg.BLOCK_N1) == (64, 8, 128, 128)
    assert cfg.label == "triton-bwd dkdv 64x128 dq 128x32 w8 s3 maxnreg=128"
    assert TritonBwdConfig.from_dict(cfg.as_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown key"):
        TritonBwdConfig.parse("BLOCK_M=64")
    with pytest.raises(ConfigError, match="BLOCK_N2 expects an integer"):
        TritonBwdConfig.parse("BLOCK_N2=big")


# --- the broader GPU set -----------------------------------------------------------------

GPU_CASES = [
    pytest.param(causal, nq, nk, D, hkv, dtype,
                 id=f"{'causal' if causal else 'full'}-q{nq}-k{nk}-d{D}-kv{hkv}-{str(dtype)[6:]}")
    for dtype in (torch.float16, torch.bfloat16)
    for causal in (False, True)
    for D in (64, 80, 128, 256)
    for (nq, nk, hkv) in ((17, 300, 2), (1000, 1000, 1), (513, 1024, 4))
]


@pytest.mark.gpu
@pytest.mark.parametrize("causal,Nq,Nk,D,Hkv,dtype", GPU_CASES)
def test_gpu_default_config_grads(device, causal, Nq, Nk, D, Hkv, dtype):
    cfg = triton_bwd.select(Problem("sm90", str(dtype)[6:], D, causal))
    run_case(device, B=2, H=8, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal, dtype=dtype,
             bnhd=bool(Nq % 2), cfg=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [
    TritonBwdConfig(32, 128, 128, 32, 4, 3),
    TritonBwdConfig(64, 64, 64, 64, 4, 2),
    TritonBwdConfig(16, 64, 64, 16, 4, 1),
    TritonBwdConfig(32, 128, 128, 32, 8, 2, maxnreg=168),
], ids=lambda c: c.label.replace(" ", "_"))
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_other_tiles(device, cfg, causal):
    run_case(device, B=2, H=4, Hkv=2, Nq=700, Nk=650, D=64, causal=causal,
             dtype=torch.bfloat16, bnhd=True, cfg=cfg)


# --- offline compilation (no GPU): what the launcher launches, built for sm90 -----------

#: the sm_90 builds each offline test compiles (:func:`_prebuilt` compiles them ahead)
BUILDS = Builds()
#: What a Triton release's binaries do not meet, measured by running this file under it
#: (:func:`.prebuild.mark_release_difference`)
RELEASE_DIFFERENCES = {
    (3, 9): {  # ptxas 13.4 (ptxas-blackwell) builds sm_90
        "test_sm90_bwd_default_builds_keep_their_registers[64-False-False-8]":
            "4/9 spill stores/loads",
        "test_sm90_bwd_default_builds_keep_their_registers[64-True-False-32]":
            "34 spill stores",
        "test_sm90_bwd_default_builds_keep_their_registers[128-True-False-0]":
            "1 spill store",
        "test_sm90_bwd_default_builds_keep_their_registers[64-False-True-16]":
            "11/27 spill stores/loads",
        "test_sm90_bwd_default_builds_keep_their_registers[64-True-True-16]":
            "16/36 spill stores/loads",
    },
}


@pytest.fixture(autouse=True)
def _release_differences(request):
    mark_release_difference(request, RELEASE_DIFFERENCES)


@pytest.fixture(scope="module", autouse=True)
def _prebuilt(request):
    """The selected offline tests' builds, compiled at once before any test runs
    (:mod:`.prebuild`)."""
    prebuild(request, BUILDS)


def _record(builds, **kw):
    """The record of a test's one build (``builds``: its entry of BUILDS)."""
    from flashscope.isa import inspect_config

    (cfg, build_kw), = builds.values()
    return inspect_config(cfg, "sm90", **build_kw, **kw)


@BUILDS.of("test_bwd_kernels_build_offline")
def _kernel_builds(kernel, hkv):
    return {None: (TritonBwdConfig(16, 32, 32, 16, 4, 1, PRE_BLOCK=16),
                   dict(kernel=kernel, head_dim=80, causal=True, problem=(1, 4, hkv, 100, 70)))}


@pytest.mark.parametrize("kernel,hkv", [
    ("bwd_preprocess", 2), ("bwd_dkdv", 2), ("bwd_dq", 2), ("bwd_dq", 4), ("bwd_sum", 2),
], ids=["preprocess", "dkdv", "dq", "dq-own-delta", "sum"])
def test_bwd_kernels_build_offline(kernel, hkv):
    """Each launch builds for sm90 as a GPU runs it: under GQA the preprocess, the passes
    and the group sum; without GQA the dQ pass forming delta."""
    rec = _record(_kernel_builds(kernel, hkv))
    assert rec.registers > 0 and rec.threads == 128
    assert rec.kernel.startswith("_attn_bwd")
    if kernel in ("bwd_dkdv", "bwd_dq"):
        assert "HGMMA" in rec.opcodes or "HMMA" in rec.opcodes, "backward GEMMs on tensor cores"


@pytest.mark.parametrize("hkv,causal,own", [(4, True, True), (2, False, True),
                                             (2, True, False)])
def test_offline_dq_follows_the_schedule(hkv, causal, own):
    """An offline build of the dQ pass is the one a GPU runs: forming delta itself unless
    GQA with a band puts the passes side by side after the preprocess."""
    from flashscope.variants import bwd_call

    _, consts = bwd_call("bwd_dq")(SMALL, (1, 4, hkv, 100, 70), 64, "bfloat16", causal)
    assert consts["OWN_DELTA"] is own


@BUILDS.of("test_dkdv_keeps_its_wgmma_pipelined_under_a_mask")
def _dkdv_builds(causal, extra):
    return {None: (triton_bwd.select(Problem("sm90", "bfloat16", 64, causal)),
                   dict(kernel="bwd_dkdv", head_dim=64, causal=causal,
                        problem=(2, 8, 8, 1024, 1024), **extra))}


@pytest.mark.parametrize("causal,extra", [
    (True, {}),
    (True, {"align": "bottom_right", "softcap": 30.0}),
    (False, {"window": (256, 256)}),
    (True, {"varlen": True}),
], ids=["causal", "bottom-right-softcap", "window", "varlen-causal"])
def test_dkdv_keeps_its_wgmma_pipelined_under_a_mask(causal, extra):
    # Split into masked and whole segments, the dK/dV loop handed its accumulators from one
    # loop to the next with wgmma still in flight, and ptxas serialized every wgmma of the
    # kernel (the backward read 0.84x the pipelined one's speed, causal D = 128 on an H100)
    rec = _record(_dkdv_builds(causal, extra), occupancy=False)
    assert "HGMMA" in rec.opcodes
    assert rec.wgmma_serialized == 0, rec.wgmma_serialized


@pytest.mark.parametrize("head_dim,expected", [
    (128, (32, 64, 64, 32, 4, 3)), (144, (32, 64, 64, 32, 4, 3)),
    (160, (32, 64, 64, 32, 4, 3)), (176, (16, 64, 64, 16, 4, 3)),
    (192, (16, 64, 64, 16, 4, 3)), (200, (64, 64, 64, 64, 8, 2)),
    (256, (64, 64, 64, 64, 8, 2)),
])
def test_bwd_default_follows_the_built_width(head_dim, expected):
    # 160 builds 128 + 32 columns, so it takes the row of the widths it builds, not D = 256's
    cfg = triton_bwd.select(Problem("sm90", "bfloat16", head_dim))
    assert (cfg.BLOCK_M1, cfg.BLOCK_N1, cfg.BLOCK_M2, cfg.BLOCK_N2, cfg.num_warps,
            cfg.num_stages) == expected


def test_offline_build_rejects_unknown_kernel():
    from flashscope.compile import build

    with pytest.raises(ConfigError, match="unknown kernel.*did you mean 'bwd_dkdv'"):
        build(TritonBwdConfig(), "sm90", kernel="bwd_dkv")


# === the Hopper backward (sm90-bwd) ========================================================
# Gluon kernels do not run in Triton's interpreter: off a GPU it is built for sm_90 and read
# from its binary (its rule and the deterministic switch are pure); its gradients are
# checked on a GPU.


# --- offline builds ------------------------------------------------------------------------

def _sm90_default(head_dim, banded=False, softcap=False, **fields):
    """The family's default config for a problem of this head dim and mask."""
    return sm90_bwd.select(Problem("sm90", "bfloat16", head_dim, window=banded,
                                   softcap=softcap, **fields))


@pytest.mark.parametrize("fields,rows", [
    ({}, 128), ({"causal": True}, 128), ({"varlen": True, "causal": True}, 128),
    ({"banded": True}, 128),  # a band as wide as the rows (bottom-right causal)
    ({"banded": True, "band_keys": 1024}, 128), ({"banded": True, "band_keys": 4096}, 128),
    ({"banded": True, "band_keys": 512}, 64), ({"banded": True, "band_keys": 128}, 64),
    ({"banded": True, "band_keys": 4096, "varlen": True}, 64),
    ({"softcap": True}, 128), ({"softcap": True, "causal": True}, 64),
    ({"softcap": True, "banded": True, "band_keys": 4096}, 64)])
def test_sm90_bwd_query_rows_at_d64_follow_the_whole_tiles(fields, rows):
    """D <= 64 streams 128-row query tiles where most of a key tile's query tiles are
    whole (no band, or one of 1024 keys or more, dense; a cap only without a mask); D > 64
    streams 64 whatever the mask."""
    assert _sm90_default(64, **fields).BLOCK_M == rows
    assert _sm90_default(48, **fields).BLOCK_M == rows
    assert _sm90_default(80, **fields).BLOCK_M == 64
    assert _sm90_default(128, **fields).BLOCK_M == 64


@BUILDS.of("test_sm90_bwd_default_builds_keep_their_registers")
def _default_builds(head_dim, causal, varlen, most):
    return {None: (_sm90_default(head_dim), dict(kernel="sm90-bwd", head_dim=head_dim,
                                                 causal=causal, varlen=varlen))}


@pytest.mark.parametrize("head_dim,causal,varlen,most", [
    (64, False, False, 8), (64, True, False, 12), (128, False, False, 0),
    (128, True, False, 0), (64, False, True, 16), (64, True, True, 18)])
def test_sm90_bwd_default_builds_keep_their_registers(head_dim, causal, varlen, most):
    """dP^T's accumulator starts at -delta, so no per-query delta vector stays live beside
    P^T and dP^T: the 128-row D = 64 tiles spill 5/5 stores/loads (5/8 causal, packed 8/14
    and 8/15), at most one reload a tile in the whole tiles' loop, against 75/94 (128/167
    causal) with delta live; D = 128 none (7/12 causal with delta live). The causal
    build's masked tiles compare constants (``_masked``): comparing the indices it
    spilled 12/22."""
    rec = _record(_default_builds(head_dim, causal, varlen, most))
    assert rec.spill_stores <= most and rec.spill_loads <= most
    assert rec.wgmma_serialized == 0


@BUILDS.of("test_sm90_bwd_builds_offline")
def _offline_builds(head_dim, causal, varlen, window, align, softcap):
    cfg = _sm90_default(head_dim, banded=bool(window) or align == "bottom_right",
                        softcap=bool(softcap))
    return {None: (cfg, dict(kernel="sm90-bwd", head_dim=head_dim, causal=causal,
                             problem=(2, 8, 2, 300 + (head_dim == 64), 700), varlen=varlen,
                             window=window, align=align, softcap=softcap))}


@pytest.mark.parametrize("head_dim,causal,varlen,window,align,softcap", [
    (64, False, False, None, "top_left", None), (64, True, False, None, "top_left", None),
    (128, False, False, None, "top_left", None), (128, True, False, None, "top_left", None),
    (64, False, True, None, "top_left", None), (128, True, True, None, "top_left", None),
    (128, True, False, (4096, 0), "top_left", None),
    (64, False, False, (256, 256), "top_left", None),
    (128, True, True, (4096, 0), "top_left", None),
    (128, True, True, None, "bottom_right", None),
    (128, True, False, None, "top_left", 30.0), (64, False, True, (256, 256), "top_left", 50.0),
    (96, True, False, None, "top_left", None), (80, False, True, None, "top_left", None),
    (48, True, False, (256, 0), "top_left", None), (88, True, True, (512, 0), "top_left", 30.0),
    (112, False, False, None, "top_left", None)])
def test_sm90_bwd_builds_offline(head_dim, causal, varlen, window, align, softcap):
    """Three partitions (12 warps), every product on wgmma with none serialized, dQ added
    by TMA reductions (UTMAREDG), one program an SM's shared memory; dense, packed, bands,
    packed bands, logit caps and head dims between the built widths (72-96 with a tail
    of their own, other ones padded)."""
    rec = _record(_offline_builds(head_dim, causal, varlen, window, align, softcap))
    assert rec.threads == 384
    assert rec.wgmma_serialized == 0
    assert {"HGMMA", "UTMALDG", "UTMAREDG"} <= set(rec.opcodes)
    assert 0 < rec.shared_bytes <= 227 * 1024


@pytest.mark.parametrize("extra,error,pattern", [
    ({"head_dim": 32}, ConfigError, "multiples of 8 from 40 to 256"),
    ({"head_dim": 100}, ConfigError, "multiples of 8 from 40 to 256"),
    ({"head_dim": 250}, ConfigError, "multiples of 8 from 40 to 256"),
    ({"target": "sm80"}, ConfigError, "not sm_90"),
])
def test_sm90_bwd_builds_refuse_what_it_does_not_run(extra, error, pattern):
    from flashscope.compile import build

    kw = {"target": "sm90", "head_dim": 128, "causal": True, **extra}
    with pytest.raises(error, match=pattern):
        build(Sm90BwdConfig(), kw.pop("target"), kernel="sm90-bwd", **kw)


@pytest.mark.parametrize("head_dim,cfg,pattern", [
    (256, Sm90BwdConfig(), "BLOCK_N=128: expected 64 at head dim 256"),
    (128, Sm90BwdConfig(BLOCK_N=64, DQ_SLOTS=0), "BLOCK_N=64: expected 128 at head dim 128"),
    (256, Sm90BwdConfig(BLOCK_N=64, DQ_SLOTS=1), "needs at least"),
])
def test_sm90_bwd_key_rows_follow_the_width(head_dim, cfg, pattern):
    """128 key rows up to D = 128, 64 above (the warpgroups split the head dim); at 256 a
    64 KB dQ slot does not fit beside the rings."""
    with pytest.raises(ConfigError, match=pattern):
        sm90_bwd.check(cfg, "sm90", head_dim)


@BUILDS.of("test_sm90_bwd_splits_the_head_dim_above_128")
def _split_builds(causal, varlen, window, softcap, most):
    cfg = _sm90_default(256, banded=bool(window), softcap=bool(softcap))
    return {None: (cfg, dict(kernel="sm90-bwd", head_dim=256, causal=causal,
                             problem=(2, 8, 2, 300, 700), varlen=varlen, window=window,
                             softcap=softcap))}


@pytest.mark.parametrize("causal,varlen,window,softcap,most", [
    (False, False, None, None, 10), (True, False, None, None, 12),
    (True, True, None, None, 16), (True, False, (4096, 0), 50.0, 12)])
def test_sm90_bwd_splits_the_head_dim_above_128(causal, varlen, window, softcap, most):
    """D = 256: 64-key programs whose warpgroups each take half the head dim (dK and dV
    of 64 x 128 a warpgroup), P^T and dS^T through shared memory, dQ added by 16-byte
    atomics (REDG, no TMA reduction, no dQ slot): every product on wgmma, none
    serialized, one program an SM (225 KB: two slots each for P^T and dS^T); dense,
    packed, a window with a logit cap; Nk = 700 runs its last key tile masked: 5-12
    spilled registers stored, 9-15 loaded (none at Nk = 1024 without a mask)."""
    cfg = _sm90_default(256, banded=bool(window), softcap=bool(softcap))
    assert (cfg.BLOCK_N, cfg.DQ_SLOTS) == (64, 0)
    rec = _record(_split_builds(causal, varlen, window, softcap, most))
    assert rec.threads == 384
    assert rec.wgmma_serialized == 0
    assert {"HGMMA", "UTMALDG", "REDG"} <= set(rec.opcodes)
    assert "UTMAREDG" not in rec.opcodes
    assert 0 < rec.shared_bytes <= 227 * 1024
    assert rec.spill_stores <= most and rec.spill_loads <= most


@BUILDS.of("test_sm90_bwd_runs_72_to_96_as_64_columns_and_a_tail")
def _tail_builds():
    return {D: (Sm90BwdConfig(), dict(kernel="sm90-bwd", head_dim=D, causal=True))
            for D in (96, 128)}


def test_sm90_bwd_runs_72_to_96_as_64_columns_and_a_tail():
    """D = 72-96 as 64 columns and a 16- or 32-column tail, whose own descriptors and dQ
    part the launch passes; the others at 64 or 128 with none. Built, D = 96 holds a
    quarter less shared memory than the 128 columns it was padded to, and spills
    nothing."""
    from flashscope.isa import inspect_config

    assert [sm90_bwd.parts(d) for d in (48, 64, 72, 80, 88, 96, 104, 128, 136, 192, 256)] == [
        (64, 0), (64, 0), (64, 16), (64, 16), (64, 32), (64, 32), (128, 0), (128, 0),
        (256, 0), (256, 0), (256, 0)]
    lse = torch.empty(1, 2, 40, dtype=torch.float32, device="meta")
    for D, tail in ((96, 32), (128, 0)):
        q = torch.empty(1, 2, 40, D, dtype=torch.bfloat16, device="meta")
        acc = torch.empty(sm90_bwd.acc_shape(q, None, Sm90BwdConfig()), device="meta")
        launches = sm90_bwd.calls(q, q, q, q, q, lse, lse, acc, q, q, mask=Mask.of(True),
                                  scale=0.1, cfg=Sm90BwdConfig(), dq=q)
        for name in ("sm90-bwd", "dq_unpack"):
            assert launches[name][3]["HEAD_TAIL"] == tail
        tails = launches["sm90-bwd"][2][-7:]  # Q, K, V, dO, dK, dV, the dQ buffer
        if tail:
            assert [d.block_shape[-1] for d in tails] == [32] * 6 + [8]
            assert launches["sm90-bwd"][2][4].block_shape == [256, 16]  # dQ's main part
        else:
            assert tails == (None,) * 7
    recs = {D: inspect_config(cfg, "sm90", **kw) for D, (cfg, kw) in _tail_builds().items()}
    assert recs[96].spill_stores == recs[96].spill_loads == 0
    assert recs[96].shared_bytes < 0.8 * recs[128].shared_bytes


# --- the dQ buffer's fragment order (its unpack launch, on the interpreter too) -----------

def _fragment_order(tile, block_m, head_dim, warps=8):
    """A dQ tile in the order the one pass's consumer writes it (the kernel's
    ``_fragments``: 16-byte chunks of each thread's accumulator registers), by torch."""
    wm = min(block_m // 16, warps)
    wn, ch = warps // wm, head_dim // (warps // wm) // 8
    return tile.reshape(wm, 2, 8, wn, ch, 4, 2).permute(4, 3, 0, 2, 5, 1, 6).reshape(-1)


@pytest.mark.parametrize("D,block_m", [(128, 64), (64, 64), (128, 128), (96, 64), (72, 64),
                                       (80, 128), (112, 64)])
@pytest.mark.parametrize("packed", [False, True])
def test_dq_unpack_reads_the_fragment_order(device, D, block_m, packed):
    """The fp32 dQ buffer holds each query tile in the consumer's register order; the
    launch after the one pass (``dq_unpack``, as ``sm90_bwd.calls`` builds it) returns
    every row scaled and cast into a NaN-poisoned dQ, (B, H, Nq, D) dense or a packed
    batch's (1, H, total, D) view with each sequence from its padded start; with a
    head-dim tail (D = 72, 80, 96) each buffer row holds the 64 columns' values, then the
    tail's. The tiles' rows past a head's or a sequence's end hold NaN, and so do a
    padded head's columns past D (D = 72 in 64 + 16, 112 in 128): none may reach dQ."""
    from flashscope import kernels
    from flashscope.launch import launch_jit
    from flashscope.varlen import _packed, _view

    fresh_seed()
    H, cfg, scale = 3, Sm90BwdConfig(BLOCK_M=block_m), 0.125
    dev = "cuda" if device == "cuda" else "cpu"
    if packed:
        lengths = (70, 0, 129, 1)
        cu = torch.tensor([0, 70, 70, 199, 200], dtype=torch.int32, device=dev)
        pk = _packed(cu, cu, max(lengths), max(lengths))
        q = _view(torch.randn(sum(lengths), H, D, device=dev).half())
        starts = [((int(cu[b]) + b * block_m) // block_m) * block_m for b in range(4)]
        seqs = [(0, b, starts[b], int(cu[b]), n) for b, n in enumerate(lengths)]
    else:
        lengths, pk = (100, 100), None
        q = torch.randn(2, H, 100, D, device=dev).half()
        seqs = [(b, b, 0, 0, 100) for b in range(2)]
    rows = sm90_bwd.row_shape(q, pk, cfg)
    acc = torch.full(sm90_bwd.acc_shape(q, pk, cfg), float("nan"), device=dev)
    main, tail = sm90_bwd.parts(D)
    W = main + tail
    tiles = acc.view(-1, rows[-1] // block_m if packed else -(-100 // block_m), block_m * W)
    dq = torch.full_like(q, float("nan"))
    want = torch.full_like(q, float("nan"), dtype=torch.float32)
    for batch, b, r0, q0, n in seqs:
        for h in range(H):
            head = h if packed else b * H + h
            for t in range(-(-n // block_m)):
                tile = torch.randn(block_m, W, device=dev)
                tile[n - t * block_m:] = float("nan")  # past the sequence's end
                tile[:, D:] = float("nan")  # a padded head's columns
                parts = [_fragment_order(tile[:, :main], block_m, main).view(256, -1)]
                if tail:  # a buffer row: the main part's values, then the tail's
                    parts.append(_fragment_order(tile[:, main:], block_m, tail).view(256, -1))
                tiles[head, r0 // block_m + t] = torch.cat(parts, 1).reshape(-1)
                m = min(block_m, n - t * block_m)
                want[batch, h, q0 + t * block_m:q0 + t * block_m + m] = tile[:m, :D] * scale
    lse = torch.zeros(rows, device=dev)
    fn, grid, args, consts, opts = sm90_bwd.calls(
        q, q, q, q, q, lse, lse, acc, q, q, mask=Mask.of(False), scale=scale, cfg=cfg,
        packed=pk, lse_rows=lse, dq=dq)["dq_unpack"]
    mod = kernels.load(sm90_bwd.MODULE, interpret=device == "cpu")
    launch_jit(getattr(mod, fn), grid, args, consts, opts, q.device)
    assert not torch.isnan(dq).any(), "dQ rows left unwritten or NaN read from the padding"
    assert torch.allclose(dq.float(), want, rtol=1e-3, atol=1e-3)


# --- the launch's switches ------------------------------------------------------------------

@pytest.mark.parametrize("n_q", [300, 2048, 513, 1, 129, 130])
def test_sm90_bwd_row_vectors_start_each_head_16_byte_aligned(n_q):
    """The log-sum-exp and delta come by TMA copies of (B H, Nq) views whose heads start
    16-byte aligned (a misaligned copy stopped the GPU with an illegal instruction):
    delta's heads Nq rounded up to 4 apart, and where Nq is not a multiple of 4 the
    log-sum-exp copied by the delta launch into a vector laid out so; else the copy reads
    the forward's own. Rows past Nq come zero-filled, not the next head's."""
    from flashscope.families import sm90_bwd
    from flashscope.variants import sm90_bwd_call

    B, H = 2, 8
    args, consts = sm90_bwd_call(Sm90BwdConfig(), (B, H, H, n_q, 700), 128, "bfloat16", True)
    lse_d, delta_d = args[5], args[6]
    pad = -(-n_q // 4) * 4
    for d in (lse_d, delta_d):
        assert d.shape == [B * H, n_q] and d.strides == [pad, 1] and d.padding == "zero"
        assert tuple(d.base.shape) == (B, H, pad if d is delta_d or n_q % 4 else n_q)
    q = torch.empty(B, H, n_q, 128, device="meta")
    assert sm90_bwd.row_shape(q, None, Sm90BwdConfig()) == (B, H, pad)
    assert sm90_bwd.copies_lse(q, None) is (n_q % 4 != 0)
    assert "ROWS_TMA" not in consts


@pytest.mark.parametrize("n_q", [37, 129, 64])
def test_delta_launch_copies_the_lse_into_aligned_heads(device, n_q):
    """Dense, with heads 4-row aligned (the Hopper backward's row vectors): delta =
    rowsum(dO O) and the log-sum-exp copied exactly, each head's Nq rows from a multiple
    of 4, the rows between untouched; and the dQ buffer (any length, here not a multiple of
    the programs' chunks) zeroed whole, nothing past it written."""
    from flashscope import kernels
    from flashscope.launch import launch_jit

    fresh_seed()
    B, H, D = 2, 3, 40
    out, dout = (torch.randn(B, H, n_q, D, device=device).half() for _ in range(2))
    lse = torch.randn(B, H, n_q, device=device)
    pad = -(-n_q // 4) * 4
    delta, rows = (torch.full((B, H, pad), -7.0, device=device) for _ in range(2))
    acc = torch.full((12345 + n_q,), float("nan"), device=device)
    fn, grid, args, consts, opts = triton_bwd.preprocess_call(
        out, dout, delta, 16, n_q, lse, False, (lse, rows, 0), zero=acc[:-7])
    mod = kernels.load(triton_bwd.MODULE, interpret=device == "cpu")
    launch_jit(getattr(mod, fn), grid, args, consts, opts, out.device)
    want = (out.double() * dout.double()).sum(-1)
    assert torch.allclose(delta[..., :n_q].double(), want, atol=1e-2)
    assert torch.equal(rows[..., :n_q], lse)
    assert (delta[..., n_q:] == -7).all() and (rows[..., n_q:] == -7).all()
    assert (acc[:-7] == 0).all() and acc[-7:].isnan().all()


def test_sm90_bwd_stores_dk_dv_by_tma_where_aligned():
    """dK and dV leave by TMA stores where both buffers take a descriptor (16-byte base
    and strides, contiguous head dim), from registers otherwise; the launch's arguments
    carry their descriptors, or the key and value ones in their place, unused."""
    q = torch.zeros(1, 4, 128, 64, dtype=torch.bfloat16)
    lse = torch.zeros(1, 4, 128)
    acc = torch.zeros(sm90_bwd.acc_shape(q, None, Sm90BwdConfig()))
    misaligned = torch.zeros(q.numel() + 8, dtype=q.dtype)[1:q.numel() + 1].view(q.shape)
    for dk, by_tma in ((torch.zeros_like(q), True), (misaligned, False)):
        _, _, args, consts, _ = sm90_bwd.calls(
            q, q, q, q, q, lse, lse, acc, dk, torch.zeros_like(q), mask=Mask.of(False),
            scale=0.125, cfg=Sm90BwdConfig())[sm90_bwd.KERNEL]
        assert consts["DKV_TMA"] is by_tma
        assert (args[7].base is dk) is by_tma and (args[1].base is q)


@pytest.mark.parametrize("shape,mask,bnhd", [
    ((2, 4, 2, 300, 700, 128), Mask.of(True), False),
    ((1, 8, 8, 513, 257, 64), Mask.of(False), True),      # rows not by TMA, strided views
    ((2, 4, 4, 256, 256, 128), Mask.of(True, (64, 0), "bottom_right", 30.0), False),
    ((1, 4, 2, 200, 300, 96), Mask.of(True), False),     # 64 + 32 columns
    ((1, 2, 2, 127, 129, 88), Mask.of(False), True),     # 64 + 32 (24 of them) columns
    ((1, 2, 1, 64, 64, 112), Mask.of(True), False),      # padded to 128 columns
])
def test_sm90_bwd_bound_launches_match_the_plain_ones(shape, mask, bnhd):
    """The bound backward (``sm90_bwd.bind``) plans each launch once and, per call, puts
    the call's tensors in their places and rebuilds each TMA descriptor over them: the
    same arguments, one by one, as :func:`sm90_bwd.calls` builds for those tensors (a
    descriptor: the same fields over the same tensor). The first call passes one tensor
    as q, k and v, the later one three."""
    from flashscope.families.sm90_fwd import _descriptor_class

    B, H, Hkv, Nq, Nk, D = shape
    cfg = Sm90BwdConfig()

    def tensors(shared):
        q, k, v = make_qkv("cpu", B, H, Nq, Nk, D, Hkv=Hkv, dtype=torch.bfloat16, bnhd=bnhd)
        if shared and Nq == Nk and H == Hkv:
            k = v = q
        return (torch.randn_like(q), q, k, v, torch.randn_like(q),
                torch.zeros(B, H, Nq))

    first = tuple(t.as_strided(t.shape, t.stride()) for t in tensors(True))
    plans = sm90_bwd._bound_plans(first, sm90_bwd._buffers(first[1], first[2], first[3], cfg),
                                  mask=mask, scale=0.1, cfg=cfg)
    later = (*tensors(False), *sm90_bwd._buffers(first[1], first[2], first[3], cfg))
    delta, lse_rows, acc, dq, dk, dv = later[6:]
    want = sm90_bwd.calls(*later[:6], delta, acc, dk, dv, mask=mask, scale=0.1, cfg=cfg,
                          lse_rows=lse_rows, dq=dq)
    assert list(plans) == list(want)
    for name, (fn, grid, args, fills, consts, opts) in plans.items():
        got = sm90_bwd._filled(args, fills, later)
        assert (fn, grid, consts, opts) == want[name][:2] + want[name][3:], name
        assert len(got) == len(want[name][2])
        for i, (a, b) in enumerate(zip(got, want[name][2])):
            if isinstance(b, torch.Tensor):
                assert a is b, (name, i)
            elif isinstance(b, _descriptor_class()):
                assert a.base is b.base and vars(a) == vars(b), (name, i)
            else:
                assert type(a) is type(b) and a == b, (name, i)
    assert sm90_bwd.bind(*later[:6], mask=mask, scale=0.1, cfg=cfg) is False  # CPU


def test_sm90_bwd_masks_keys_past_a_ragged_end():
    """Keys past Nk (zero-filled, score 0) are masked in the last key tile wherever Nk is
    not a multiple of the 128-key tile, and in every packed batch (a sequence's last tile
    holds the next one's keys); an aligned Nk builds without that loop."""
    from flashscope.variants import sm90_bwd_call

    for n_k, tail in ((700, True), (1024, False), (129, True), (4096, False)):
        _, consts = sm90_bwd_call(Sm90BwdConfig(), (1, 8, 8, 512, n_k), 128, "bfloat16",
                                  False)
        assert consts["KEY_TAIL"] is tail, n_k
    _, consts = sm90_bwd_call(Sm90BwdConfig(), (3, 8, 8, 256, 256), 128, "bfloat16", True,
                              varlen=True)
    assert consts["KEY_TAIL"] is True


@pytest.mark.parametrize("changes,pattern", [
    ({"BLOCK_N": 64}, "BLOCK_N"), ({"num_stages": 4}, "num_stages"),
    ({"DQ_SLOTS": 3}, "DQ_SLOTS"), ({"BLOCK_M": 128, "num_stages": 3}, "shared memory"),
])
def test_bad_sm90_bwd_configs_are_rejected(changes, pattern):
    with pytest.raises(ConfigError, match=pattern):
        sm90_bwd.check(Sm90BwdConfig().replace(**changes), "sm90", 128)


# --- the rule ------------------------------------------------------------------------------

def _problem(d=128, causal=False, n=4096, heads=64, group=1, **kw):
    return Problem("sm90", "bfloat16", d, causal, n, n, heads, group=group, **kw)


@pytest.mark.parametrize("problem,kernel", [
    (_problem(), "sm90-bwd"),                            # 4k, 64 heads: 2048 programs
    (_problem(n=1024, heads=256), "sm90-bwd"),           # 16 query tiles a program
    (_problem(n=2048, heads=16), "sm90-bwd"),            # 256 programs, 1.9 an SM
    (_problem(n=1024, heads=16), "triton-bwd"),          # 128 programs
    (_problem(n=1024, heads=256, causal=True), "sm90-bwd"),    # 8 causal tiles a program
    (_problem(n=512, heads=512, causal=True), "sm90-bwd"),     # 4
    (_problem(n=256, heads=512, causal=True), "triton-bwd"),   # 2
    (_problem(n=2048, heads=128, causal=True), "sm90-bwd"),
    (_problem(heads=64, group=4, causal=True), "sm90-bwd"),    # 512 programs, 3.9 an SM
    (_problem(heads=8, group=4, causal=True), "triton-bwd"),   # 64 programs
    (_problem(n=8192, heads=64, group=4, causal=True), "sm90-bwd"),
    (_problem(heads=32, group=16), "triton-bwd"),        # MQA: 64 programs
    (_problem(heads=0), "sm90-bwd"),                     # heads unknown (offline)
    (_problem(d=64), "sm90-bwd"),                        # 64 tiles a program
    (_problem(d=64, n=1024, heads=256), "sm90-bwd"),     # 16 at D = 64
    (_problem(d=64, n=512, heads=512), "sm90-bwd"),      # 8
    (_problem(d=64, n=384, heads=512), "triton-bwd"),    # 6
    (_problem(d=96), "sm90-bwd"),                        # padded to 128 columns
    (_problem(d=80), "sm90-bwd"),
    (_problem(d=48), "sm90-bwd"),                        # padded to 64
    (_problem(d=100), "triton-bwd"),                     # rows not 16-byte units
    (_problem(d=256), "sm90-bwd"),                       # 64-key programs, D split
    (_problem(d=256, n=128, heads=1024, causal=True), "sm90-bwd"),  # 1 tile
    (_problem(d=192), "sm90-bwd"),                       # padded to 256
    (_problem(d=168), "sm90-bwd"),
    (_problem(d=160), "triton-bwd"),                     # two passes: 128 and a tail
    (_problem(d=136), "triton-bwd"),
    (_problem(window=True), "sm90-bwd"),                 # bottom-right: 64 tiles
    (_problem(n=32768, heads=32, causal=True, window=True, band_keys=512), "sm90-bwd"),
    (_problem(n=32768, heads=32, causal=True, window=True, band_keys=256), "sm90-bwd"),  # 6
    (_problem(n=32768, heads=32, causal=True, window=True, band_keys=64), "triton-bwd"),  # 3
    (_problem(d=64, n=8192, heads=128, window=True, band_keys=512), "sm90-bwd"),     # 10
    (_problem(d=64, n=8192, heads=128, window=True, band_keys=256), "triton-bwd"),   # 6
    (_problem(d=64, n=8192, heads=128, window=True, band_keys=1024), "sm90-bwd"),    # 18
    (_problem(d=64, n=8192, heads=128, window=True, band_keys=2048), "sm90-bwd"),    # 34
    (_problem(softcap=True), "sm90-bwd"),
    (_problem(varlen=True), "sm90-bwd"),
    (_problem(varlen=True, window=True), "sm90-bwd"),    # bottom-right, packed
    (_problem(varlen=True, causal=True, window=True, band_keys=512), "sm90-bwd"),    # 10
    (_problem(d=64, varlen=True, causal=True, window=True, band_keys=512),
     "sm90-bwd"),                                                                  # 10
    (_problem(d=64, varlen=True, causal=True, window=True, band_keys=128),
     "triton-bwd"),                                                                # 4
    (_problem(varlen=True, causal=True, window=True, band_keys=256), "sm90-bwd"),    # 6
    (_problem(varlen=True, causal=True, n=256), "triton-bwd"),                      # 2
    (_problem(varlen=True, causal=True, window=True, band_keys=1024), "sm90-bwd"),   # 18
    (_problem(varlen=True, causal=True, window=True, band_keys=512, group=4,
              heads=128), "sm90-bwd"),                                            # 40
    (_problem(deterministic=True), "triton-bwd"),
    (Problem("sm80", "bfloat16", 128, False, 4096, 4096, 64), "triton-bwd"),
    (Problem("gfx942", "bfloat16", 128, False, 4096, 4096, 64), "triton-bwd"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_default_backward_rule(problem, kernel):
    cfg = default_backward(problem)
    assert cfg.KERNEL == kernel, sm90_bwd.prefers(problem)
    assert (sm90_bwd.prefers(problem) is None) == (kernel == "sm90-bwd")


def _meta(shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_backward_config_follows_the_deterministic_setting(monkeypatch):
    """On an sm_90 device the one pass runs long D = 128 rows; with PyTorch's
    deterministic algorithms on, on tensors without TMA descriptors, or off a GPU, the
    two passes do."""
    q, k, v = (_meta((4, 16, 4096, 128)) for _ in range(3))
    mask = Mask.of(False)
    api._BACKWARD.clear()
    assert api._backward_config(q, k, v, mask).KERNEL == "triton-bwd"  # no GPU target
    monkeypatch.setattr(api, "device_target", lambda device: "sm90")
    assert api._backward_config(q, k, v, mask).KERNEL == "sm90-bwd"
    strided = _meta((4, 16, 4096, 256))[..., ::2]
    assert api._backward_config(q, strided, v, mask).KERNEL == "triton-bwd"
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert api._backward_config(q, k, v, mask).KERNEL == "triton-bwd"
        bound = api._Bound(mask, 0.1, None, False)
        assert bound.backward_config(q, k, v).KERNEL == "triton-bwd"
        torch.use_deterministic_algorithms(False)
        assert bound.backward_config(q, k, v).KERNEL == "sm90-bwd"
    finally:
        torch.use_deterministic_algorithms(was)
        api._BACKWARD.clear()


def test_sm90_bwd_refuses_cpu_tensors():
    q, k, v = make_qkv("cpu", 1, 2, 16, 16, 64, dtype=torch.bfloat16)
    lse = torch.zeros(q.shape[:3])
    with pytest.raises(ConfigError, match="GPU only"):
        launch.backward(q, q, k, v, q, lse, mask=Mask.of(False), scale=0.125,
                        cfg=Sm90BwdConfig())


# --- on a GPU ------------------------------------------------------------------------------

# (B, H, Hkv, Nq, Nk, D, causal, dtype, bnhd): lengths off the tiles, Nq != Nk both ways,
# GQA and MQA, (B, N, H, D) strided views (and poisoned gradient buffers laid out so)
SM90_CASES = [
    (2, 4, 4, 300, 700, 128, False, torch.bfloat16, True),
    (2, 4, 2, 1000, 1000, 128, True, torch.bfloat16, False),
    (1, 8, 1, 513, 257, 128, True, torch.float16, True),
    (1, 8, 1, 257, 513, 128, False, torch.float16, False),
    (2, 4, 4, 1, 65, 64, False, torch.float16, False),
    (1, 4, 2, 700, 300, 64, True, torch.bfloat16, True),
    (1, 2, 2, 2048, 2048, 128, True, torch.bfloat16, False),
    (3, 6, 3, 129, 129, 64, True, torch.float16, True),
    # head dims between the built widths: 72-96 as 64 columns and a tail, others padded
    (2, 4, 2, 300, 700, 96, True, torch.bfloat16, True),
    (1, 4, 4, 257, 513, 80, False, torch.float16, False),
    (2, 4, 1, 200, 200, 48, True, torch.bfloat16, False),
    (1, 6, 3, 129, 333, 72, False, torch.bfloat16, True),
    (2, 4, 2, 333, 129, 88, True, torch.float16, False),
    (2, 3, 3, 127, 127, 88, False, torch.bfloat16, False),
    (1, 4, 1, 200, 300, 112, False, torch.bfloat16, True),
    # above 128: 64-key programs, the head dim split between the warpgroups, dQ by atomics
    (2, 4, 2, 300, 700, 256, True, torch.bfloat16, True),
    (1, 4, 4, 257, 513, 256, False, torch.float16, False),
    (2, 6, 1, 129, 129, 256, True, torch.float16, False),
    (1, 4, 2, 700, 300, 256, False, torch.bfloat16, True),
    (2, 4, 2, 333, 200, 192, True, torch.bfloat16, False),
    (1, 2, 2, 130, 300, 136, False, torch.float16, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,Hkv,Nq,Nk,D,causal,dtype,bnhd", SM90_CASES,
                         ids=[f"b{c[0]}-h{c[1]}-kv{c[2]}-q{c[3]}-k{c[4]}-d{c[5]}-"
                              f"{'causal' if c[6] else 'full'}-{str(c[7])[6:]}"
                              f"{'-bnhd' if c[8] else ''}" for c in SM90_CASES])
def test_sm90_bwd_grads_match_float64(device, B, H, Hkv, Nq, Nk, D, causal, dtype, bnhd):
    run_case(device, B=B, H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal, dtype=dtype,
             bnhd=bnhd, cfg=_sm90_default(D))


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,Hkv,Nq,Nk,D,causal,dtype,bnhd",
                         [c for c in SM90_CASES if c[5] == 64])
def test_sm90_bwd_64_row_tiles_at_d64_match_float64(device, B, H, Hkv, Nq, Nk, D, causal,
                                                   dtype, bnhd):
    """D = 64 on the 64-row query tiles a config may still ask for (the default takes 128)."""
    run_case(device, B=B, H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal, dtype=dtype,
             bnhd=bnhd, cfg=Sm90BwdConfig(BLOCK_M=64))


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_sm90_bwd_dq_by_atomics_matches_float64(device, causal, D):
    """DQ_SLOTS = 0 on the 128-key builds too: the consumer adds each dQ tile by 16-byte
    atomics, in the order the TMA reduction puts it, no reducer work."""
    run_case(device, B=2, H=4, Hkv=2, Nq=333, Nk=700, D=D, causal=causal,
             dtype=torch.bfloat16, bnhd=True, cfg=Sm90BwdConfig(DQ_SLOTS=0))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [300, 297])
def test_sm90_bwd_tail_rows_beside_a_head_of_very_negative_lse(device, causal, dtype, rows,
                                                                n):
    """Each head's last query tile runs past Nq = n (rows 300-319 of a 64-row tile,
    300-383 of a 128-row one, at n = 300), whose log-sum-exp and delta come by TMA (at
    297 from the copies whose heads start 300 rows apart), and its last key tile past
    Nk = n. Head 1's queries point away from every key (scores -400, L about
    -394): had head 0's tail rows read head 1's first rows, as a copy over the flattened
    vectors does, P = 2^(0 - L) would be inf on those zero rows (dK and dV NaN, causal);
    had head 1's rows scored the zero-filled keys past Nk unmasked, P = inf there (dQ NaN,
    non-causal). Both failed so before. Gradients within the float64 bound, every element
    written."""
    if launch.device_target(torch.device(device)) != "sm90":
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    q, k, v = make_qkv(device, 1, 2, n, n, 64, dtype=dtype)
    q[:, 1], k[:, 1] = -50.0, 1.0  # head 1: every score -50 * 64 / 8
    dout = torch.randn(q.shape, device=q.device).to(dtype)
    mask, scale = Mask.of(causal), 0.125
    out, lse = launch.forward(q, k, v, mask=mask, scale=scale, cfg=SMALL_FWD,
                              return_lse=True)
    assert lse[0, 1].max().item() < -300
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    got = launch.backward(dout, q, k, v, out, lse, mask=mask, scale=scale,
                          cfg=Sm90BwdConfig(BLOCK_M=rows), dq=dq, dk=dk, dv=dv)
    _, *ref = reference_grads(q, k, v, dout, is_causal=causal, scale=scale)
    check_grads(f"seed={seed} causal={causal} {dtype} rows={rows} n={n}", got, ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 96, 112])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_sm90_bwd_writes_grad_buffers_with_and_without_tma(device, offset, D):
    """dK and dV leave through TMA stores where their buffers take a descriptor (clipped
    at a ragged Nk = 300, the tail's at D = 96, and D = 112's padded columns), else from
    registers: here buffers starting one element past a 16-byte boundary, whose padded
    columns are masked (the poisoned tail past the buffer stays NaN). NaN-poisoned, fully written,
    within the float64 bound."""
    if launch.device_target(torch.device(device)) != "sm90":
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    dtype, scale = torch.bfloat16, 0.125
    q, k, v = make_qkv(device, 2, 4, 200, 300, D, Hkv=2, dtype=dtype)
    dout = torch.randn(q.shape, device=q.device).to(dtype)
    out, lse = launch.forward(q, k, v, mask=Mask.of(True), scale=scale, cfg=SMALL_FWD,
                              return_lse=True)

    flats = [torch.full((t.numel() + 128,), float("nan"), device=t.device, dtype=t.dtype)
             for t in (q, k, v)]
    dq, dk, dv = (f[offset:offset + t.numel()].view(t.shape) for f, t in zip(flats, (q, k, v)))
    from flashscope.families.sm90_fwd import _desc_problem
    assert (_desc_problem(dk) is None) == (offset == 0)
    got = launch.backward(dout, q, k, v, out, lse, mask=Mask.of(True), scale=scale,
                          cfg=_sm90_default(D), dq=dq, dk=dk, dv=dv)
    _, *ref = reference_grads(q, k, v, dout, is_causal=True, scale=scale)
    check_grads(f"seed={seed} offset={offset}", got, ref, dtype)
    for name, f, t in zip(("dq", "dk", "dv"), flats, (q, k, v)):
        assert f[offset + t.numel():].isnan().all(), f"{name} written past its buffer"


def _grads_float64(q, k, v, dout, causal, scale):
    """(dq, dk, dv) in float64 on the tensors' device (long rows: too slow on a CPU)."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = reference_attention(qd, kd, vd, is_causal=causal, scale=scale)
    out.backward(dout.double())
    return tuple(g.cpu() for g in (qd.grad, kd.grad, vd.grad))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_default_runs_sm90_bwd_on_long_rows(device, causal):
    """Through ``flashscope.attention``'s autograd: a shape the rule gives to sm90-bwd
    (an sm_90 device), with dO of stride 0 (from ``sum``, no TMA descriptor: copied)."""
    if launch.device_target(torch.device(device)) != "sm90":
        pytest.skip("needs an sm_90 GPU")
    fresh_seed()
    q, k, v = make_qkv(device, 4, 16, 2048, 2048, 128, dtype=torch.bfloat16)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    assert api._backward_config(q, k, v, Mask.of(causal)).KERNEL == "sm90-bwd"
    out = flashscope.attention(q, k, v, is_causal=causal)
    out.float().sum().backward()
    ones = torch.ones_like(out)
    ref = _grads_float64(q, k, v, ones, causal, 1 / math.sqrt(128))
    check_grads(f"causal={causal}", (q.grad, k.grad, v.grad), ref, torch.bfloat16)


@pytest.mark.gpu
def test_deterministic_setting_gives_identical_bits(device):
    """With ``torch.use_deterministic_algorithms(True)`` the backward the rule would give
    to the one pass runs the two passes, and two runs agree to the bit."""
    if launch.device_target(torch.device(device)) != "sm90":
        pytest.skip("needs an sm_90 GPU")
    fresh_seed()
    q, k, v = (t.detach().requires_grad_() for t in
               make_qkv(device, 2, 16, 2048, 2048, 128, dtype=torch.bfloat16))
    dout = torch.randn_like(q)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert api._backward_config(q, k, v, Mask.of(False)).KERNEL == "triton-bwd"
        runs = [torch.autograd.grad(flashscope.attention(q, k, v), (q, k, v), dout)
                for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(was)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert all(torch.isfinite(g).all() for g in runs[0])
