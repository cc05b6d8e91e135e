"""Config records: parsing, feasibility (honoured or rejected with the limit), selection."""

import pytest

from flashscope.config import (AttentionConfig, check_config, head_dim_pad, min_shared_bytes,
                               select_config)
from flashscope.errors import ConfigError
from flashscope.targets import ALL_TARGETS


def test_parse_overrides_defaults():
    cfg = AttentionConfig.parse("BLOCK_M=64, num_warps=8, Q_IN_REGS=false, maxnreg=128")
    assert cfg == AttentionConfig(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=3,
                                  Q_IN_REGS=False, maxnreg=128)
    assert cfg.key == "m64n64w8s3q0r128"


@pytest.mark.parametrize("text,msg", [
    ("BLOCK_Q=64", "unknown key"), ("BLOCK_M", "expected KEY=VALUE"),
    ("BLOCK_M=abc", "BLOCK_M expects an integer"), ("Q_IN_REGS=maybe", "true/false"),
])
def test_parse_errors(text, msg):
    with pytest.raises(ConfigError, match=msg):
        AttentionConfig.parse(text)


def test_shared_memory_limit_named():
    cfg = AttentionConfig(BLOCK_M=256, BLOCK_N=128, num_warps=8, num_stages=3)
    with pytest.raises(ConfigError, match=r"BLOCK_M=256, BLOCK_N=128, HEAD_DIM=256 with 3 "
                                          r"stages needs at least 256 KB .* 227 KB a sm90 block"):
        check_config(cfg, "sm90", head_dim=256)
    assert check_config(cfg, "sm90", head_dim=64) is cfg  # honoured unchanged


def test_vendor_knobs_checked():
    with pytest.raises(ConfigError, match="maxnreg=128 is an NVIDIA register cap"):
        check_config(AttentionConfig(maxnreg=128), "gfx942", 64)
    with pytest.raises(ConfigError, match="waves_per_eu=2 is an AMD option"):
        check_config(AttentionConfig(waves_per_eu=2), "sm90", 64)
    with pytest.raises(ConfigError, match="maxnreg=300"):
        check_config(AttentionConfig(maxnreg=300), "sm90", 64)
    with pytest.raises(ConfigError, match="num_warps=32: expected a power of two in 1..16"):
        check_config(AttentionConfig(num_warps=32), "gfx942", 64)


def test_head_dim_pad():
    assert [head_dim_pad(d) for d in (1, 16, 17, 80, 96, 128, 192, 256)] == \
        [16, 16, 32, 128, 128, 128, 256, 256]


def test_min_shared_bytes_is_kv_tiles():
    cfg = AttentionConfig(BLOCK_N=64, num_stages=3)
    assert min_shared_bytes(cfg, 128) == 2 * 64 * 128 * 2 * 2


@pytest.mark.parametrize("t", ALL_TARGETS, ids=lambda t: t.name)
@pytest.mark.parametrize("d", [16, 64, 80, 128, 192, 256])
def test_defaults_are_feasible_everywhere(t, d):
    cfg = select_config(d, "bfloat16", False, t.name)
    assert check_config(cfg, t.name, d) is cfg
