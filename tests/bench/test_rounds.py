"""Timer.rounds: providers of a case timed in interleaved rounds of shuffled order, each
ms the median of its rounds, and every extra timed call checked too; the round orders
themselves (:func:`flashscope.bench.timing.round_orders`)."""

import statistics

import pytest
import torch

from flashscope.bench.harness import run_bench
from flashscope.bench.providers import provider
from flashscope.bench.suite import Case
from flashscope.bench.timing import Timer, round_orders

from .test_cheats import honest

CASE = Case(1, 2, 40, 40, 16, 2, causal=False, dtype="float16")


def _registry(calls, late_cheat_after=None):
    reg = {}

    def tracked(name):
        def build(case, opts):
            fn = honest(case)

            def run(q, k, v):
                calls.append(name)
                if late_cheat_after is not None and name == "late" and \
                        len([c for c in calls if c == name]) > late_cheat_after:
                    return torch.zeros_like(q)
                return fn(q, k, v)
            return run
        return build

    for name in ("a", "b", "late"):
        provider(name, description=name, registry=reg)(tracked(name))
    return reg


def test_rounds_interleave_and_take_the_median():
    calls = []
    reg = _registry(calls)
    res, _ = run_bench([CASE], list(reg.values()), device="cpu", odd_shapes=False,
                       timer=Timer(device="cpu", cpu_reps=1, rounds=3), baseline="a")
    got = {r.provider: r for r in res}
    for r in got.values():
        assert r.status == "ok", r.reason
        assert len(r.ms_rounds) == 3
        assert r.ms == pytest.approx(statistics.median(r.ms_rounds))
        assert r.tflops > 0
    # the timed calls of rounds 2 and 3 (one per round and provider with cpu_reps=1),
    # after each provider's validation calls and first timing, in round_orders' order
    names = ["a", "b", "late"]
    assert calls[-6:] == [names[i] for order in round_orders(3, 2) for i in order]


def test_a_cheat_in_a_later_round_fails_the_case():
    calls = []
    # each provider's first round makes 3 calls (2 validation inputs, 1 timed); the cheat
    # starts on the second round
    reg = _registry(calls, late_cheat_after=3)
    res, _ = run_bench([CASE], list(reg.values()), device="cpu", odd_shapes=False,
                       timer=Timer(device="cpu", cpu_reps=1, rounds=2), baseline="a")
    got = {r.provider: r for r in res}
    assert got["a"].status == "ok" and got["b"].status == "ok"
    late = got["late"]
    assert late.status == "failed" and "round 2" in late.reason, late.reason
    assert late.ms is None and late.tflops is None and late.speedup is None


def test_one_round_keeps_one_timing():
    calls = []
    res, _ = run_bench([CASE], list(_registry(calls).values()), device="cpu",
                       odd_shapes=False, timer=Timer(device="cpu", cpu_reps=1))
    assert all(len(r.ms_rounds) == 1 and r.ms == r.ms_rounds[0] for r in res)


def test_markdown_gives_the_per_round_ratio_to_the_faster_peer():
    """With rounds, bench.md adds flashscope's time against the faster of cuDNN and FA4
    within each round (median and range): drift between rounds cancels there, where the
    ratio of two medians keeps it."""
    from flashscope.bench.harness import Result
    from flashscope.bench.output import markdown, round_ratios

    def res(name, rounds):
        return Result(name, CASE, "ok", ms=statistics.median(rounds), tflops=1 / rounds[1],
                      ms_rounds=rounds)

    fs = res("flashscope", [1.0, 2.0, 1.0])
    cudnn = res("sdpa-cudnn", [1.1, 1.9, 1.2])   # the faster peer in round 2
    fa4 = res("fa4", [0.9, 2.4, 1.5])            # ... in round 1
    # rounds: 0.9 / 1.0, 1.9 / 2.0, 1.2 / 1.0
    assert round_ratios(fs, [cudnn, fa4]) == pytest.approx((0.95, 0.9, 1.2))
    assert round_ratios(fs, [res("fa4", [1.0, 1.0])]) is None  # rounds differ
    assert round_ratios(fs, [Result("fa4", CASE, "failed")]) is None
    text = markdown([fs, cudnn, fa4], {"date": "d", "device": "x", "command": "c"})
    head, sep, row = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert head.endswith("| flashscope / faster peer, per round: median (range) |")
    assert row.endswith("| 0.950 (0.900-1.200) |")
    single = [Result(r.provider, CASE, "ok", ms=r.ms, tflops=r.tflops, ms_rounds=[r.ms])
              for r in (fs, cudnn, fa4)]
    assert "per round" not in markdown(single, {})


def _top_share(orders):
    """The largest share of one provider's turns that follow one same provider."""
    seq = [i for order in orders for i in order]
    counts = {}
    for a, b in zip(seq, seq[1:]):
        counts.setdefault(b, {}).setdefault(a, 0)
        counts[b][a] += 1
    return max(max(c.values()) / sum(c.values()) for c in counts.values())


def test_round_orders_are_permutations_and_repeatable():
    for order in round_orders(5, 30):
        assert sorted(order) == list(range(5))
    assert round_orders(4, 10) == round_orders(4, 10)
    assert round_orders(4, 10, seed=1) != round_orders(4, 10)


def test_no_provider_mostly_follows_the_same_one():
    # a rotation (d f v n, f v n d, ...) put v right after f in 3 rounds of 4
    rotated = [list(range(4))[r % 4:] + list(range(4))[:r % 4] for r in range(40)]
    assert _top_share(rotated) >= 0.75
    for n in (3, 4, 6):
        assert _top_share(round_orders(n, 40)) < 0.6


def test_host_bound_readings_are_marked():
    """A result whose host took at least half as long to queue a call as its events
    measured is marked host-bound (field, table note, a starred cell in bench.md), after
    every round; one queued faster is not; timers that keep the host out never mark."""
    from flashscope.bench import output
    from flashscope.bench.timing import host_bound

    assert host_bound(80.0, 0.066, Timer()) is True
    assert host_bound(422.0, 0.548, Timer()) is True   # 0.77 of the events: 11% the host's
    assert host_bound(80.0, 0.16, Timer()) is True
    assert host_bound(80.0, 0.161, Timer()) is False
    assert host_bound(None, 0.05, Timer()) is None
    assert host_bound(80.0, 0.05, Timer(cuda_graph=True)) is None
    assert host_bound(80.0, 0.05, Timer(hide_host=True)) is None

    class Queued(Timer):  # the host time a GPU timer would report
        host = 0.0

        def host_us(self, step, calls=50):
            return self.host

    for host, marked in ((1e9, True), (0.0, False)):
        timer = Queued(device="cpu", cpu_reps=1, rounds=2)
        timer.host = host
        res, _ = run_bench([CASE], list(_registry([]).values()), device="cpu",
                           odd_shapes=False, timer=timer, baseline="a")
        for r in res:
            assert r.status == "ok" and r.host_bound is marked
            assert r.reason == "" and output.reason(r).startswith("host-bound?") is marked
        md = output.markdown(res, {"date": "d", "device": "cpu"}, subject="a")
        assert ("* host-bound" in md) is marked and ("*|" in md.replace(" ", "")) is marked


def test_a_lost_gpu_context_stops_the_run_and_names_where():
    """An error after which the GPU no longer answers (simulated: the device's answer to
    the runner's check after provider "crash" failed) ends the run there: the
    failing result says so, and every later one, in this case and the next, is not run
    and names the provider and shape that lost it; results timed before keep their
    numbers. An error that leaves the context sound stops nothing."""
    from flashscope.bench.harness import LOST_HERE, _Runner
    from flashscope.bench.providers import provider

    def broken(case, opts):
        def run(q, k, v):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return run

    for fatal in (True, False):
        reg = {}
        calls = []
        base = _registry(calls)
        for name in ("a", "crash", "b"):
            if name == "crash":
                provider(name, description=name, registry=reg)(broken)
            else:
                reg[name] = base[name if name == "a" else "b"]

        class Runner(_Runner):
            def _unanswered(self):  # the device's answer after an error
                return "AcceleratorError: illegal memory access" if fatal else ""

        second = Case(1, 2, 24, 24, 16, 2, causal=True, dtype="float16")
        res, _ = run_bench([CASE, second], list(reg.values()), device="cpu",
                           odd_shapes=False, timer=Timer(device="cpu", cpu_reps=1, rounds=2),
                           baseline="a", runner=Runner)
        got = {(r.provider, r.case.causal): r for r in res}
        assert got[("a", False)].status == "ok" and len(got[("a", False)].ms_rounds) >= 1
        crash = got[("crash", False)]
        assert crash.status == "error" and "illegal memory access" in crash.reason
        assert crash.reason.endswith(LOST_HERE) == fatal
        later = [got[("b", False)], got[("a", True)], got[("crash", True)], got[("b", True)]]
        if fatal:
            for r in later:
                assert r.status == "error" and r.ms is None
                assert r.reason == ("not run: the GPU context was lost at crash "
                                    f"{CASE.shape} (AcceleratorError: illegal memory access)")
        else:
            assert [r.status for r in later] == ["ok", "ok", "error", "ok"]
