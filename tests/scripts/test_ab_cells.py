"""The A/B driver's variant lists (scripts/gpu/ab_cells.py): cells, one-knob neighbours and
transplanted entries, read against the shipped sm90 tuned file (no GPU)."""

import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path[:0] = [os.path.join(ROOT, "scripts", "gpu")]

from ab_cells import cell_default, cell_shape, check_names, neighbours, transplants  # noqa: E402,E501
from adopt_ab import resolve  # noqa: E402
from flashscope.families.compat_test import check_config  # noqa: E402
from flashscope.tuned import load_tuned  # noqa: E402

CELLS = [f"d{d}{m}{n}k" for d in (64, 128) for m in "nc" for n in (1, 4, 16)]


def _config(spec, base):
    """(name, config) as adopt_ab reads an ab_cells variant."""
    name, body = spec.split("=", 1)
    return name, resolve(body, base)


def test_cell_shape_is_the_suite_and_rejects_bad_names():
    assert cell_shape("d64c1k") == ("16,32,1024,64", True)
    assert cell_shape("d128n16k") == ("1,16,16384,128", False)
    with pytest.raises(SystemExit, match="expected d<D><c|n><N>k"):
        cell_shape("64c1k")


def test_a_variant_name_given_twice_is_refused():
    check_names({"d64n4k": "d=+;f=fa4;ni=+OUT_RCP=1;n=cudnn"})
    with pytest.raises(SystemExit, match="d64n4k: --variants: 'd' names two variants"):
        check_names({"d64n4k": "d=+;f=fa4;d=+OUT_RCP=1;n=cudnn"})


@pytest.mark.parametrize("cell", CELLS)
def test_neighbours_change_exactly_one_knob(cell):
    base, d = cell_default(cell)
    specs = neighbours(cell)
    assert specs and len({s.split("=")[0] for s in specs}) == len(specs)
    for spec in specs:
        _, cfg = _config(spec, base)
        check_config(cfg, "sm90", d)
        diff = [k for k, v in cfg.as_dict().items() if v != base.as_dict()[k]]
        assert len(diff) == 1, (spec, diff)


@pytest.mark.parametrize("cell", CELLS)
def test_transplants_are_the_other_entries_of_the_head_dim(cell):
    base, d = cell_default(cell)
    specs = transplants(cell)
    got = [_config(s, base)[1] for s in specs]
    keys = [c.key for c in got]
    assert base.key not in keys and len(set(keys)) == len(keys)
    want = {cfg.key for (dt, hd, _, _), (cfg, _) in load_tuned("sm90").items()
            if dt == "bfloat16" and hd == d} - {base.key}
    assert set(keys) == want
    for cfg in got:
        check_config(cfg, "sm90", d)
    names = [s.split("=")[0] for s in specs]
    assert all(n[0] == "x" and n[1] in "cn" and n.endswith("k") for n in names)
