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
