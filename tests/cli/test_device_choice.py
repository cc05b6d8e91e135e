"""``--device`` left out: the GPU where one is visible, the interpreter otherwise."""

import os

import torch

from flashscope.testing.interpreter import choose_device


def test_no_device_given_picks_a_visible_gpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_device(None) == "cuda"
    assert "TRITON_INTERPRET" not in os.environ  # kernels built afterwards compile


def test_no_device_given_without_a_gpu_runs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_device(None) == "cpu"
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_a_forced_interpreter_wins_over_the_gpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_device(None) == "cpu"
