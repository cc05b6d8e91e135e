"""Adoption end to end on recorded A/B runs (flashscope.tune.adopt): the rule decides, the
tuned file is written through flashscope.tuned.write_entries only, and nothing is written
when nothing is adopted or the input is bad."""

import json
import shutil
from pathlib import Path

import pytest

from flashscope.errors import ArtifactError, FlashscopeError
from flashscope.families import Problem
from flashscope.tuned import load_tuned, lookup, make_entry, tuned_path, write_entries
from flashscope.tune.adopt import Rule, adopt
from flashscope.tune.results import read_result

DATA = Path(__file__).parents[1] / "data" / "tune"
D64N16K = Problem("sm90", "bfloat16", 64, False, 16384, 16384, 32)
D64C16K = Problem("sm90", "bfloat16", 64, True, 16384, 16384, 32)


@pytest.fixture
def tuned(tmp_path):
    """A copy of the shipped sm90 file whose 16k D = 64 entries are the defaults the
    recorded A/Bs timed as their base."""
    d = tmp_path / "tuned"
    d.mkdir()
    shutil.copy(tuned_path("sm90"), d / "sm90.json")
    bases = [read_result(DATA / "balance-12" / "d64n16k.json").base.config,
             read_result(DATA / "pingpong-a" / "d64c16k.json").base.config]
    write_entries("sm90", [make_entry(bases[0], "bfloat16", 64, False, "le16k"),
                           make_entry(bases[1], "bfloat16", 64, True, "le16k")], d)
    return d


def _runs(tmp_path, *runs, cells=None) -> list:
    """Copies of recorded A/B folders (``cells``: only those files)."""
    out = []
    for r in runs:
        d = tmp_path / r
        d.mkdir(exist_ok=True)
        for f in (DATA / r).glob("*.json"):
            if cells is None or f.stem in cells:
                shutil.copy(f, d / f.name)
        out.append(d)
    return out


def test_one_reading_adopts_and_its_confirmation_refuses(tuned, tmp_path):
    """The 12-round reading alone adopts + BALANCE (0.958) for D = 64 non-causal 16k;
    confirmed by the 30-round one (1.022) it is kept, and the file is not touched."""
    one, two = _runs(tmp_path, "balance-12", "balance-30")
    before = (tuned / "sm90.json").read_bytes()
    [v] = adopt(one, data_dir=tuned, dry_run=True)
    assert v.action == "adopted" and "bl1 +BALANCE=1: 0.958" in v.line, v.line
    assert (tuned / "sm90.json").read_bytes() == before
    [v] = adopt(one, Rule(confirm=(two,)), data_dir=tuned)
    assert v.line == ("d64n16k: kept the default (no variant <= 0.995 with Q3 < 1 here and "
                      "in the 1 --confirm run(s))")
    assert (tuned / "sm90.json").read_bytes() == before


def test_relaxed_quartile_adopts_the_wide_cell_and_writes_what_was_timed(tuned, tmp_path):
    main, *confirm = _runs(tmp_path, "pingpong-c", "pingpong-a", "pingpong-b", "pingpong-d")
    [v] = adopt(main, Rule(confirm=tuple(confirm)), data_dir=tuned, dry_run=True)
    assert v.line == ("d64c16k: kept the default (no variant <= 0.995 with Q3 < 1 here and "
                      "in the 3 --confirm run(s))")
    base = lookup(D64C16K, "sm90-fwd", tuned)[0]
    [v] = adopt(main, Rule(q3_below=1.02, confirm=tuple(confirm)), data_dir=tuned)
    assert v.action == "adopted" and "po +PINGPONG=1:" in v.line, v.line
    cfg, is_tuned, _ = lookup(D64C16K, "sm90-fwd", tuned)
    assert is_tuned and cfg == base.replace(PINGPONG=True)
    entry = load_tuned("sm90", tuned)[("sm90-fwd", "bfloat16", 64, True, "le16k")][1]
    assert entry["config"] == cfg.diff() and entry["search"] == "ab"
    assert entry["shape"] == "1,32,16384,64" and entry["ms"] == v.entry["ms"]
    src = entry["source"]
    assert src.startswith("flashscope tune A/B: +PINGPONG=1 at 0.987 (IQR 0.973-1.016) ")
    for part in ("32 interleaved rounds of 30 launches", "L2 flushed before each",
                 "confirmed by 3 more A/B run(s)", "NVIDIA H100 80GB HBM3, 2026-11-25",
                 f"({base.label})"):
        assert part in src, (part, src)
    assert "run" not in src.replace("run(s)", "").replace("runs", "")
    assert v.replaced == f"sm90-fwd:{base.text}"
    # the other entries are as they were
    before = load_tuned("sm90")
    after = load_tuned("sm90", tuned)
    assert {k: c for k, (c, _) in after.items() if k[2:] != (64, True, "le16k")
            and k[2:] != (64, False, "le16k")} == {
        k: c for k, (c, _) in before.items() if k[2:] != (64, True, "le16k")
        and k[2:] != (64, False, "le16k")}


def test_pooled_rule_adopts_the_lowest_pooled_median(tuned, tmp_path):
    main, *confirm = _runs(tmp_path, "pingpong-c", "pingpong-a", "pingpong-b", "pingpong-d")
    [v] = adopt(main, Rule(alpha=0.01, confirm=tuple(confirm)), data_dir=tuned)
    assert "pok +PINGPONG=1,K_EARLY=0:" in v.line
    assert "pooled over 112 rounds of 4 A/B runs, faster in 77 (sign test p = " in \
        v.entry["source"]
    cfg = lookup(D64C16K, "sm90-fwd", tuned)[0]
    assert cfg.PINGPONG and not cfg.K_EARLY and cfg.SPLIT_KV


def test_pooled_rule_refuses_the_chance_reading(tuned, tmp_path):
    one, two = _runs(tmp_path, "balance-12", "balance-30")
    [v] = adopt(one, Rule(alpha=0.01, confirm=(two,)), data_dir=tuned)
    assert v.line.startswith("d64n16k: kept the default (no variant at a pooled median")


def test_a_cell_missing_from_a_confirmation_is_kept(tuned, tmp_path):
    main, other = _runs(tmp_path, "pingpong-c", "balance-30")
    [v] = adopt(main, Rule(confirm=(other,)), data_dir=tuned)
    assert v.line == "d64c16k: kept the default (not in every --confirm run)"


def test_a_default_changed_since_the_ab_is_skipped(tuned, tmp_path):
    [one] = _runs(tmp_path, "balance-12")
    base = lookup(D64N16K, "sm90-fwd", tuned)[0]
    write_entries("sm90", [make_entry(base.replace(num_stages=2), "bfloat16", 64, False,
                                      "le16k")], tuned)
    before = (tuned / "sm90.json").read_bytes()
    [v] = adopt(one, data_dir=tuned)
    assert v.action == "skipped" and "the default is now sm90-fwd 192x128 s2" in v.line
    assert (tuned / "sm90.json").read_bytes() == before


def test_two_cells_deciding_one_entry_are_refused(tuned, tmp_path):
    [one] = _runs(tmp_path, "balance-12")
    data = json.loads((one / "d64n16k.json").read_text())
    data["meta"].update(cell="2x32x8192x64n", shape="2,32,8192,64")
    (one / "2x32x8192x64n.json").write_text(json.dumps(data))
    before = (tuned / "sm90.json").read_bytes()
    with pytest.raises(FlashscopeError, match="both decide the tuned entry"):
        adopt(one, data_dir=tuned)
    assert (tuned / "sm90.json").read_bytes() == before


def test_bad_results_fail_closed_naming_the_file(tuned, tmp_path):
    [one] = _runs(tmp_path, "balance-12")
    before = (tuned / "sm90.json").read_bytes()
    (one / "d64n16k.json").write_text((one / "d64n16k.json").read_text()[:500])
    with pytest.raises(ArtifactError, match="d64n16k.json: not valid JSON"):
        adopt(one, data_dir=tuned)
    with pytest.raises(ArtifactError, match="sm90.json: not a flashscope tune A/B result"):
        adopt(tuned, data_dir=tuned)  # a tuned file is not an A/B result
    (tmp_path / "empty").mkdir()
    with pytest.raises(FlashscopeError, match="no A/B results"):
        adopt(tmp_path / "empty", data_dir=tuned)
    assert (tuned / "sm90.json").read_bytes() == before


@pytest.mark.parametrize("kw,msg", [
    (dict(max_ratio=1.0), "--max-ratio 1.0: expected a ratio in"),
    (dict(q3_below=1.02, confirm=("a",)), "needs at least two --confirm"),
    (dict(alpha=0.01), "--pooled needs --confirm"),
    (dict(alpha=1.5, confirm=("a",)), "--alpha 1.5"),
    (dict(q3_below=0.9), "--q3-below 0.9"),
])
def test_rule_parameters_are_checked(kw, msg):
    with pytest.raises(FlashscopeError, match=msg):
        Rule(**kw)
