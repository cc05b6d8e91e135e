"""The bar.sync probe's PTX edit (scripts/gpu/ab_bars.py), on the D = 64 non-causal 16k
entry compiled for sm_90 here (no GPU)."""

import importlib.util
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path[:0] = [os.path.join(ROOT, "scripts", "gpu")]

from ab_bars import _BAR, copies, producer_in_one_warp, strip  # noqa: E402
from flashscope import compile as fcompile  # noqa: E402
from flashscope.tuned import lookup  # noqa: E402


@pytest.fixture(scope="module")
def ptx():
    config, tuned, _ = lookup("sm90", "bfloat16", 64, False, 16384)
    assert tuned
    return fcompile.build(config, "sm90", head_dim=64, causal=False, use_cache=False).asm


def _bars(text):
    return sum(1 for line in text.split("\n") if _BAR.match(line))


def test_each_flag_drops_only_the_barriers_it_names(ptx):
    counts = {f: strip(ptx, f)[1] for f in ("w", "a", "s", "was")}
    assert min(counts["w"], counts["a"]) >= 1  # (with named-barrier turns no "s" is left)
    assert counts["was"] == counts["w"] + counts["a"] + counts["s"]
    text, n = strip(ptx, "was")
    assert _bars(text) == _bars(ptx) - n
    # the barriers before the producer's TMA copies are kept
    assert _before_copy(text) == _before_copy(ptx) > 0


def _before_copy(text, kind="cp.async.bulk"):
    """bar.sync lines followed within four instructions by a TMA copy (``kind``: any;
    ``shared::cluster.global``: a load)."""
    lines = [x.strip() for x in text.split("\n")
             if x.strip() and not x.strip().startswith(("//", ".loc"))]
    return sum(1 for i, x in enumerate(lines) if _BAR.match(x)
               and any("cp.async.bulk" in y and kind in y for y in lines[i + 1:i + 5]))


def test_copies_rename_the_kernel_and_reject_unknown_flags(tmp_path):
    (spec,) = copies(["wa"], str(tmp_path))
    name, path = spec.split("=")
    assert name == "NBWA"
    text = open(path).read()
    assert "def _attn_fwd_sm90_nbwa(" in text and "def _attn_fwd_sm90(" not in text
    loaded = importlib.util.spec_from_file_location("nbwa_copy", path)
    mod = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(mod)
    assert mod._attn_fwd_sm90.__name__ == "_attn_fwd_sm90_nbwa"
    with pytest.raises(SystemExit, match="expected letters of w, a, s, p"):
        copies(["wx"], str(tmp_path))


def test_producer_edit_sends_warps_1_to_3_to_the_join_and_keeps_consumer_barriers(ptx):
    text, n = producer_in_one_warp(ptx)
    load = "shared::cluster.global"
    assert n >= _before_copy(ptx, load) > 0 and _before_copy(text, load) == 0
    assert _before_copy(text) == _before_copy(ptx) - _before_copy(ptx, load)  # stores kept
    assert _bars(text) == _bars(ptx) - n
    branch = [x for x in text.split("\n") if "%pw_p bra.uni" in x]
    assert len(branch) == 1
    label = branch[0].split("bra.uni ")[1].split(";")[0]
    lines = text.split("\n")
    at = next(i for i, x in enumerate(lines) if x.startswith(label + ":"))
    assert any("setmaxnreg.inc" in x for x in lines[at:at + 8])


def test_producer_edit_refuses_a_kernel_without_a_default_producer():
    config, _, _ = lookup("sm90", "bfloat16", 128, False, 1024)  # two consumers
    asm = fcompile.build(config, "sm90", head_dim=128, causal=False, use_cache=False).asm
    with pytest.raises(ValueError, match="no default-partition producer"):
        producer_in_one_warp(asm)
