"""Gates and Spearman's rho, against hand-computed values."""

import math

import pytest

from flashscope.errors import FlashscopeError
from flashscope.profile.gates import DEFAULT_GATES, Gate, evaluate_gates, parse_gate
from flashscope.profile.rank import average_ranks, predictive_power, spearman


def test_parse_gate_accepts_keys_ncu_names_and_percent():
    assert parse_gate("achieved_occupancy>=20") == Gate("achieved_occupancy", ">=", 20.0)
    assert parse_gate(" smsp__warps_eligible.avg.per_cycle_active > 1.5 ") == \
        Gate("eligible_warps", ">", 1.5)
    assert parse_gate("issue_active<=60%") == Gate("issue_active", "<=", 60.0)


@pytest.mark.parametrize("text, msg", [("achieved_occupancy=20", "expected METRIC>=VALUE"),
                                       ("achived_occupancy>=20", "did you mean"),
                                       ("issue_active>=x", "expected METRIC>=VALUE")])
def test_parse_gate_rejects(text, msg):
    with pytest.raises(FlashscopeError, match=msg):
        parse_gate(text)


def test_default_gates_on_cudnn_h100_reading_all_fail():
    row = dict(achieved_occupancy=14.1, eligible_warps=0.55, issue_active=43.9,
               theoretical_occupancy=18.75)
    res = evaluate_gates(row, DEFAULT_GATES)
    assert res["all"] is False and sum(v is False for v in res.values()) == 5


def test_missing_metric_gives_none_not_pass():
    res = evaluate_gates(dict(achieved_occupancy=30.0), (Gate("achieved_occupancy", ">=", 20),
                                                          Gate("issue_active", ">=", 60)))
    assert res["achieved_occupancy>=20"] is True and res["issue_active>=60"] is None
    assert res["all"] is None


def test_average_ranks_ties():
    assert average_ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]


def test_spearman_matches_the_textbook_formula_without_ties():
    x = [1, 2, 3, 4, 5, 6]
    y = [2, 1, 4, 3, 6, 5]
    d2 = sum((a - b) ** 2 for a, b in zip(x, y))
    expect = 1 - 6 * d2 / (6 * (36 - 1))
    rho, n = spearman(x, y)
    assert n == 6 and rho == pytest.approx(expect, abs=1e-12)
    assert spearman(x, [-v for v in y])[0] == pytest.approx(-expect, abs=1e-12)


def test_spearman_drops_missing_and_nan_and_needs_three():
    rho, n = spearman([1, None, 3, math.nan, 5], [1, 2, 3, 4, 5])
    assert n == 3 and rho == pytest.approx(1.0)
    assert spearman([1, 2], [2, 1]) == (None, 2)
    assert spearman([1, 1, 1], [1, 2, 3]) == (None, 3)


def test_predictive_power_of_a_gate_column():
    rows = [dict(achieved_occupancy=a, tflops=t) for a, t in
            [(14, 600), (12, 330), (25, 170), (30, 150)]]
    out = predictive_power(rows, "tflops", ["achieved_occupancy"],
                           [Gate("achieved_occupancy", ">=", 20)])
    assert out[0]["rho"] == pytest.approx(-0.8) and out[0]["n"] == 4
    # pass = [0, 0, 1, 1] (ranks 1.5, 1.5, 3.5, 3.5) against speed ranks 4, 3, 2, 1
    assert out[1]["rho"] == pytest.approx(-0.8944271909999159)
