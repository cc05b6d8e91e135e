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
