"""The search steps (flashscope.tune.search, flashscope.families.neighbours): one-knob
neighbours within each family's rules, transplanted tuned entries."""

import dataclasses

import pytest

from flashscope.errors import ConfigError
from flashscope.families import FAMILIES, Problem, family, neighbours, sm90_fwd, triton_fwd
from flashscope.families.base import _field_kind
from flashscope.tuned import load_tuned
from flashscope.tune.cells import parse_cell, problem
from flashscope.tune.search import neighbour_specs, step_name, transplant_specs
from flashscope.tune.variants import default_config, resolve

CELLS = [f"d{d}{m}{n}k" for d in (64, 128) for m in "nc" for n in (1, 4, 16)]


def _moved(a, b) -> list:
    return [k for k, v in a.as_dict().items() if v != b.as_dict()[k]]


@pytest.mark.parametrize("kernel", list(FAMILIES))
def test_every_numeric_knob_has_a_ladder(kernel):
    fam = family(kernel)
    numeric = {f.name for f in dataclasses.fields(fam.Config) if _field_kind(f) != "bool"}
    assert numeric == set(fam.STEPS), "a knob without a ladder is never searched"


@pytest.mark.parametrize("cell", CELLS)
def test_neighbours_of_the_shipped_entries_move_one_knob_within_the_rules(cell):
    """Each neighbour changes exactly one knob and passes the family's rules; and no knob
    that could move is missed: for every knob with some other value the rules accept,
    the nearest accepted value on each side of its ladder is a neighbour."""
    prob = problem(parse_cell(cell), "sm90")
    base = default_config(prob)
    assert base.KERNEL == "sm90-fwd"
    got = neighbours(base, "sm90", prob.head_dim)
    assert got
    for knob, value, cfg in got:
        assert _moved(base, cfg) == [knob] and getattr(cfg, knob) == value
        sm90_fwd.check(cfg, "sm90", prob.head_dim)
    want = set()
    for f in dataclasses.fields(base):
        ladder = [not getattr(base, f.name)] if _field_kind(f) == "bool" else \
            sm90_fwd.STEPS[f.name]
        ok = []
        for v in ladder:
            try:
                sm90_fwd.check(base.replace(**{f.name: v}), "sm90", prob.head_dim)
                ok.append(v)
            except ConfigError:
                pass
        now = getattr(base, f.name)
        below = [v for v in ok if v < now] if _field_kind(f) != "bool" else []
        above = [v for v in ok if v > now] if _field_kind(f) != "bool" else ok
        want |= {(f.name, max(below))} if below else set()
        want |= {(f.name, min(above))} if above else set()
    assert {(k, v) for k, v, _ in got} == want


def test_steps_skip_values_the_rules_refuse_and_respect_the_vendor():
    """On sm90 the portable kernel's waves_per_eu (AMD) never moves and maxnreg steps to
    its caps; on gfx942 the reverse. Tiles step to the nearest power of two allowed."""
    cfg = triton_fwd.TritonFwdConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    nv = {(k, v) for k, v, _ in neighbours(cfg, "sm90", 128)}
    assert ("maxnreg", 232) in nv and not any(k == "waves_per_eu" for k, _ in nv)
    assert {("BLOCK_M", 64), ("BLOCK_M", 256), ("BLOCK_N", 32), ("BLOCK_N", 128),
            ("num_warps", 4), ("num_warps", 16), ("num_stages", 2), ("num_stages", 4),
            ("Q_IN_REGS", False)} <= nv
    amd = {(k, v) for k, v, _ in neighbours(cfg, "gfx942", 128)}
    assert ("waves_per_eu", 4) in amd and not any(k == "maxnreg" for k, _ in amd)
    # 128 KB of K/V at 4 stages, D = 256: over gfx942's 64 KB, the step goes past it
    big = cfg.replace(BLOCK_N=32, num_stages=1)
    assert ("num_stages", 2) in {(k, v) for k, v, _ in neighbours(big, "gfx942", 256)}


def test_neighbour_specs_name_the_move_and_resolve_to_it():
    prob = problem(parse_cell("d128c4k"), "sm90")
    base = default_config(prob)
    specs = neighbour_specs(base, prob)
    assert specs["pingpong1"] == "+PINGPONG=1" and specs["block-m64"] == "+BLOCK_M=64"
    assert "num-stages3" not in specs  # 3 stages of 128 x 128 at D = 128 overflow shared memory
    for name, spec in specs.items():
        cfg = resolve(name, spec, prob).config
        assert len(_moved(base, cfg)) == 1
    assert step_name("maxnreg", None) == "maxnreg-none" and step_name("BLOCK_M", 192) == \
        "block-m192"


@pytest.mark.parametrize("cell", CELLS)
def test_transplants_are_the_other_entries_of_the_head_dim(cell):
    prob = problem(parse_cell(cell), "sm90")
    base = default_config(prob)
    specs = transplant_specs(base, prob)
    got = [resolve(n, s, prob).config for n, s in specs.items()]
    assert base not in got and len(set(got)) == len(got)
    want = {cfg for (k, dt, hd, _, _), (cfg, _) in load_tuned("sm90").items()
            if k == "sm90-fwd" and dt == "bfloat16" and hd == prob.head_dim} - {base}
    assert set(got) == want
    assert all(n[0] == "x" and n[1] in "cn" and n.endswith("k") for n in specs)


def test_transplants_read_the_given_tuned_folder(tmp_path):
    prob = Problem("sm90", "bfloat16", 64, False, 4096, 4096)
    base = default_config(prob, data_dir=tmp_path)
    assert transplant_specs(base, prob, tmp_path) == {}
