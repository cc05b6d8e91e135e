"""Sliding windows, bottom-right alignment and softcapping, forward and backward, against the float64
reference (which writes the masks from their definition): one-sided and two-sided windows,
windows wider than the sequence, zero-width windows, Nq != Nk both ways (rows that see no
key return zeros and a log-sum-exp of -inf), GQA, fp16 and bf16. Small tiles, so the
band's left and right edges, the unmasked middle and the partial last tile all occur."""

import pytest
import torch

import flashscope
from flashscope import TritonBwdConfig, TritonFwdConfig
from flashscope.testing.inputs import fresh_seed, make_qkv
from flashscope.testing.reference import (ERROR_BOUND, reference_attention_grads, rel_error)

from .test_forward import run_case

CFG = TritonFwdConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
BWD = TritonBwdConfig(BLOCK_M1=16, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=16, num_stages=1)

WINDOWS = [None, (5, 3), (0, 0), (40, None), (None, 7), (500, 500), (3, -1)]
CASES = [(causal, w, align, nq, nk)
         for causal in (False, True) for w in WINDOWS for align in ("top_left", "bottom_right")
         for nq, nk in ((37, 37), (20, 61), (61, 20))
         if not (w is None and not causal and align == "bottom_right")]


@pytest.mark.parametrize("causal,window,align,Nq,Nk", CASES)
def test_forward_matches_float64(device, causal, window, align, Nq, Nk):
    i = CASES.index((causal, window, align, Nq, Nk))
    run_case(device, B=1, H=2, Hkv=1 if i % 2 else 2, Nq=Nq, Nk=Nk, D=24 if i % 3 else 32,
             causal=causal, dtype=torch.bfloat16 if i % 5 == 0 else torch.float16,
             bnhd=bool(i % 2), cfg=CFG, with_lse=True, window=window, align=align)


@pytest.mark.parametrize("causal,window,align,Nq,Nk", CASES[::3])
def test_backward_matches_float64(device, causal, window, align, Nq, Nk):
    from flashscope import launch
    from flashscope.masks import Mask

    fresh_seed()
    q, k, v = make_qkv(device, 1, 4, Nq, Nk, 32, Hkv=2, dtype=torch.float16)
    dout = torch.randn_like(q)
    mask = Mask.of(causal, window, align)
    out, lse = launch.forward(q, k, v, mask=mask, scale=32 ** -0.5, cfg=CFG, return_lse=True)
    poisoned = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    dq, dk, dv = launch.backward(dout, q, k, v, out, lse, mask=mask, scale=32 ** -0.5,
                                 cfg=BWD, dq=poisoned[0], dk=poisoned[1], dv=poisoned[2])
    _, rdq, rdk, rdv = reference_attention_grads(q, k, v, dout, is_causal=causal,
                                                 window=window, align=align)
    for name, got, ref in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        assert not torch.isnan(got).any(), name
        if ref.abs().max() == 0:  # e.g. dq of a one-key window: exactly zero
            assert got.double().abs().max() < 1e-3, name
        else:
            assert rel_error(got, ref) <= 4 * ERROR_BOUND[torch.float16], name


def test_public_api_takes_window_and_align(device):
    fresh_seed()
    q, k, v = make_qkv(device, 1, 2, 33, 50, 32, dtype=torch.float16)
    out = flashscope.attention(q, k, v, is_causal=True, window=(8, None),
                               align="bottom_right")
    ref = reference_attention_grads(q, k, v, torch.zeros_like(q), is_causal=True,
                                    window=(8, None), align="bottom_right")[0]
    assert rel_error(out, ref) <= ERROR_BOUND[torch.float16]


@pytest.mark.parametrize("kw,msg", [
    ({"window": (1.5, 2)}, "window left"), ({"window": "wide"}, "window"),
    ({"align": "middle"}, "align"), ({"is_causal": "no"}, "is_causal"),
    ({"attn_mask": torch.ones(2, 2)}, "attn_mask"), ({"dropout_p": 0.1}, "dropout_p"),
    ({"enable_gqa": 1}, "enable_gqa"),
])
def test_bad_mask_arguments_are_refused_by_name(device, kw, msg):
    q, k, v = make_qkv(device, 1, 1, 8, 8, 16, dtype=torch.float16)
    with pytest.raises((TypeError, ValueError), match=msg):
        flashscope.attention(q, k, v, **kw)


def test_sdpa_signature_by_position(device):
    q, k, v = make_qkv(device, 1, 1, 8, 8, 16, dtype=torch.float16)
    a = flashscope.attention(q, k, v, None, 0.0, True)
    b = torch.nn.functional.scaled_dot_product_attention(q.float().cpu(), k.float().cpu(),
                                                         v.float().cpu(), None, 0.0, True)
    assert rel_error(a, b) <= ERROR_BOUND[torch.float16]


@pytest.mark.parametrize("causal,window,align", [(False, None, "top_left"),
                                                 (True, (9, 0), "bottom_right"),
                                                 (True, None, "top_left")])
@pytest.mark.parametrize("cap", [2.0, 30.0])
def test_softcap_forward_and_backward(device, causal, window, align, cap):
    """c tanh(s / c) with scores large enough that the cap bites (inputs x4: |s| up to
    ~25): c = 2 changes every row, c = 30 few; forward, log-sum-exp and gradients."""
    from flashscope import launch
    from flashscope.masks import Mask

    fresh_seed()
    q, k, v = make_qkv(device, 1, 4, 45, 70, 32, Hkv=2, dtype=torch.float16,
                       scale_inputs=4.0)
    run_case(device, B=1, H=4, Hkv=2, Nq=45, Nk=70, D=32, causal=causal,
             dtype=torch.float16, bnhd=False, cfg=CFG, with_lse=True, window=window,
             align=align, softcap=cap)
    mask = Mask.of(causal, window, align, cap)
    dout = torch.randn_like(q)
    out, lse = launch.forward(q, k, v, mask=mask, scale=32 ** -0.5, cfg=CFG, return_lse=True)
    dq, dk, dv = launch.backward(dout, q, k, v, out, lse, mask=mask, scale=32 ** -0.5, cfg=BWD)
    ref = reference_attention_grads(q, k, v, dout, is_causal=causal, window=window,
                                    align=align, softcap=cap)
    plain = reference_attention_grads(q, k, v, dout, is_causal=causal, window=window,
                                      align=align)
    for name, got, r, p in zip(("dq", "dk", "dv"), (dq, dk, dv), ref[1:], plain[1:]):
        assert rel_error(got, r) <= 4 * ERROR_BOUND[torch.float16], name
    assert rel_error(ref[1], plain[1]) > 0.05, "the cap must change the gradient"


@pytest.mark.parametrize("cap", [0.0, -1.0, float("nan"), float("inf"), "5", True])
def test_bad_softcap_is_refused(device, cap):
    q, k, v = make_qkv(device, 1, 1, 8, 8, 16, dtype=torch.float16)
    with pytest.raises((TypeError, ValueError), match="softcap"):
        flashscope.attention(q, k, v, softcap=cap)


# (causal, window, align, Nq, Nk, Hkv, D): the band's edges off the 64-row query and
# 128-row key tiles, both alignments with Nq != Nk both ways (rows that see no key), a
# zero-width window, one wider than the rows, GQA and MQA
SM90_BANDS = [
    (False, (70, 30), "top_left", 300, 300, 2, 128),
    (True, (200, None), "top_left", 700, 700, 4, 128),
    (True, None, "bottom_right", 200, 700, 1, 128),
    (True, (100, None), "bottom_right", 700, 200, 2, 64),
    (False, (0, 0), "top_left", 257, 257, 4, 64),
    (False, (None, 100), "bottom_right", 300, 513, 2, 128),
    (False, (5000, 5000), "top_left", 513, 300, 4, 64),
    (True, (3, -1), "top_left", 129, 129, 1, 128),
    (True, (100, None), "top_left", 300, 300, 2, 96),
    (False, (70, 30), "bottom_right", 257, 513, 2, 48),
    (True, (100, None), "top_left", 300, 500, 2, 256),
    (False, (70, 30), "bottom_right", 257, 513, 4, 256),
]


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window,align,Nq,Nk,Hkv,D", SM90_BANDS)
def test_sm90_bwd_band_matches_float64(device, causal, window, align, Nq, Nk, Hkv, D):
    """The Hopper backward under windows and bottom-right alignment (its masked edge
    loops and the band's whole tiles), NaN-poisoned gradients written in full."""
    from flashscope import launch
    from flashscope.families import Problem, sm90_bwd
    from flashscope.masks import Mask

    if launch.device_target(torch.device(device)) != "sm90":
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    q, k, v = make_qkv(device, 2, 4, Nq, Nk, D, Hkv=Hkv, dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    mask = Mask.of(causal, window, align)
    scale = D ** -0.5
    out, lse = launch.forward(q, k, v, mask=mask, scale=scale, cfg=CFG, return_lse=True)
    poisoned = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    cfg = sm90_bwd.select(Problem("sm90", "bfloat16", D, window=True))
    dq, dk, dv = launch.backward(dout, q, k, v, out, lse, mask=mask, scale=scale,
                                 cfg=cfg, dq=poisoned[0], dk=poisoned[1], dv=poisoned[2])
    _, rdq, rdk, rdv = reference_attention_grads(q, k, v, dout, is_causal=causal,
                                                 window=window, align=align, scale=scale)
    for name, got, ref in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        assert not torch.isnan(got).any(), f"{name} (seed {seed})"
        if ref.abs().max() == 0:
            assert got.double().abs().max() < 1e-3, f"{name} (seed {seed})"
        else:
            assert rel_error(got, ref) <= 2 * ERROR_BOUND[torch.bfloat16], f"{name} (seed {seed})"


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window,Nq,Nk,Hkv,D", [
    (True, None, 300, 300, 2, 128), (False, (70, 30), 257, 513, 4, 64),
    (False, None, 129, 700, 1, 128), (True, (100, None), 300, 300, 2, 256)])
def test_sm90_bwd_softcap_matches_float64(device, causal, window, Nq, Nk, Hkv, D):
    """The Hopper backward's SOFTCAP switch: scores c tanh(s / c), inputs large enough that
    the cap changes the gradients, NaN-poisoned gradients written in full."""
    from flashscope import launch
    from flashscope.families import Problem, sm90_bwd
    from flashscope.masks import Mask

    if launch.device_target(torch.device(device)) != "sm90":
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    q, k, v = make_qkv(device, 2, 4, Nq, Nk, D, Hkv=Hkv, dtype=torch.bfloat16,
                       scale_inputs=3.0)
    dout = torch.randn_like(q)
    cap, scale = 2.0, D ** -0.5
    mask = Mask.of(causal, window, "top_left", cap)
    out, lse = launch.forward(q, k, v, mask=mask, scale=scale, cfg=CFG, return_lse=True)
    poisoned = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    cfg = sm90_bwd.select(Problem("sm90", "bfloat16", D, window=bool(window), softcap=True))
    grads = launch.backward(dout, q, k, v, out, lse, mask=mask, scale=scale,
                            cfg=cfg, dq=poisoned[0], dk=poisoned[1], dv=poisoned[2])
    ref = reference_attention_grads(q, k, v, dout, is_causal=causal, window=window,
                                    softcap=cap, scale=scale)
    plain = reference_attention_grads(q, k, v, dout, is_causal=causal, window=window,
                                      scale=scale)
    assert rel_error(ref[1], plain[1]) > 0.05, "the cap must change the gradient"
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[1:]):
        assert not torch.isnan(got).any(), f"{name} (seed {seed})"
        assert rel_error(got, want) <= 2 * ERROR_BOUND[torch.bfloat16], f"{name} (seed {seed})"


@pytest.mark.gpu
@pytest.mark.parametrize("window,align", [((512, 0), "top_left"), (None, "bottom_right")])
def test_default_band_backward_takes_the_one_pass(device, window, align):
    """Through ``attention``'s autograd on an sm_90 device: a causal band the rule gives
    to sm90-bwd (10 and 16 query tiles a key tile, 256 programs), against float64."""
    from flashscope import api, launch
    from flashscope.masks import Mask

    if launch.device_target(torch.device(device)) != "sm90":
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    Nq, Nk = (2048, 2048) if align == "top_left" else (2048, 4096)
    q, k, v = make_qkv(device, 2, 16, Nq, Nk, 128, Hkv=8, dtype=torch.bfloat16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = Mask.of(True, window, align)
    assert api._backward_config(q, k, v, mask).KERNEL == "sm90-bwd"
    out = flashscope.attention(q, k, v, is_causal=True, window=window, align=align,
                               enable_gqa=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference_attention_grads(q.detach(), k.detach(), v.detach(), dout, is_causal=True,
                                    window=window, align=align, scale=128 ** -0.5)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[1:]):
        assert not torch.isnan(got).any(), f"{name} (seed {seed})"
        assert rel_error(got, want) <= 2 * ERROR_BOUND[torch.bfloat16], f"{name} (seed {seed})"
