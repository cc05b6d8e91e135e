import itertools

from flashscope import TritonFwdConfig
from flashscope.sweep.evolve import Evolution, objective
from flashscope.sweep.run import compare_searches, replay_evolve
from flashscope.sweep.space import AXES, Problem, parse_space

P = Problem("sm90", "bfloat16", 256, False)
AX = {"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (16, 32, 64, 128, 256),
      "num_warps": (1, 2, 4, 8), "num_stages": (1, 2, 3, 4), "Q_IN_REGS": (True, False),
      "maxnreg": (None,), "waves_per_eu": (None,)}


def latency(c: TritonFwdConfig) -> float:
    """A bowl with its minimum at 128/64/4w/3s/q1 (all feasible at D=256 on sm90)."""
    return (1.0 + abs(AX["BLOCK_M"].index(c.BLOCK_M) - 3) + abs(
        AX["BLOCK_N"].index(c.BLOCK_N) - 2) * 0.7 + abs(c.num_warps - 4) * 0.1
        + abs(c.num_stages - 3) * 0.3 + (0 if c.Q_IN_REGS else 0.2))


def fake_gpu(calls):
    def evaluate(cfgs):
        calls.extend(cfgs)
        return [{"kind": "gpu", "status": "ok", "ms": latency(c), "config_key": c.key}
                for c in cfgs]
    return evaluate


def feasible_count():
    sp = parse_space({"targets": ["sm90"], "head_dims": [256], "causal": [False],
                      **{k: list(v) for k, v in AX.items()}})
    return len(sp.points()[0])


def test_budget_no_repeats_no_infeasible():
    calls, pruned = [], []
    evo = Evolution(AX, P, seed=1, on_pruned=lambda c, r: pruned.append((c, r)))
    recs = evo.run(fake_gpu(calls), 30, seeds=[TritonFwdConfig(64, 64, 4, 2)])
    assert len(recs) == len(calls) == 30
    assert len(set(calls)) == 30
    assert calls[0] == TritonFwdConfig(64, 64, 4, 2)  # seeds first
    from flashscope.sweep.space import infeasible
    assert all(infeasible(c, P) is None for c in calls)
    assert all(infeasible(c, P) for c, _ in pruned)
    assert len(evo.trace) == 30
    assert all(a >= b for a, b in zip([t[0] for t in evo.trace], [t[0] for t in evo.trace[1:]]))


def test_reproducible_with_seed():
    a, b = [], []
    Evolution(AX, P, seed=7).run(fake_gpu(a), 20, seeds=[TritonFwdConfig(32, 32, 2, 1)])
    Evolution(AX, P, seed=7).run(fake_gpu(b), 20, seeds=[TritonFwdConfig(32, 32, 2, 1)])
    assert a == b


def test_finds_the_bowl_minimum_with_a_fraction_of_the_space():
    n = feasible_count()
    hits = 0
    for seed in range(10):
        evo = Evolution(AX, P, seed=seed)
        evo.run(fake_gpu([]), n // 5, seeds=[TritonFwdConfig(32, 32, 2, 1)])
        hits += evo.best()[1] == TritonFwdConfig(128, 64, 4, 3)
    assert n > 300 and hits >= 7


def test_history_is_free_and_never_reevaluated():
    calls = []
    evo = Evolution(AX, P, seed=0)
    known = [TritonFwdConfig(128, 64, 4, 2), TritonFwdConfig(64, 64, 4, 3)]
    for c in known:
        evo.know(c, (latency(c),))
    evo.run(fake_gpu(calls), 10, seeds=known)
    assert len(calls) == 10 and not set(calls) & set(known)


def test_stops_when_the_space_is_exhausted():
    small = {**{k: (v[0],) for k, v in AX.items()}, "BLOCK_M": (16, 32)}
    calls = []
    Evolution(small, P, seed=0).run(fake_gpu(calls), 50)
    assert sorted(c.BLOCK_M for c in calls) == [16, 32]


def test_failed_scores_none_and_is_no_parent():
    def evaluate(cfgs):
        return [{"kind": "gpu", "status": "failed"} for _ in cfgs]
    evo = Evolution(AX, P, seed=0)
    assert len(evo.run(evaluate, 6)) == 6
    assert evo.best() is None


def test_objective():
    assert objective({"kind": "gpu", "status": "ok", "ms": 2.0}) == (2.0,)
    assert objective({"kind": "gpu", "status": "ok", "ms": float("nan")}) is None
    assert objective({"kind": "gpu", "status": "failed", "ms": 1.0}) is None
    lean = {"kind": "offline", "status": "ok", "occupancy": 0.5, "registers": 90,
            "spill_stores": 0, "spill_loads": 0, "local_bytes": 0}
    spilling = dict(lean, occupancy=1.0, spill_stores=3)
    assert objective(lean) < objective(spilling)
    serial = dict(lean, occupancy=1.0, wgmma_serialized=32)
    assert objective(lean) < objective(serial) < objective(dict(spilling, wgmma_serialized=8))
    assert objective(dict(lean, occupancy=0.75)) < objective(lean)


def _table():
    recs = []
    for vals in itertools.product(*(AX[k] for k in AXES)):
        c = TritonFwdConfig(**dict(zip(AXES, vals)))
        if c.BLOCK_N == 256 and c.num_stages == 4:
            continue
        recs.append({"kind": "gpu", "status": "ok", "ms": latency(c), "config_key": c.key,
                     "config": c.as_dict(), "target": "sm90", "dtype": "bfloat16",
                     "head_dim": 256, "causal": False, "shape": "1,8,1024,256"})
    return recs


def test_compare_and_replay():
    table = _table()
    picked = [r for r in table if r["config"]["BLOCK_M"] == 128][:40]
    rows = compare_searches(table, picked)
    assert len(rows) == 1
    r = rows[0]
    assert r["exhaustive_best"] == TritonFwdConfig(128, 64, 4, 3).key
    assert r["fraction_of_evaluations"] == round(40 / len(table), 3)
    assert r["evolve_choice_rank"] >= 1 and r["evolve_choice_over_optimum"] >= 1.0
    rep = replay_evolve(table, budget=len(table) // 4, trials=5)
    assert rep[0]["trials"] == 5 and rep[0]["ratio_worst"] >= 1.0
    assert rep[0]["found_optimum"] >= 3
