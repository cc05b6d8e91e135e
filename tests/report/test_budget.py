"""The analytic register budget: hand-computed cases, per vendor layout."""

import pytest

from flashscope.budget import COMPONENTS, REST, budget, compare, rows_per_thread, LAYOUTS
from flashscope import TritonFwdConfig
from flashscope.errors import ConfigError


def test_sm90_wgmma_by_hand():
    # T = 8 warps x 32 = 256; D_pad = 128; 16 rows per warp -> one 16-row slab -> 2 rows.
    b = budget(TritonFwdConfig(128, 64, 8, 2), "sm90", 128)
    assert b.threads == 256 and b.rows_per_thread == 2
    assert b.parts == {"acc": 64.0, "scores": 32.0, "p": 16.0, "q": 32.0, "stats": 4.0,
                       "kv": 0.0, "rest": float(REST)}
    assert b.total == 164.0 and b.dominant == "acc"


@pytest.mark.parametrize("bm", [128, 192])
def test_gluon_counts_one_consumer_warpgroup(bm):
    # sm90-fwd: each consumer warpgroup holds 64 of the BLOCK_M rows over 128 threads, so
    # the budget is one consumer's, whatever BLOCK_M: D = 128, BN = 128, Q in registers:
    # acc 64, S 64, P 32, Q 32, 2 rows per lane -> stats 4; 212 against the 240 that
    # setmaxnreg gives a consumer of a 128-row block.
    from flashscope import Sm90FwdConfig

    cfg = Sm90FwdConfig(BLOCK_M=bm, BLOCK_N=128, num_stages=2, Q_IN_REGS=True)
    b = budget(cfg, "sm90", 128)
    assert b.threads == 128 and b.rows_per_thread == 2
    assert b.parts == {"acc": 64.0, "scores": 64.0, "p": 32.0, "q": 32.0, "stats": 4.0,
                       "kv": 0.0, "rest": float(REST)}
    assert budget(cfg.replace(Q_IN_REGS=False), "sm90", 128).total == b.total - 32


def test_cdna_wavefront64_by_hand():
    # T = 8 x 64 = 512; 16 rows per wave < one 32-row MFMA slab -> 16 rows per lane;
    # the whole 64 x 128 K tile per wave: 64 * 128 * 2 / 4 / 64 = 64 VGPRs.
    b = budget(TritonFwdConfig(128, 64, 8, 2), "gfx942", 128)
    assert b.threads == 512 and b.lanes == 64 and b.rows_per_thread == 16
    assert b.parts == {"acc": 32.0, "scores": 16.0, "p": 8.0, "q": 16.0, "stats": 32.0,
                       "kv": 64.0, "rest": 16.0}
    assert b.total == 184.0 and b.dominant == "kv"


def test_sm80_padded_head_dim_and_q_off():
    # D = 100 pads to 128; Q_IN_REGS off drops q; kv: 16 x max(32, 128) x 2 / 4 / 32 = 32.
    b = budget(TritonFwdConfig(64, 32, 4, 1, Q_IN_REGS=False), "sm80", 100)
    assert b.parts == {"acc": 64.0, "scores": 16.0, "p": 8.0, "q": 0.0, "stats": 4.0,
                       "kv": 32.0, "rest": 16.0}
    assert b.total == 140.0


def test_rdna_two_slabs_per_warp():
    # T = 4 x 32 = 128; 32 rows per warp = two 16-row WMMA slabs x 8 rows -> 16 rows.
    b = budget(TritonFwdConfig(128, 64, 4, 1), "gfx1100", 64)
    assert b.rows_per_thread == 16
    assert [b.parts[k] for k in COMPONENTS] == [64, 64, 32, 32, 32, 64, 16]
    assert b.total == 304.0


def test_rows_per_thread_never_below_one_slab():
    assert rows_per_thread(TritonFwdConfig(16, 16, 8, 1), LAYOUTS["hopper"]) == 2
    assert rows_per_thread(TritonFwdConfig(256, 64, 4, 1), LAYOUTS["ampere"]) == 8


def test_compare_signs_and_flags():
    b = budget(TritonFwdConfig(128, 64, 8, 2), "sm90", 128)
    c = compare(b, 200)
    assert c == {"predicted": 164.0, "measured": 200, "error": -36.0, "rel_error": -0.18,
                 "spilled": False, "at_cap": False, "dominant": "acc"}
    c = compare(b, 255, spilled=True)
    assert c["spilled"] and c["at_cap"] and c["error"] == -91.0


@pytest.mark.parametrize("bad", [0, -3, None])
def test_compare_rejects_non_counts(bad):
    b = budget(TritonFwdConfig(), "sm90", 64)
    with pytest.raises(ConfigError, match="measured registers"):
        compare(b, bad)
