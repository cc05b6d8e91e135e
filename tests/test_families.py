"""Kernel families: config records (parsing, labels, diffs), the rules tables (honoured or
rejected with the limit), and default selection as a pure function of the problem."""

import dataclasses

import pytest

from flashscope.errors import ConfigError
from flashscope.families import (FAMILIES, FORWARD, Problem, config_from_text, default_config,
                                 family, forward_family, sm90_fwd, triton_bwd, triton_fwd)
from flashscope.families.base import head_dim_pad
from flashscope.families.sm90_fwd import Sm90FwdConfig
from flashscope.families.triton_bwd import TritonBwdConfig
from flashscope.families.triton_fwd import TritonFwdConfig, min_shared_bytes
from flashscope.targets import ALL_TARGETS


def test_parse_overrides_defaults():
    cfg = TritonFwdConfig.parse("BLOCK_M=64, num_warps=8, Q_IN_REGS=false, maxnreg=128")
    assert cfg == TritonFwdConfig(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=3,
                                  Q_IN_REGS=False, maxnreg=128)
    assert cfg.label == "triton-fwd 64x64 w8 s3 q-reload maxnreg=128"
    assert cfg.diff() == {"BLOCK_M": 64, "num_warps": 8, "Q_IN_REGS": False, "maxnreg": 128}


@pytest.mark.parametrize("text,msg", [
    ("BLOCK_Q=64", "unknown key"), ("BLOCK_M", "expected KEY=VALUE"),
    ("BLOCK_M=abc", "BLOCK_M expects an integer"), ("Q_IN_REGS=maybe", "true/false"),
    ("BLOCK_M=1e400", "BLOCK_M expects an integer"), ("BLOCK_M=nan", "expects an integer"),
    ("BLOCK_M=64.5", "expects an integer"), ("BLOCK_M=64,BLOCK_M=32", "given twice"),
    ("num_stages=99999999999", "expects an integer"), ("num_warps=none", "needs an integer"),
])
def test_parse_errors(text, msg):
    with pytest.raises(ConfigError, match=msg):
        TritonFwdConfig.parse(text)


def test_parse_list_checks_every_text():
    assert TritonFwdConfig.parse_list(" BLOCK_M=64; ;num_warps=8 ") == ["BLOCK_M=64",
                                                                      "num_warps=8"]
    assert TritonFwdConfig.parse_list("") == [] and TritonFwdConfig.parse_list(None) == []
    with pytest.raises(ConfigError, match="'BLOCK_Q=1': triton-fwd config: unknown key"):
        TritonFwdConfig.parse_list("BLOCK_M=64;BLOCK_Q=1")


def test_records_refuse_wrong_types_by_name():
    with pytest.raises(ConfigError, match="PINGPONG expects true/false"):
        Sm90FwdConfig.from_dict({"PINGPONG": "sometimes"})
    with pytest.raises(ConfigError, match="BLOCK_M expects an integer"):
        Sm90FwdConfig.from_dict({"BLOCK_M": True})
    with pytest.raises(ConfigError, match="expected an object"):
        Sm90FwdConfig.from_dict([1, 2])
    assert Sm90FwdConfig.from_dict({"BLOCK_M": 192.0, "PINGPONG": 1}).BLOCK_M == 192


def test_labels_keys_and_diffs_round_trip():
    cfg = Sm90FwdConfig(BLOCK_M=192, num_stages=3, Q_IN_REGS=False, PINGPONG=True)
    assert cfg.label.startswith("sm90-fwd 192x128 s3 pingpong")
    assert Sm90FwdConfig.from_dict(cfg.diff()) == cfg
    assert Sm90FwdConfig.parse(cfg.text) == cfg
    assert len({cfg.key, cfg.replace(PINGPONG=False).key}) == 2
    assert len(cfg.key) == 12 and cfg.key == Sm90FwdConfig(**cfg.as_dict()).key


def test_shared_memory_limit_named():
    cfg = TritonFwdConfig(BLOCK_M=256, BLOCK_N=128, num_warps=8, num_stages=3)
    with pytest.raises(ConfigError, match=r"BLOCK_M=256, BLOCK_N=128, head dim 256 with 3 "
                                          r"stages needs at least 256 KB .* 227 KB a sm90 block"):
        triton_fwd.check(cfg, "sm90", head_dim=256)
    assert triton_fwd.check(cfg, "sm90", head_dim=64) is cfg  # honoured unchanged


def test_vendor_knobs_checked():
    with pytest.raises(ConfigError, match="maxnreg=128 is an NVIDIA register cap"):
        triton_fwd.check(TritonFwdConfig(maxnreg=128), "gfx942", 64)
    with pytest.raises(ConfigError, match="waves_per_eu=2 is an AMD option"):
        triton_fwd.check(TritonFwdConfig(waves_per_eu=2), "sm90", 64)
    with pytest.raises(ConfigError, match="maxnreg=300"):
        triton_fwd.check(TritonFwdConfig(maxnreg=300), "sm90", 64)
    with pytest.raises(ConfigError, match="num_warps=32: expected a power of two in 1..16"):
        triton_fwd.check(TritonFwdConfig(num_warps=32), "gfx942", 64)


@pytest.mark.parametrize("cfg,target,d,msg", [
    (Sm90FwdConfig(), "sm80", 128, "is not sm_90"),
    (Sm90FwdConfig(), "sm90", 32, "head dims 33..256"),
    (Sm90FwdConfig(BLOCK_M=96), "sm90", 128, "BLOCK_M=96: expected 64 or 128 or 192"),
    (Sm90FwdConfig(BLOCK_M=64, PINGPONG=True), "sm90", 128, "PINGPONG=1 needs two or three"),
    (Sm90FwdConfig(num_stages=5), "sm90", 128, "num_stages=5"),
    (Sm90FwdConfig(BLOCK_M=192, num_stages=4), "sm90", 128, "shared memory"),
])
def test_sm90_rules_name_the_limit(cfg, target, d, msg):
    with pytest.raises(ConfigError, match=msg):
        sm90_fwd.check(cfg, target, d)


def test_every_rule_says_why():
    for fam in FAMILIES.values():
        for rule in fam.RULES:
            assert rule.knob and rule.why


def test_head_dim_pad():
    assert [head_dim_pad(d) for d in (1, 16, 17, 80, 96, 128, 192, 256)] == \
        [16, 16, 32, 128, 128, 128, 256, 256]


def test_sm90_head_parts():
    """A head dim between two powers of two runs as the lower one and a tail, where that
    is narrower than the next power; the others are padded whole."""
    from flashscope.families.sm90_fwd import head_parts, head_width, min_shared_bytes as sm90

    want = {33: (32, 16), 40: (32, 16), 48: (32, 16), 49: (64, 0), 64: (64, 0),
            65: (64, 16), 72: (64, 16), 80: (64, 16), 81: (64, 32), 96: (64, 32),
            97: (128, 0), 112: (128, 0), 128: (128, 0), 129: (128, 16), 160: (128, 32),
            192: (128, 64), 193: (256, 0), 256: (256, 0)}
    assert {d: head_parts(d) for d in want} == want
    for d in range(33, 257):
        main, tail = head_parts(d)
        assert main + tail >= d and main & (main - 1) == 0 and tail & (tail - 1) == 0
        assert tail == 0 or 16 <= tail < main
        assert head_width(d) == main + tail <= head_dim_pad(d)
    cfg = Sm90FwdConfig(EARLY_Q=False, K_EARLY=False)
    assert sm90(cfg, 96) - sm90(cfg, 128) == -(128 + 4 * 128) * 32 * 2


def test_min_shared_bytes_is_kv_tiles():
    cfg = TritonFwdConfig(BLOCK_N=64, num_stages=3)
    assert min_shared_bytes(cfg, 128) == 2 * 64 * 128 * 2 * 2


@pytest.mark.parametrize("t", ALL_TARGETS, ids=lambda t: t.name)
@pytest.mark.parametrize("d", [16, 64, 80, 128, 192, 256])
def test_defaults_are_feasible_everywhere(t, d):
    for causal in (False, True):
        p = Problem(t.name, "bfloat16", d, causal)
        fam = forward_family(p)
        cfg = default_config(p)
        assert fam.check(cfg, t.name, d) is cfg
        bwd = triton_bwd.select(p)
        assert triton_bwd.check(bwd, t.name, d) is bwd


def _suite_problems():
    """Every forward problem of the models suite and the standard suite, both dtypes, as
    the API poses it (batch x heads, both lengths)."""
    from flashscope.bench.suite import DTYPES, standard_suite, table_suite

    cases = table_suite("models", dtypes=DTYPES) + standard_suite(dtypes=DTYPES)
    return {(c.dtype, c.D, c.causal, c.Nq, c.Nk, c.B * c.H) for c in cases}


@pytest.mark.parametrize("t", ALL_TARGETS, ids=lambda t: t.name)
def test_every_suite_shape_resolves_to_a_config_the_rules_accept(t):
    """On every target, each shape of the models and standard suites gets a forward config
    (its tuned entry or rule) and a backward config that their families' rules accept."""
    problems = _suite_problems()
    assert len(problems) > 50
    for dtype, d, causal, nq, nk, heads in sorted(problems):
        p = Problem(t.name, dtype, d, causal, nq, nk, heads)
        fam = forward_family(p)
        cfg = default_config(p)
        assert cfg.KERNEL == fam.KERNEL
        assert fam.check(cfg, t.name, d, dtype) is cfg
        bwd = triton_bwd.select(p)
        assert triton_bwd.check(bwd, t.name, d, dtype) is bwd


def test_forward_family_rule():
    assert forward_family(Problem("sm90", "float16", 128)) is sm90_fwd
    assert forward_family(Problem("sm90", head_dim=96)) is sm90_fwd  # at width 128
    assert forward_family(Problem("sm90", head_dim=32)) is triton_fwd
    assert forward_family(Problem("sm90", head_dim=64, window=True, softcap=True)) is sm90_fwd
    assert forward_family(Problem("sm90", head_dim=64, varlen=True)) is sm90_fwd
    assert forward_family(Problem("sm80", head_dim=64)) is triton_fwd
    assert FORWARD[-1] is triton_fwd  # accepts everything: the fallback


def test_sm90_rule_by_head_dim_and_mask():
    d64 = sm90_fwd.select(Problem("sm90", head_dim=64, causal=True))
    assert (d64.BLOCK_M, d64.num_stages, d64.PINGPONG, d64.Q_IN_REGS) == (192, 3, True, False)
    d128 = sm90_fwd.select(Problem("sm90", head_dim=128))
    assert d128 == Sm90FwdConfig() and sm90_fwd.select(
        Problem("sm90", head_dim=128, causal=True)).BALANCE
    assert sm90_fwd.select(Problem("sm90", head_dim=80)) == d128  # its padded width's
    d256 = sm90_fwd.select(Problem("sm90", head_dim=256))
    assert (d256.BLOCK_N, d256.EARLY_Q, d256.Q_IN_REGS) == (64, False, False)
    assert sm90_fwd.check(d256, "sm90", 256) is d256


def test_sm90_fit_takes_the_smaller_tile_only_on_short_padded_rows():
    """192-row tiles give way to 128-row ones where they pad a quarter more rows (ViT-B's
    197 tokens: 384 rows against 256); at 512, 577, 1500 and 4096 rows they stay."""
    for n, block in ((197, 128), (100, 128), (512, 192), (577, 192), (1500, 192),
                     (4096, 192), (1, 128)):
        p = Problem("sm90", "bfloat16", 64, False, n, n, 768)
        assert default_config(p).BLOCK_M == block, n
        assert sm90_fwd.fit(default_config(p), p).BLOCK_M == block  # fitting is idempotent
    d128 = Problem("sm90", "bfloat16", 128, False, 197, 197, 768)
    assert sm90_fwd.fit(default_config(d128), d128) == default_config(d128)  # 128 rows
    cfg = sm90_fwd.select(Problem("sm90", head_dim=64))
    assert sm90_fwd.fit(cfg, Problem("sm90", "bfloat16", 64, False, 197)) == \
        cfg.replace(BLOCK_M=128)  # only the tile changes


def test_sm90_fit_cuts_the_keys_when_the_tiles_leave_sms_idle():
    """SDXL's 440 tiles take 4 waves of 132 SMs, 83% busy: the work list is cut along the
    keys, without BALANCE. Full waves, causal problems, bands (which refuse SPLIT_KV) and
    an unknown batch keep their config."""
    sdxl = Problem("sm90", "bfloat16", 64, False, 4096, 4096, 20)
    assert sm90_fwd.wave_share(440, 132) < sm90_fwd.WAVE_LIMIT
    assert default_config(sdxl).SPLIT_KV and default_config(sdxl).BLOCK_M == 192
    assert not default_config(sdxl).BALANCE  # the cut list is not priced again
    for p in (Problem("sm90", "bfloat16", 64, False, 4096, 4096, 128),  # 2816 tiles: 97%
              Problem("sm90", "bfloat16", 64, True, 4096, 4096, 20),
              Problem("sm90", "bfloat16", 64, False, 4096, 4096, 20, window=True),
              Problem("sm90", "bfloat16", 64, False, 4096, 4096)):
        assert not default_config(p).SPLIT_KV, p


@pytest.mark.parametrize("D,span,narrow", [
    (64, 128, True), (64, 1024, True), (64, 1025, False), (64, 2048, False),
    (128, 512, True), (128, 513, False), (96, 512, True), (96, 1024, False),
    (128, 0, False), (256, 128, False)])
def test_sm90_narrow_bands_take_64_key_tiles(D, span, narrow):
    """A band that spans span x padded D <= NARROW_BAND keys runs key tiles of 64 and twice
    the stages (at most NARROW_STAGES); wider bands, one-sided windows (span 0) and D =
    256 (64-key tiles already) keep the rule's tile. Through the API's problem: a causal
    window of ``span`` keys, and the two-sided window of the same span."""
    import torch

    from flashscope import api
    from flashscope.masks import Mask

    wide = sm90_fwd.select(Problem("sm90", "bfloat16", D, True, 8192, 8192, 64, window=True))
    for mask in (Mask.of(True, (span, 0)), Mask.of(False, (span // 2, span - span // 2))):
        if span == 0:
            mask = Mask.of(False, (300, None))
        q = torch.empty(2, 32, 8192, D, dtype=torch.bfloat16, device="meta")
        problem = api.problem_of(q, q, mask, "sm90")
        assert problem.band_keys == (span if mask.right is not None else 0)
        cfg = default_config(problem)
        sm90_fwd.check(cfg, "sm90", D)
        if narrow:
            assert cfg.BLOCK_N == wide.BLOCK_N // 2 == 64
            assert cfg.num_stages == min(2 * wide.num_stages, sm90_fwd.NARROW_STAGES)
        else:
            assert (cfg.BLOCK_N, cfg.num_stages) == (wide.BLOCK_N, wide.num_stages)


def test_config_from_text_fills_from_the_targets_own_default():
    p = Problem("gfx942", "bfloat16", 128)
    cfg = config_from_text("BLOCK_M=64", p)
    assert cfg == dataclasses.replace(default_config(p), BLOCK_M=64)  # 8 warps, 2 stages
    assert config_from_text("sm90-fwd:BLOCK_M=192", Problem("sm90")).BLOCK_M == 192
    with pytest.raises(ConfigError, match="not a kernel family"):
        config_from_text("nope:BLOCK_M=64", p)
    with pytest.raises(ConfigError, match="unknown key"):
        config_from_text("BLOCK_M1=64", p)


def test_backward_record():
    cfg = TritonBwdConfig.parse("BLOCK_M1=16")
    assert cfg.label == "triton-bwd dkdv 16x128 dq 128x32 w4 s3"
    with pytest.raises(ConfigError, match="unknown kernel family"):
        family("fwd-but-wrong")


@pytest.mark.parametrize("target,units", [("sm80", 108), ("sm90", 132), ("gfx942", 304),
                                          ("gfx1100", 96)])
def test_rules_size_grids_by_the_target_tables_units(target, units):
    """Problem.units: the SMs (CUs on AMD) of the target table's example product, one
    count for every rule (an A100 SXM4, H100 SXM5, MI300X, RX 7900 XTX)."""
    assert Problem(target).units == units
