import json

import pytest

from flashscope import TritonFwdConfig
from flashscope.errors import ConfigError, FlashscopeError, UnknownTargetError
from flashscope.sweep.space import (AXES, Problem, default_space, infeasible, load_space,
                                    parse_space)

BASE = {"targets": ["sm90"], "dtypes": ["bfloat16"], "head_dims": [64], "causal": [False],
        "BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4], "num_stages": [2]}


def test_points_are_the_product_and_defaults_fill_missing_axes():
    feasible, pruned = parse_space(BASE).points()
    assert pruned == []
    assert len(feasible) == 4
    cfgs = {c for _, c in feasible}
    assert TritonFwdConfig(64, 32, 4, 2) in cfgs
    assert all(c.Q_IN_REGS is True and c.maxnreg is None for c in cfgs)
    assert {p for p, _ in feasible} == {Problem("sm90", "bfloat16", 64, False)}


@pytest.mark.parametrize("key,value,needle", [
    ("BLOCK_M", [48], "BLOCK_M: 48 is impossible; expected a power of two in 16..256"),
    ("BLOCK_N", [512], "BLOCK_N: 512 is impossible"),
    ("num_warps", [3], "num_warps: 3 is impossible"),
    ("num_stages", [0], "num_stages: 0 is impossible; expected an integer in 1..8"),
    ("num_stages", [2.5], "num_stages: 2.5 is impossible"),
    ("maxnreg", [300], "maxnreg: 300 is impossible"),
    ("Q_IN_REGS", ["yes"], "Q_IN_REGS: 'yes' is impossible; expected true or false"),
    ("BLOCK_M", [True], "BLOCK_M: True is impossible"),
    ("BLOCK_M", [], "BLOCK_M is empty"),
    ("head_dims", [0], "head_dims: 0 is not an integer in 1..256"),
    ("dtypes", ["float32"], "dtypes: 'float32' is not one of"),
    ("causal", ["no"], "causal: expected true/false"),
])
def test_impossible_values_are_named(key, value, needle):
    with pytest.raises(ConfigError) as e:
        parse_space({**BASE, key: value})
    assert needle in str(e.value)


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown key 'BLOCK_K' \(did you mean 'BLOCK_[MN]'"):
        parse_space({**BASE, "BLOCK_K": [64]})


def test_unknown_target():
    with pytest.raises(UnknownTargetError):
        parse_space({**BASE, "targets": ["sm99"]})


def test_vendor_knob_without_its_vendor_is_an_error():
    with pytest.raises(ConfigError, match="waves_per_eu is set but applies only to amd"):
        parse_space({**BASE, "waves_per_eu": [2]})


def test_vendor_knobs_collapse_per_target_and_duplicates_drop():
    sp = parse_space({**BASE, "targets": ["sm90", "gfx942"], "BLOCK_M": [64],
                      "BLOCK_N": [32], "maxnreg": [None, 128], "waves_per_eu": [None, 2]})
    feasible, pruned = sp.points()
    by_target = {}
    for p, c in feasible:
        by_target.setdefault(p.target, set()).add((c.maxnreg, c.waves_per_eu))
    assert by_target["sm90"] == {(None, None), (128, None)}
    assert by_target["gfx942"] == {(None, None), (None, 2)}
    assert pruned == []


def test_pruned_points_carry_check_configs_reason():
    sp = parse_space({**BASE, "head_dims": [256], "BLOCK_M": [64], "BLOCK_N": [64, 256],
                      "num_stages": [1, 8], "num_warps": [4, 16]})
    feasible, pruned = sp.points()
    reasons = {c.key: r for _, c, r in pruned}
    big = TritonFwdConfig(64, 256, 4, 8).key
    assert big in reasons and "shared memory" in reasons[big]
    # 16 warps = 512 threads: allowed on sm90; the shared-memory bound is what prunes
    assert all(c.key not in reasons for _, c in feasible)
    for _, c, r in pruned:
        assert r == infeasible(c, Problem("sm90", "bfloat16", 256, False))
    assert len(feasible) + len(pruned) == 8


def test_amd_lds_limit_prunes_with_reason():
    sp = parse_space({**BASE, "targets": ["gfx942"], "head_dims": [128], "BLOCK_M": [64],
                      "BLOCK_N": [128], "num_warps": [4], "num_stages": [2, 3]})
    feasible, pruned = sp.points()
    assert [c.num_stages for _, c in feasible] == [2]
    assert [c.num_stages for _, c, _ in pruned] == [3]
    assert "128 KB of shared memory, more than the 64 KB a gfx942 block" in pruned[0][2]


def test_spaces_list_and_axes_union():
    sp = parse_space({"spaces": [
        {**BASE, "head_dims": [64], "BLOCK_M": [64]},
        {**BASE, "head_dims": [64], "BLOCK_M": [128], "num_stages": [3]},
        {**BASE, "head_dims": [128], "BLOCK_M": [32]}]})
    p64 = Problem("sm90", "bfloat16", 64, False)
    feasible, _ = sp.points(p64)
    assert len(feasible) == 4
    axes = sp.axes_for(p64)
    assert axes["BLOCK_M"] == (64, 128) and axes["num_stages"] == (2, 3)
    assert set(axes) == set(AXES)
    assert len(sp.problems()) == 2


def test_spaces_key_rejects_neighbours_and_empty():
    with pytest.raises(ConfigError, match="no other key"):
        parse_space({"spaces": [BASE], "BLOCK_M": [64]})
    with pytest.raises(ConfigError, match="non-empty list"):
        parse_space({"spaces": []})
    with pytest.raises(ConfigError, match=r"spaces\[1\]: unknown key 'warps'"):
        parse_space({"spaces": [BASE, {"warps": [4]}]})


def test_load_space_file_errors(tmp_path):
    with pytest.raises(FlashscopeError, match="cannot read"):
        load_space(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_space(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(BASE))
    assert len(load_space(good).points()[0]) == 4


def test_default_space_is_about_thirty_points_per_problem():
    sp = default_space(["sm90", "gfx942"], ["bfloat16"], [64, 128], [False, True])
    for p in sp.problems():
        feasible, pruned = sp.points(p)
        assert 24 <= len(feasible) + len(pruned) <= 36, (p, len(feasible))
        assert len(feasible) >= 16


def test_restrict_one_block_replaces_several_blocks_filter():
    from flashscope.sweep.space import restrict

    one = restrict(parse_space(BASE), head_dims=[128], targets=["sm_80"])
    assert {(p.target, p.head_dim) for p in one.problems()} == {("sm80", 128)}
    two = default_space(["sm90", "gfx942"], ["bfloat16"], [64], [False])
    only_amd = restrict(two, targets=["gfx942"])
    assert {p.target for p in only_amd.problems()} == {"gfx942"}
    assert only_amd.points()[0] == two.points(Problem("gfx942", "bfloat16", 64, False))[0]
    with pytest.raises(ConfigError, match="no block of the space covers"):
        restrict(two, targets=["sm80"])


def test_the_sm90_kernel_has_a_space_of_its_own():
    from flashscope.families.sm90_fwd import Sm90FwdConfig
    from flashscope.sweep.space import default_space

    sp = parse_space({"targets": ["sm90"], "head_dims": [128], "causal": [True],
                      "BLOCK_M": [64, 128, 192], "num_stages": [2, 3],
                      "PINGPONG": [False, True]}, kernel="sm90-fwd")
    feasible, pruned = sp.points()
    assert all(isinstance(c, Sm90FwdConfig) for _, c in feasible)
    reasons = {(c.BLOCK_M, c.num_stages, c.PINGPONG): r for _, c, r in pruned}
    assert "PINGPONG=1 needs two or three" in reasons[(64, 2, True)]
    assert "shared memory" in reasons[(192, 3, False)]
    assert len(feasible) + len(pruned) == 12
    with pytest.raises(ConfigError, match="BLOCK_M: 96 is impossible; expected 64, 128 or 192"):
        parse_space({"BLOCK_M": [96]}, kernel="sm90-fwd")
    with pytest.raises(ConfigError, match="unknown key 'num_warps'"):
        parse_space({"num_warps": [4]}, kernel="sm90-fwd")
    assert default_space(kernel="sm90-fwd").points()[0]
