"""The interleaved A/B timer: bursts of launches, variants taking turns round after round.

A GPU's clock follows its power and temperature, so one kernel reads several percent
apart between passes a few seconds apart (on an H100, -11% to +16% between two identical
configs timed one after the other). Here every variant runs a *burst* (one untimed
warm-up launch, then ``reps`` timed launches), the variants take turns burst by burst,
and this repeats for ``rounds`` rounds, so all of them sample the same drift. Each
round's order is a fresh seeded permutation (:func:`flashscope.bench.timing.round_orders`),
so no variant always follows the same one (the clock also follows the previous burst's
power). What a variant is compared by is the ratio of its time to the first variant's in
the same round (:mod:`.rule`).

With the L2 flush (the default), every launch is preceded by zeroing a buffer larger than
the L2 (:func:`flashscope.bench.timing.flush_buffer`), as the bench harness's timer does, so
each launch starts with cold inputs, as in a model; each launch then has CUDA events of
its own and the flush stays outside them. Without it, one pair of events spans the burst.

:func:`interleaved` is the schedule, independent of the clock: ``burst(step, reps)``
returns (milliseconds per launch, the last launch's result). :class:`CudaBursts` is the
GPU clock; :class:`WallBursts` times with the host's clock (Triton's interpreter, tests).
"""

from __future__ import annotations

import time
from typing import Callable

from ..bench.timing import flush_buffer, round_orders


def interleaved(steps: dict, rounds: int, reps: int, burst: Callable, seed: int = 0,
                log: "Callable | None" = None) -> tuple:
    """({name: [ms per launch, one per round]}, {name: the result of its last launch}):
    every round runs each step's burst once, in that round's order."""
    names = list(steps)
    times = {n: [] for n in names}
    last = {}
    for k, order in enumerate(round_orders(len(names), rounds, seed), 1):
        for i in order:
            ms, last[names[i]] = burst(steps[names[i]], reps)
            times[names[i]].append(ms)
        if log:
            log(k, rounds)
    return times, last


class WallBursts:
    """Bursts timed with the host's clock (``time.perf_counter``); ``flush`` zeroes a
    buffer of ``flush_bytes`` before each launch, outside the timing."""

    def __init__(self, flush: bool = False, flush_bytes: int = 1 << 20):
        self.buffer = bytearray(flush_bytes) if flush else None
        self.zeros = bytes(flush_bytes) if flush else None

    def __call__(self, step: Callable, reps: int) -> tuple:
        step()
        total, out = 0.0, None
        for _ in range(reps):
            if self.buffer is not None:
                self.buffer[:] = self.zeros
            t0 = time.perf_counter()
            out = step()
            total += time.perf_counter() - t0
        return total * 1e3 / reps, out


class CudaBursts:  # pragma: no cover - needs a GPU; the schedule is tested with fakes
    """Bursts timed with CUDA events on ``device`` (module docstring)."""

    def __init__(self, device, flush: bool = True):
        import torch

        self.torch = torch
        self.buffer = flush_buffer(device) if flush else None

    def __call__(self, step: Callable, reps: int) -> tuple:
        cuda = self.torch.cuda
        step()
        if self.buffer is None:
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                out = step()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / reps, out
        events = [(cuda.Event(enable_timing=True), cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            self.buffer.zero_()
            start.record()
            out = step()
            end.record()
        events[-1][1].synchronize()
        return sum(s.elapsed_time(e) for s, e in events) / reps, out
