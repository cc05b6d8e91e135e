"""OVERLAP: the next tile's Q K^T issued before this tile's softmax.

The loop carries one score tile and prefetches the next; the last prefetch re-reads the
last tile in bounds. Shapes cover loops of zero tiles (causal rows before the first whole
key tile), one tile, a partial last tile and GQA, against the float64 reference.
"""

import pytest
import torch

from flashscope import AttentionConfig
from flashscope.config import check_config
from flashscope.errors import ConfigError

from .test_forward import run_case


def test_config_rules_and_key():
    cfg = AttentionConfig.parse("BLOCK_M=128,OVERLAP=1")
    assert cfg.OVERLAP and cfg.key.endswith("q1o")
    assert AttentionConfig.from_dict(cfg.as_dict()) == cfg
    assert check_config(cfg, "gfx942", 64) is cfg
    ws = AttentionConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, TMA=True,
                         WARP_SPEC=True, OVERLAP=True)
    with pytest.raises(ConfigError, match="cannot take OVERLAP"):
        check_config(ws, "sm90", 128)


@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,Hkv,D", [(77, 101, 2, 64), (130, 70, 4, 64), (1, 33, 1, 64),
                                         (32, 32, 2, 64), (40, 200, 1, 80)])
def test_matches_float64_reference(device, tma, causal, Nq, Nk, Hkv, D):
    if tma and D != 64:
        pytest.skip("TMA needs a power-of-two head dim")
    cfg = AttentionConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2, TMA=tma,
                          OVERLAP=True)
    run_case(device, B=2, H=4, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal,
             dtype=torch.float16, bnhd=tma and Nq % 2 == 1, cfg=cfg, with_lse=True)
