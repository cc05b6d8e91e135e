import math
import os

import pytest

from flashscope.errors import FlashscopeError
from flashscope.sweep.executors import GpuExecutor, LocalExecutor, make_executor


def test_local_pool_returns_every_item_once():
    ex = LocalExecutor(2)
    try:
        got = dict(ex.imap(math.sqrt, [0.0, 1.0, 4.0, 9.0, 16.0]))
    finally:
        ex.close()
    assert got == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}


def test_one_worker_per_gpu_pins_its_device():
    ex = GpuExecutor(["3", "5"])
    try:
        got = dict(ex.imap(os.getenv, ["CUDA_VISIBLE_DEVICES"] * 6))
        hip = dict(ex.imap(os.getenv, ["HIP_VISIBLE_DEVICES"] * 2))
    finally:
        ex.close()
    assert sorted(got) == list(range(6))
    assert set(got.values()) == {"3", "5"}
    assert set(hip.values()) <= {"3", "5"}


def test_no_gpu_is_an_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(FlashscopeError, match="no GPU visible"):
        GpuExecutor()


def test_unknown_executor():
    with pytest.raises(FlashscopeError, match="expected one of local, gpus, ray"):
        make_executor("slurm")


def _nap(x):
    import time

    time.sleep(30)
    return x


def test_a_stopped_pool_leaves_no_manager_thread_or_worker():
    """Stopping a pool with work in flight (Ctrl-C in a sweep) terminates its workers and
    joins its manager thread: one still running at exit may close its wake-up pipe while
    Python's exit hook writes to it, and the interrupted sweep then prints a traceback
    after its one line."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from flashscope.workers import stop_pool

    pool = ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork"))
    futures = [pool.submit(_nap, i) for i in range(4)]
    assert pool._processes  # forked workers start with the first submission
    manager, workers = pool._executor_manager_thread, list(pool._processes.values())
    stop_pool(pool)
    assert not manager.is_alive()
    assert not any(p.is_alive() for p in workers)
    assert all(f.done() for f in futures)
