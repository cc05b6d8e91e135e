"""The Hopper variants (TMA descriptors, warp specialization): their config rules, the 2-D
views the launcher builds, and correctness against the float64 reference.

On CPU the interpreter runs the same kernel body with host descriptors; WARP_SPEC there
checks the single-loop structure (all masks on every tile) that the warp-specialized
build uses, not the specialization itself (the interpreter has no warps). A NaN planted in
another head's rows must not leak through a tile that runs past N_K.
"""

import math

import pytest
import torch

from flashscope import AttentionConfig, launch
from flashscope.config import check_config
from flashscope.errors import ConfigError
from flashscope.testing.inputs import fresh_seed, make_qkv
from flashscope.testing.reference import ERROR_BOUND, reference_attention, rel_error

TMA = AttentionConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2, TMA=True)
WS = TMA.replace(WARP_SPEC=True)


@pytest.mark.parametrize("cfg,target,D,match", [
    (TMA, "sm80", 64, "sm_90 or later"),
    (TMA, "gfx942", 64, "sm_90 or later"),
    (TMA, "sm90", 80, "power of two"),
    (AttentionConfig(WARP_SPEC=True), "sm90", 64, "needs TMA=1"),
    (WS.replace(num_warps=8), "sm90", 64, "num_warps=4"),
])
def test_config_rules(cfg, target, D, match):
    with pytest.raises(ConfigError, match=match):
        check_config(cfg, target, D)


def test_config_round_trip_and_key():
    cfg = AttentionConfig.parse("BLOCK_M=128,TMA=1,WARP_SPEC=true")
    assert cfg.TMA and cfg.WARP_SPEC and cfg.key.endswith("q1tws")
    assert AttentionConfig.from_dict(cfg.as_dict()) == cfg
    with pytest.raises(ConfigError, match="TMA expects true/false"):
        AttentionConfig.parse("TMA=maybe")
    assert check_config(WS, "sm90", 128) is WS and check_config(TMA, "sm100", 64) is TMA


def test_views():
    x = torch.empty(2, 3, 10, 64, dtype=torch.float16)  # heads-major
    assert launch.tma_view(x, "q") == (60, 64, 30, 10, 0)
    y = torch.empty(2, 10, 3, 64, dtype=torch.float16).transpose(1, 2)  # sequence-major
    assert launch.tma_view(y, "q") == (20, 192, 10, 0, 64)
    qkv = torch.empty(2, 10, 3, 4, 64, dtype=torch.float16)  # fused QKV, one slice
    assert launch.tma_view(qkv[:, :, 1].transpose(1, 2), "k") == (20, 3 * 64 + 64, 10, 0, 64)
    for bad, why in ((x.transpose(2, 3), "stride"), (x[..., 1:33], "aligned"),
                     (x[:, :, :5], "neither")):
        with pytest.raises(ConfigError, match=why):
            launch.tma_view(bad, "query")
    assert launch.tma_view(x[:, :, ::2], "q") == (30, 64, 15, 5, 0)  # every other row
    assert not launch.tma_ok(x, x[..., 1:33]) and launch.tma_ok(x, y)


def _check(device, cfg, *, B, H, Hkv, Nq, Nk, D, causal, bnhd):
    fresh_seed()
    q, k, v = make_qkv(device, B, H, Nq, Nk, D, Hkv=Hkv, dtype=torch.float16, bnhd=bnhd)
    out = torch.full_like(q, float("nan"))
    out, lse = launch.forward(q, k, v, causal=causal, scale=1 / math.sqrt(D), cfg=cfg,
                              return_lse=True, out=out)
    ref = reference_attention(q, k, v, is_causal=causal)
    tag = f"{cfg.key} B={B} H={H}/{Hkv} Nq={Nq} Nk={Nk} D={D} causal={causal} bnhd={bnhd}"
    assert not torch.isnan(out).any(), f"unwritten or NaN output ({tag})"
    err = rel_error(out, ref)
    assert err <= ERROR_BOUND[torch.float16], f"relative error {err:.2e} ({tag})"


@pytest.mark.parametrize("ws", [False, True], ids=["tma", "tma-ws"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,bnhd,Hkv", [(77, 101, False, 2), (130, 70, True, 4),
                                            (64, 128, False, 1), (1, 33, True, 2)])
def test_matches_float64_reference(device, ws, causal, Nq, Nk, bnhd, Hkv):
    _check(device, WS if ws else TMA, B=2, H=4, Hkv=Hkv, Nq=Nq, Nk=Nk, D=64, causal=causal,
           bnhd=bnhd)


@pytest.mark.parametrize("ws", [False, True], ids=["tma", "tma-ws"])
def test_rows_past_nk_do_not_leak(device, ws):
    """Heads-major K/V of 2 heads, N_K = 40 (not a tile multiple): head 0's last tile
    reads rows 40..63, which are head 1's. Head 1's values hold a NaN and an inf in those
    rows; head 0's output must still be finite and right."""
    fresh_seed()
    q, k, v = make_qkv(device, 1, 2, 32, 40, 32, dtype=torch.float16)
    v[0, 1, 3, 5], v[0, 1, 7, 0] = float("nan"), float("inf")
    out = torch.full_like(q, float("nan"))
    launch.forward(q, k, v, causal=False, scale=1 / math.sqrt(32),
                   cfg=(WS if ws else TMA), return_lse=False, out=out)
    ref = reference_attention(q, k, v)
    assert torch.isfinite(out[0, 0]).all(), "another head's NaN/inf leaked into head 0"
    assert rel_error(out[0, 0], ref[0, 0]) <= ERROR_BOUND[torch.float16]


def test_explicit_tma_on_unviewable_input_is_an_error(device):
    q, k, v = make_qkv(device, 1, 2, 16, 16, 64, dtype=torch.float16)
    with pytest.raises(ConfigError, match="key: TMA=1 cannot read"):
        launch.forward(q, k.transpose(2, 3).contiguous().transpose(2, 3), v,
                       causal=False, scale=0.125, cfg=TMA, return_lse=False)
