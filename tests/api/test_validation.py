"""Bad input is rejected at the boundary with an error naming the argument."""

import math

import pytest
import torch

import flashscope
from flashscope import TritonBwdConfig, TritonFwdConfig
from flashscope.errors import FlashscopeError


DEVICE = "cpu"


@pytest.fixture(autouse=True)
def _on_test_device(device):
    """Inputs live on the suite's device (CPU = interpreter), so each check below is the
    one that fires, not the device check."""
    global DEVICE
    DEVICE = "cuda" if device == "cuda" else "cpu"


def qkv(shape=(1, 2, 8, 32), kv_shape=None, dtype=torch.float16, device=None):
    kv_shape = kv_shape or shape
    dev = device or DEVICE
    return tuple(torch.randn(s, device=dev).to(dtype) for s in (shape, kv_shape, kv_shape))


def expect(exc, pattern, *args, **kwargs):
    with pytest.raises(exc, match=pattern):
        flashscope.attention(*args, **kwargs)


def test_not_a_tensor():
    q, k, v = qkv()
    expect(TypeError, "key: expected a torch.Tensor", q, k.tolist(), v)


def test_rank():
    q, k, v = qkv()
    expect(ValueError, r"query: expected rank 4 .*\(rank 3\)", q[0], k, v)


def test_dtype():
    q, k, v = qkv(dtype=torch.float32)
    expect(TypeError, "query: expected dtype float16 or bfloat16, got torch.float32", q, k, v)
    q, k, v = qkv()
    expect(TypeError, "expected one dtype", q, k.bfloat16(), v)


def test_shapes_disagree():
    q, k, v = qkv()
    expect(ValueError, "key, value: expected the same shape", q, k, v[:, :, :4])
    q, k, v = qkv((2, 2, 8, 32), (1, 2, 8, 32))
    expect(ValueError, "key: batch 1 does not match query's batch 2", q, k, v)
    q, k, v = qkv((1, 2, 8, 32), (1, 2, 8, 64))
    expect(ValueError, "head dim 64 does not match query's head dim 32", q, k, v)


def test_gqa_rules():
    q, k, v = qkv((1, 4, 8, 32), (1, 2, 8, 32))
    expect(ValueError, "enable_gqa=True", q, k, v)
    q, k, v = qkv((1, 4, 8, 32), (1, 3, 8, 32))
    expect(ValueError, "3 kv heads must divide query's 4 heads", q, k, v, enable_gqa=True)


def test_head_dim_limits():
    q, k, v = qkv((1, 1, 8, 320))
    expect(ValueError, "head dim 320 is not supported", q, k, v)


@pytest.mark.parametrize("scale", [math.inf, -math.inf, math.nan])
def test_non_finite_scale(scale):
    q, k, v = qkv()
    expect(ValueError, "scale: expected a finite number", q, k, v, scale=scale)


def test_scale_type():
    q, k, v = qkv()
    expect(TypeError, "scale: expected a float", q, k, v, scale="0.1")


def test_config_type_and_limits():
    q, k, v = qkv()
    expect(TypeError, "config: expected a kernel config record", q, k, v,
           config={"BLOCK_M": 64})
    expect(ValueError, "BLOCK_M=48: expected a power of two", q, k, v,
           config=TritonFwdConfig(BLOCK_M=48))
    expect(ValueError, "config: a triton-bwd config is not one of", q, k, v,
           config=TritonBwdConfig())
    with pytest.raises(ValueError, match="config: BLOCK_M expects an integer"):
        TritonFwdConfig(BLOCK_M="64")


def test_cpu_needs_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v = qkv(device="cpu")
    expect(ValueError, "CPU tensors run only under Triton's interpreter", q, k, v)


def test_errors_are_flashscope_errors():
    q, k, v = qkv()
    with pytest.raises(FlashscopeError):
        flashscope.attention(q[0], k, v)
