"""The interleaved timer (flashscope.tune.timer) with fake clocks: the schedule, what a
drifting clock does to raw times and not to ratios, and the host-clock bursts."""

from flashscope.bench.timing import round_orders
from flashscope.tune.rule import round_ratios, stat
from flashscope.tune.timer import WallBursts, interleaved


class DriftingGpu:
    """A fake GPU whose clock slows by 1% a burst; a step's cost is its ``work`` in ms at
    the starting clock. Records the order of bursts."""

    def __init__(self):
        self.clock = 1.0
        self.order = []

    def __call__(self, step, reps):
        name, work = step()
        self.order.append(name)
        ms = work / self.clock
        self.clock *= 0.99
        return ms, (name, reps)


def _steps(works: dict) -> dict:
    return {n: (lambda n=n, w=w: (n, w)) for n, w in works.items()}


def test_every_round_runs_every_step_once_in_the_seeded_order():
    gpu = DriftingGpu()
    times, last = interleaved(_steps({"a": 1.0, "b": 2.0, "c": 3.0}), 5, 7, gpu, seed=3)
    names = ["a", "b", "c"]
    assert gpu.order == [names[i] for order in round_orders(3, 5, 3) for i in order]
    assert {n: len(t) for n, t in times.items()} == {"a": 5, "b": 5, "c": 5}
    assert last == {"a": ("a", 7), "b": ("b", 7), "c": ("c", 7)}


def test_ratios_within_a_round_cancel_the_drift_that_raw_times_carry():
    """The clock loses 30% over the run; b does 0.98 of a's work. Round by round b's ratio
    stays near 0.98 (the drift between two neighbouring bursts is 1%) while the spread of
    raw times is 15 times the effect."""
    gpu = DriftingGpu()
    times, _ = interleaved(_steps({"a": 1.0, "b": 0.98}), 16, 10, gpu)
    s = stat(round_ratios(times, "b", "a"))
    assert 0.965 < s.q1 <= s.ratio <= s.q3 < 0.995 and s.wins == s.rounds == 16
    assert max(times["a"]) / min(times["a"]) > 1.3


def test_log_hears_every_round():
    seen = []
    interleaved(_steps({"a": 1.0}), 3, 1, DriftingGpu(), log=lambda k, n: seen.append((k, n)))
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_wall_bursts_warm_up_once_and_return_the_last_result():
    calls = []

    def step():
        calls.append(len(calls))
        return len(calls)

    ms, out = WallBursts(flush=True, flush_bytes=1 << 10)(step, 4)
    assert len(calls) == 5 and out == 5 and ms >= 0.0
