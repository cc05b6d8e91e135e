"""Where sweep work runs: a local process pool, one worker per GPU, or a Ray cluster.

Every executor has one method, ``imap(fn, items)``: it calls the top-level function
``fn(item)`` for every item and yields ``(index, result)`` as results finish (not in
order), so the caller can append each record the moment it exists. ``fn`` must not raise
for a bad config (it returns a failed record); an exception from ``fn`` is a bug and
propagates.

- :class:`LocalExecutor`: a ``ProcessPoolExecutor`` of ``jobs`` processes (fork where
  available: the parent's imports are inherited). For offline compiles.
- :class:`GpuExecutor`: one single-process pool per GPU, each started with
  ``CUDA_VISIBLE_DEVICES`` (and ``HIP_VISIBLE_DEVICES``) set to its device before CUDA is
  initialized (spawned, not forked: a forked CUDA context is unusable). Each GPU runs one
  item at a time, so timings never share a device.
- :class:`RayExecutor`: ``ray.remote`` tasks on the cluster at ``address`` (None: start or
  join a local instance), ``num_gpus`` per task for GPU work. Ray does the scheduling; it
  comes with the ``ray`` extra (``pip install "flashscope[ray]"``).

Local and per-GPU workers die with the sweep (:mod:`flashscope.workers`): a sweep killed
with SIGKILL leaves no worker behind, and Ctrl-C stops the pool without a traceback from
every worker.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable, Iterable, Iterator, Optional

from ..errors import FlashscopeError
from ..workers import init_worker, pool_args, stop_pool

EXECUTORS = ("local", "gpus", "ray")


class SerialExecutor:
    """In-process, in order (one job, or a single item)."""

    def imap(self, fn: Callable, items: list) -> Iterator:
        for i, item in enumerate(items):
            yield i, fn(item)

    def close(self):
        pass


class LocalExecutor:
    """``start``: "fork" (default where available) or "spawn" (needed once this process
    has initialized CUDA)."""

    def __init__(self, jobs: int = 0, start: Optional[str] = None):
        self.jobs = jobs or os.cpu_count() or 1
        self.start = start
        self._pool = None

    def imap(self, fn: Callable, items: list) -> Iterator:
        if self.jobs <= 1 or len(items) <= 1:
            yield from SerialExecutor().imap(fn, items)
            return
        if self._pool is None:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context(self.start or (
                "fork" if "fork" in methods else "spawn"))
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=ctx,
                                             **pool_args())
        futures = {self._pool.submit(fn, item): i for i, item in enumerate(items)}
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    yield futures[f], f.result()
        except BaseException:  # Ctrl-C, a bug in fn, or the consumer gone: stop at once
            stop_pool(self._pool)
            self._pool = None
            raise
        finally:
            for f in futures:
                f.cancel()

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _pin_device(device: str, parent_pid: int) -> None:
    init_worker(parent_pid)
    os.environ["CUDA_VISIBLE_DEVICES"] = device
    os.environ["HIP_VISIBLE_DEVICES"] = device


def visible_devices() -> list:
    """GPU ids this host shows (``CUDA_VISIBLE_DEVICES`` if set, else torch's count)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


class GpuExecutor:
    """One worker process per device id (strings as ``CUDA_VISIBLE_DEVICES`` takes them)."""

    def __init__(self, devices: Optional[Iterable[str]] = None):
        self.devices = [str(d) for d in (visible_devices() if devices is None else devices)]
        if not self.devices:
            raise FlashscopeError("--executor gpus: no GPU visible (CUDA_VISIBLE_DEVICES is "
                                  "empty or torch sees no device); use --executor local")
        ctx = multiprocessing.get_context("spawn")
        self._pools = [ProcessPoolExecutor(max_workers=1, mp_context=ctx,
                                           initializer=_pin_device,
                                           initargs=(d, os.getpid()))
                       for d in self.devices]

    def imap(self, fn: Callable, items: list) -> Iterator:
        queue = list(enumerate(items))[::-1]
        running = {}  # future -> (index, pool)
        free = list(self._pools)
        try:
            while queue or running:
                while queue and free:
                    i, item = queue.pop()
                    pool = free.pop(0)
                    running[pool.submit(fn, item)] = (i, pool)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    i, pool = running.pop(f)
                    free.append(pool)
                    yield i, f.result()
        except BaseException:
            for p in self._pools:
                stop_pool(p)
            self._pools = []
            raise
        finally:
            for f in running:
                f.cancel()

    def close(self):
        for p in self._pools:
            p.shutdown(wait=True, cancel_futures=True)
        self._pools = []


def _call(fn: Callable, item):
    """Ray task body: any picklable callable (builtins included) applied to one item."""
    return fn(item)


class RayExecutor:
    """Tasks on a Ray cluster; ``address`` as ``ray.init`` takes it ("auto", "ray://h:10001",
    "host:6379"), or None to join an instance this process already started, else start
    a local one."""

    def __init__(self, address: Optional[str] = None, num_gpus: float = 0):
        try:
            import ray
        except ImportError:
            raise FlashscopeError("--executor ray: the ray package is not installed "
                                  "(pip install \"flashscope[ray]\")") from None
        self.ray = ray
        self.num_gpus = num_gpus
        if not ray.is_initialized():
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise FlashscopeError(f"--address {address!r}: cannot join a Ray cluster "
                                      f"({str(e).splitlines()[0][:160]})") from None

    def imap(self, fn: Callable, items: list) -> Iterator:
        ray = self.ray
        remote = ray.remote(num_gpus=self.num_gpus, max_retries=1)(_call)
        refs = {remote.remote(fn, item): i for i, item in enumerate(items)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for r in done:
                    yield refs[r], ray.get(r)
        finally:
            for r in pending:
                ray.cancel(r)

    def close(self):
        pass


def make_executor(name: str, *, jobs: int = 0, devices=None, address=None,
                  gpu: bool = False):
    """The executor ``--executor NAME`` selects."""
    if name == "local":
        return LocalExecutor(1 if gpu else jobs)
    if name == "gpus":
        return GpuExecutor(devices)
    if name == "ray":
        return RayExecutor(address, num_gpus=1 if gpu else 0)
    raise FlashscopeError(f"--executor {name!r}: expected one of {', '.join(EXECUTORS)}")
