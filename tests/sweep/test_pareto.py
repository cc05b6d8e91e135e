import math

import pytest

from flashscope.sweep.pareto import FRONTS, dominates, pareto_front


def rec(key, regs, occ, ms=None, status="ok"):
    return {"config_key": key, "registers": regs, "occupancy": occ, "ms": ms,
            "status": status}


def test_dominates_needs_one_strict():
    assert dominates((1, 1), (1, 2))
    assert not dominates((1, 1), (1, 1))
    assert not dominates((1, 3), (2, 1))


def test_offline_front_min_registers_max_occupancy():
    recs = [rec("a", 64, 0.5), rec("b", 96, 0.5), rec("c", 128, 0.75), rec("d", 128, 0.25),
            rec("e", 32, 0.25), rec("f", 64, 0.5)]
    front = pareto_front(recs, FRONTS["offline"])
    assert [r["config_key"] for r in front] == ["e", "a", "f", "c"]  # ties both kept


def test_nan_missing_and_failed_are_left_out():
    recs = [rec("nan", 10, math.nan), rec("none", None, 0.9), rec("bad", 1, 1.0, status="failed"),
            rec("ok", 100, 0.1)]
    assert [r["config_key"] for r in pareto_front(recs, FRONTS["offline"])] == ["ok"]


def test_gpu_fronts():
    recs = [rec("fast", 200, 0.25, ms=1.0), rec("lean", 96, 0.5, ms=2.0),
            rec("slow", 200, 0.25, ms=3.0)]
    assert [r["config_key"] for r in pareto_front(recs, FRONTS["gpu_registers"])] == [
        "fast", "lean"]
    assert [r["config_key"] for r in pareto_front(recs, FRONTS["gpu_occupancy"])] == [
        "fast", "lean"]


def test_bad_sense():
    with pytest.raises(ValueError):
        pareto_front([], (("ms", "lowest"),))
