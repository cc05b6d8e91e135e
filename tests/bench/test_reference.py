"""The float64 reference and the error metric: agreement with SDPA's math path, GQA and the
causal mask, NaN handling, and that the per-dtype bounds catch small real bugs."""

import math

import pytest
import torch

from flashscope.errors import FlashscopeError
from flashscope.testing.reference import ERROR_BOUND, reference_attention, rel_error


def _qkv(B, H, Nq, Nk, D, Hkv=None, dtype=torch.float64):
    g = torch.Generator().manual_seed(1234)
    Hkv = Hkv or H
    return (torch.randn(B, H, Nq, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv, Nk, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv, Nk, D, generator=g, dtype=dtype))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk", [(1, 1), (17, 33), (33, 17), (127, 127)])
def test_matches_sdpa_math(causal, Nq, Nk):
    q, k, v = _qkv(2, 4, Nq, Nk, 24, Hkv=2)
    ref = reference_attention(q, k, v, is_causal=causal, scale=0.3)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, scale=0.3, enable_gqa=True)
    assert ref.dtype == torch.float64
    assert rel_error(sdpa, ref) < 1e-12


def test_chunked_rows_equal_unchunked(monkeypatch):
    from flashscope.testing import reference
    q, k, v = _qkv(1, 2, 70, 50, 16)
    whole = reference_attention(q, k, v, is_causal=True)
    monkeypatch.setattr(reference, "_CHUNK_BYTES", 1)  # one query row per chunk
    assert rel_error(reference_attention(q, k, v, is_causal=True), whole) < 1e-14


def test_nan_and_inf_never_pass():
    ref = torch.ones(2, 3)
    out = ref.clone()
    out[1, 2] = float("nan")
    assert rel_error(out, ref) == math.inf
    out[1, 2] = float("inf")
    assert rel_error(out, ref) == math.inf
    assert rel_error(ref.half(), ref) == 0.0


def test_shape_mismatch_is_an_error():
    with pytest.raises(FlashscopeError, match="out: expected shape"):
        rel_error(torch.zeros(2, 3), torch.zeros(3, 2))
    q, k, v = _qkv(1, 3, 4, 4, 8, Hkv=2)
    with pytest.raises(FlashscopeError, match="kv heads must divide"):
        reference_attention(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bounds_pass_rounding_and_fail_small_bugs(dtype):
    q, k, v = (t.to(dtype) for t in _qkv(1, 4, 257, 257, 64, dtype=torch.float32))
    ref = reference_attention(q, k, v, is_causal=False)
    # Honest low precision: fp32 maths, output rounded to the dtype.
    assert rel_error(reference_attention(q, k, v, compute_dtype=torch.float32).to(dtype),
                     ref) <= ERROR_BOUND[dtype] / 4
    # Bug: the last key of every row dropped (an off-by-one in the final tile).
    dropped = reference_attention(q, k[:, :, :-1], v[:, :, :-1]).to(dtype)
    assert rel_error(dropped, ref) > ERROR_BOUND[dtype]
    # Bug: causal mask off by one (query i also sees key i + 1).
    causal = reference_attention(q, k, v, is_causal=True)
    mask = torch.ones(257, 257, dtype=torch.bool).tril(1)
    shifted = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mask).to(dtype)
    assert rel_error(shifted, causal) > 10 * ERROR_BOUND[dtype]


@pytest.mark.parametrize("causal", [False, True])
def test_grads_match_autograd(causal):
    from flashscope.testing.reference import reference_attention_grads
    q, k, v = (t.requires_grad_() for t in _qkv(2, 4, 37, 29, 16, Hkv=2))
    dout = torch.randn_like(q)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                           enable_gqa=True)
    want = torch.autograd.grad(out, (q, k, v), dout)
    got = reference_attention_grads(q.detach(), k.detach(), v.detach(), dout,
                                    is_causal=causal)
    assert rel_error(got[0], out.detach()) < 1e-12
    for g, w in zip(got[1:], want):
        assert rel_error(g, w) < 1e-12
