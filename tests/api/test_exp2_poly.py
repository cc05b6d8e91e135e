"""EXP2_POLY: part of the softmax exponentials from a polynomial on the FMA pipe.

The polynomial itself (accuracy over the whole range, -inf, the clamp), the column split
that decides which scores take it (every score must come back in its own place), the
config rules, and attention against the float64 reference with the switch on.
"""

import math

import pytest
import torch
import triton
import triton.language as tl

from flashscope import AttentionConfig, launch
from flashscope.config import check_config
from flashscope.errors import ConfigError
from flashscope.kernels import load
from flashscope.testing.inputs import fresh_seed, make_qkv
from flashscope.testing.reference import ERROR_BOUND, reference_attention, rel_error


softmax_exp2 = load("attention_fwd", interpret=True)._softmax_exp2


@triton.jit
def _exp2_kernel(X, Y, M: tl.constexpr, N: tl.constexpr, POLY: tl.constexpr):
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    tl.store(Y + offs, softmax_exp2(tl.load(X + offs), M, N, POLY))


def _exp2_tile(x, poly):
    """The kernel's _softmax_exp2 on one (M, N) fp32 tile, in the interpreter."""
    y = torch.full_like(x, float("nan"))
    _exp2_kernel[(1,)](x, y, x.shape[0], x.shape[1], poly)
    return y


@pytest.mark.interpreter
@pytest.mark.parametrize("poly", [2, 4])
def test_every_score_keeps_its_place_and_accuracy(poly):
    """Distinct values per column: a split or join that put a score back in another
    column would show as a large error, an unwritten one as NaN."""
    M, N = 16, 32
    x = -torch.rand(M, N, dtype=torch.float64) * 40  # softmax arguments are <= 0
    x[3, 5] = 0.0
    y = _exp2_tile(x.float(), poly).double()
    want = torch.exp2(x.float().double())
    assert not torch.isnan(y).any()
    rel = ((y - want).abs() / want).max().item()
    assert rel < 1e-4, f"EXP2_POLY={poly}: relative error {rel:.2e}"
    # the polynomial columns are the ones the docstring names (not all on MUFU)
    col_err = ((y - want).abs() / want).amax(0)  # MUFU/numpy: ~1e-7; polynomial: ~1e-5
    poly_cols = (col_err > 1e-6).nonzero().flatten().tolist()
    want_cols = [c for c in range(N) if c % 2 == 1 and (poly == 2 or c >= N // 2)]
    assert poly_cols == want_cols


@pytest.mark.interpreter
def test_polynomial_range_clamp_and_minus_infinity():
    M, N = 16, 64
    x = torch.linspace(-140.0, 0.0, M * N, dtype=torch.float32).reshape(M, N)
    x[0, 1], x[1, 3] = float("-inf"), -1e30
    y = _exp2_tile(x, 2)
    odd = y[:, 1::2].double()
    xo = x[:, 1::2].double()
    assert not torch.isnan(odd).any() and (odd >= 0).all()
    normal = xo >= -125
    rel = ((odd[normal] - torch.exp2(xo[normal])).abs() / torch.exp2(xo[normal])).max()
    assert rel < 1e-4
    # below the clamp (and at -inf) the weight is 2^-125 at most: nothing a dtype keeps
    assert (odd[~normal] <= 2.0 ** -124).all() and odd[0, 0] <= 2.0 ** -124


@pytest.mark.parametrize("cfg,match", [
    (AttentionConfig(EXP2_POLY=3), "expected 0"),
    (AttentionConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, TMA=True,
                     WARP_SPEC=True, EXP2_POLY=2), "cannot take EXP2_POLY"),
])
def test_config_rules(cfg, match):
    with pytest.raises(ConfigError, match=match):
        check_config(cfg, "sm90", 64)


def test_key_and_round_trip():
    cfg = AttentionConfig.parse("BLOCK_M=64,EXP2_POLY=4")
    assert cfg.key.endswith("e4") and AttentionConfig.from_dict(cfg.as_dict()) == cfg
    assert check_config(cfg, "gfx942", 128) is cfg  # portable Triton: any target


@pytest.mark.parametrize("poly", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,Hkv,D", [(77, 101, 2, 64), (130, 70, 4, 80), (1, 33, 1, 64)])
def test_matches_float64_reference(device, poly, causal, Nq, Nk, Hkv, D):
    fresh_seed()
    cfg = AttentionConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2, EXP2_POLY=poly)
    q, k, v = make_qkv(device, 2, 4, Nq, Nk, D, Hkv=Hkv, dtype=torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    out, lse = launch.forward(q, k, v, causal=causal, scale=1 / math.sqrt(D), cfg=cfg,
                              return_lse=True, out=out)
    ref = reference_attention(q, k, v, is_causal=causal)
    assert not torch.isnan(out).any()
    err = rel_error(out, ref)
    assert err <= ERROR_BOUND[torch.bfloat16], f"relative error {err:.2e}"
