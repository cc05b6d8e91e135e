"""Timers: median milliseconds of a step, and the step's peak extra memory.

On a GPU, :func:`triton.testing.do_bench` with ``return_mode="median"``: before every call it
zeroes a 256 MB buffer, which evicts the inputs from L2 (50 MB on an H100), so each call
starts cold, as in a model. ``cuda_graph=True`` uses ``do_bench_cudagraph`` instead (launch
overhead removed; the L2 is then not flushed between calls). ``hide_host=True`` flushes the
L2 the same way and then keeps the GPU busy (a spin) while the host queues the call, so the
events around it time the GPU only: where a call takes the host longer to queue than the GPU
to run (a decoding step on a small batch: 12 us of kernels behind 75-105 us of Python on an
H100 host), do_bench's events time the host. On a CPU (tests), a plain
median of ``time.perf_counter`` over a few calls. Every timer records the result of the
last call in ``last`` so the harness can validate it.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass
class Timer:
    """``time(step) -> ms`` and ``last``: the result of the final timed call."""
    device: str = "cpu"
    cuda_graph: bool = False
    hide_host: bool = False
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    cpu_reps: int = 5
    rounds: int = 1
    last: Optional[tuple] = field(default=None, repr=False)

    def time(self, step: Callable) -> float:
        holder = {}

        def call():
            holder["result"] = step()

        if self.device == "cuda":
            import triton.testing

            if self.cuda_graph:
                ms = triton.testing.do_bench_cudagraph(call, rep=self.rep_ms,
                                                       return_mode="median")
            elif self.hide_host:
                ms = gpu_time(call, warmup_ms=self.warmup_ms, rep_ms=self.rep_ms)
            else:
                ms = triton.testing.do_bench(call, warmup=self.warmup_ms, rep=self.rep_ms,
                                             return_mode="median")
            import torch

            torch.cuda.synchronize()
        else:
            samples = []
            for _ in range(self.cpu_reps):
                t0 = time.perf_counter()
                call()
                samples.append((time.perf_counter() - t0) * 1e3)
            ms = statistics.median(samples)
        self.last = holder["result"]
        return float(ms)

    def host_us(self, step: Callable, calls: int = 50) -> Optional[float]:
        """Microseconds of host time per call on a GPU: ``calls`` calls queued back to
        back, timed up to the return of the last (the GPU is synchronized before and
        after, not between). When it exceeds the GPU time of the call, the GPU waits for
        the host and a timer that does not replay a CUDA graph measures the host. None on
        a CPU, where the two are one."""
        if self.device != "cuda":
            return None
        import torch

        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        host = time.perf_counter() - t0
        torch.cuda.synchronize()
        return host / calls * 1e6


#: The share of the measured time a call's host time may reach before the reading is
#: marked: the GPU waits behind the host long before the host's whole time reaches the
#: kernels' where a call launches late in its Python (a backward launches after the
#: autograd engine's share). A flashscope backward at ViT-L/14's shape (32x16x577, D 64,
#: H200, 2026-11-29) queued in 422 us, 0.77 of the 548 us measured, and ran 489 us on the
#: GPU alone: 11% of the reading was the host's; cuDNN's at ViT-B/16 queued in 0.74 of
#: its 162 us and read the same on the GPU alone. A mark says "may".
HOST_SHARE = 0.5


def host_bound(host_us: Optional[float], ms: Optional[float], timer: Timer) -> Optional[bool]:
    """Whether do_bench's events may have timed the host rather than the GPU: queuing one
    call took the host (``host_us``, :meth:`Timer.host_us`) at least :data:`HOST_SHARE`
    of the time the events measured (``ms``). Then the GPU may have finished the flush
    and waited for the launches, and part of the time is the host's, not the kernel's
    (a ViT-B/16 forward on an H100: 46 us on the GPU, 66 us measured behind 81 us of host
    time). None where either is unknown or the timer keeps the host out (a CUDA graph's
    replay, ``hide_host``)."""
    if host_us is None or ms is None or timer.cuda_graph or timer.hide_host:
        return None
    return host_us >= HOST_SHARE * 1e3 * ms


#: most timed calls of one :func:`gpu_time`
MAX_REPS = 1000


def gpu_time(call: Callable, *, warmup_ms: float = 25.0, rep_ms: float = 100.0) -> float:
    """Median GPU milliseconds of ``call`` with a cold L2 and the host out of the timing:
    before each call the L2 is flushed and the GPU spins for twice the host time a call
    takes to queue (measured here), so that the call's launches are queued before the
    start event runs and the interval between the events holds the GPU's work only."""
    import torch

    flush = flush_buffer("cuda")
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 0
    while n < 3 or (time.perf_counter() - t0) * 1e3 < warmup_ms / 5:
        call()
        n += 1
    host_ms = (time.perf_counter() - t0) * 1e3 / n
    torch.cuda.synchronize()
    spin = int(_cycles_per_ms() * (2 * host_ms + 0.02))

    def before():
        flush.zero_()
        torch.cuda._sleep(spin)

    est = _events(before, call, 3)
    reps = max(5, min(MAX_REPS, int(rep_ms / max(statistics.median(est), 1e-3))))
    times = _events(before, call, reps)
    return float(statistics.median(times))


def _events(before: Callable, call: Callable, reps: int) -> list:
    """Milliseconds between events around each of ``reps`` calls, ``before()`` queued
    ahead of each."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        before()
        s.record()
        call()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


_CYCLES: dict = {}


def _cycles_per_ms() -> float:
    """Clock cycles of ``torch.cuda._sleep`` per millisecond on the current device,
    measured once per device."""
    import torch

    index = torch.cuda.current_device()
    if index not in _CYCLES:
        n = 2_000_000
        torch.cuda._sleep(n)  # the first call loads the kernel
        ms = statistics.median(_events(lambda: None, lambda: torch.cuda._sleep(n), 5))
        _CYCLES[index] = n / max(ms, 1e-3)
    return _CYCLES[index]


def peak_memory_mib(step: Callable, device: str) -> Optional[float]:
    """MiB allocated at the peak of one call beyond what was live before it (GPU only)."""
    if device != "cuda":
        return None
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return peak / 2 ** 20


#: Bytes zeroed before a launch to evict its inputs from the L2: what Triton's do_bench
#: zeroes (256 MB, five times an H100's 50 MB), or four times a larger L2.
FLUSH_BYTES = 256 << 20


def flush_buffer(device):
    """A buffer on a CUDA ``device`` whose ``zero_()`` evicts the L2 (:data:`FLUSH_BYTES`,
    or four times the device's L2 where that is more)."""
    import torch

    from ..launch import l2_bytes

    dev = torch.device(device)
    return torch.empty(max(FLUSH_BYTES, 4 * l2_bytes(dev)), dtype=torch.int8, device=dev)


def round_orders(n: int, rounds: int, seed: int = 0) -> list:
    """The order of n providers in each of ``rounds`` interleaved rounds: a fresh
    permutation per round (seeded, so a run is repeatable), so that no provider mostly
    runs right after the same one. A GPU's clock follows the power of the burst before:
    in a rotation (d f v n, f v n d, ...) the variant after FlashAttention-4 ran right
    after it in three rounds of four and read 1.4% slower against the same config than
    when timed without it."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(range(n))
        rng.shuffle(order)
        orders.append(order)
    return orders
