"""The adoption rule's statistics (flashscope.tune.rule) on made-up readings and on recorded
A/B runs of an H100 (tests/data/tune, README there)."""

from pathlib import Path

import pytest

from flashscope.tune.results import read_result
from flashscope.tune.rule import (Reading, Stat, passes, per_reading, pooled, round_ratios,
                                  sign_test, stat)

DATA = Path(__file__).parents[1] / "data" / "tune"


def _reading(ratios: dict, ids: dict = None, rounds: int = None) -> Reading:
    """A reading whose base ``d`` takes 1 ms every round and each variant ``ratios[name]``
    (a constant or a list per round)."""
    n = rounds or max((len(r) for r in ratios.values() if isinstance(r, list)), default=8)
    times = {"d": [1.0] * n}
    for name, r in ratios.items():
        times[name] = list(r) if isinstance(r, list) else [r] * n
    return Reading("d", ids if ids is not None else {n: n for n in ratios}, times)


def test_stat_is_the_median_and_the_rank_quartiles():
    s = stat([1.04, 0.96, 0.99, 0.97, 1.01, 0.98, 1.0, 0.95])
    assert s == Stat(ratio=0.985, q1=0.97, q3=1.01, rounds=8, wins=5)
    assert stat([0.9]) == Stat(0.9, 0.9, 0.9, 1, 1)


def test_one_reading_must_clear_the_ratio_and_the_third_quartile():
    assert passes(Stat(0.98, 0.97, 0.99, 8, 8), 0.99)
    assert not passes(Stat(0.98, 0.97, 1.0, 8, 6), 0.99)
    assert not passes(Stat(0.991, 0.98, 0.995, 8, 8), 0.99)
    assert passes(Stat(0.988, 0.98, 1.012, 8, 5), 0.995, q3_below=1.02)
    assert not passes(Stat(0.988, 0.98, 1.021, 8, 5), 0.995, q3_below=1.02)


def test_lowest_median_wins_and_peers_are_not_candidates():
    r = _reading({"f": 0.9, "b": 0.97, "c": 0.95}, ids={"b": "B", "c": "C"})
    won = per_reading([r], 0.99)
    assert (won.identity, won.name, won.stat.ratio) == ("C", "c", 0.95)


def test_confirmation_needs_the_same_config_to_pass_in_every_run():
    """Matched by identity, not name: the second run calls them x and y; B fails there."""
    main = _reading({"b": 0.95, "c": 0.97}, ids={"b": "B", "c": "C"})
    other = _reading({"x": 1.02, "y": [0.98] * 7 + [0.999]}, ids={"x": "B", "y": "C"})
    assert per_reading([main, other], 0.99).identity == "C"
    missing = _reading({}, ids={})
    assert per_reading([main, other, missing], 0.99) is None


def test_sign_test_is_the_binomial_tail():
    assert sign_test(0, 10) == 1.0
    assert sign_test(10, 10) == 2.0 ** -10
    assert sign_test(6, 10) == (210 + 120 + 45 + 10 + 1) / 1024
    assert 0.001 < sign_test(72, 112) < 0.002


def test_pooled_rule_needs_every_reading_and_more_wins_than_chance():
    """Pooled rounds decide, but a reading whose median went against the variant vetoes
    it, and a variant missing from a reading is not adopted."""
    good = _reading({"v": [0.98] * 24 + [1.01] * 8})
    assert pooled([good, good], 0.995).identity == "v"
    against = _reading({"v": [0.97] * 10 + [1.02] * 22})  # pooled with good: won 34 of 64
    assert pooled([good, against], 0.995) is None
    assert pooled([good, _reading({}, ids={}, rounds=32)], 0.995) is None
    coin = _reading({"v": [0.98, 1.02] * 16})  # median 1.0: no lead
    assert pooled([coin, coin], 0.995) is None
    won = pooled([good, good], 0.995)
    assert (won.stat.rounds, won.stat.wins, won.stat.ratio) == (64, 48, 0.98)
    assert won.p == sign_test(48, 64)


def test_nan_never_passes():
    r = _reading({"v": [float("nan")] * 8})
    assert per_reading([r], 0.995) is None and pooled([r, r], 0.995) is None


# -- recorded runs ---------------------------------------------------------------------------

def _recorded(reading: str, cell: str):
    return read_result(DATA / reading / f"{cell}.json")


@pytest.mark.parametrize("reading,cell", [
    ("balance-12", "d64n16k"), ("balance-30", "d64n16k"), ("pingpong-a", "d64c16k"),
    ("pingpong-b", "d64c16k"), ("pingpong-c", "d64c16k"), ("pingpong-d", "d64c16k")])
def test_statistics_recomputed_from_the_times_are_the_recorded_ones(reading, cell):
    res = _recorded(reading, cell)
    for name, row in res.rows.items():
        s = stat(round_ratios(res.times, name, res.base.name))
        assert (round(s.ratio, 4), round(s.q1, 4), round(s.q3, 4)) == (
            row["ratio"], row["ratio_q1"], row["ratio_q3"]), name


def test_recorded_16k_chance_reading_fails_its_confirmation():
    """D = 64 non-causal 16k + BALANCE read 0.958 in 12 rounds and 1.022 in 30 rounds.
    Alone the first passes; with the second it does not, per reading or pooled."""
    one = _recorded("balance-12", "d64n16k").reading()
    two = _recorded("balance-30", "d64n16k").reading()
    won = per_reading([one], 0.995)
    assert won.name == "bl1" and round(won.stat.ratio, 3) == 0.958
    assert per_reading([one, two], 0.995) is None
    assert pooled([one, two], 0.995) is None


def test_recorded_wide_cell_needs_the_relaxed_quartile_or_the_pooled_rule():
    """Four readings of D = 64 causal 16k: +PINGPONG=1 at medians 0.988-0.993 with third
    quartiles 1.006-1.016. Per reading only Q3 < 1.02 adopts it (not the same with
    K_EARLY=0, whose median in the second reading is 0.9952); pooled, the lowest pooled median wins:
    K_EARLY=0 as well, 0.9885 over 112 rounds, faster in 77."""
    readings = [_recorded(r, "d64c16k").reading()
                for r in ("pingpong-c", "pingpong-a", "pingpong-b", "pingpong-d")]
    assert per_reading(readings, 0.995) is None
    won = per_reading(readings, 0.995, q3_below=1.02)
    assert won.name == "po"
    won = pooled(readings, 0.995, 0.01)
    assert won.name == "pok" and won.stat.rounds == 112 and won.stat.wins == 77
    assert round(won.stat.ratio, 4) == 0.9885 and won.p < 0.001
    po = [r.ratios(r.ids["po"]) for r in readings]
    wins = sum(x < 1 for rs in po for x in rs)
    assert wins == 72 and 0.001 < sign_test(72, 112) < 0.002  # +PINGPONG=1 alone
