"""CUDA-graph capture of flashscope's launches (GPU): a model that calls attention on short
rows removes the host time with a graph, so the forward and the backward of each kernel
family must capture, replay on new inputs copied into the captured buffers, and match the
float64 reference after every replay."""

import pytest
import torch

import flashscope
from flashscope import TritonFwdConfig
from flashscope.testing.reference import (ERROR_BOUND, reference_attention,
                                          reference_attention_grads, rel_error)

pytestmark = pytest.mark.gpu

# (B, H, N, D): a ViT-B/16-like short row, odd length; the default family of the device
# and the portable kernel
SHAPE = (4, 6, 197, 64)
CONFIGS = {"default": None, "triton-fwd": TritonFwdConfig(64, 64, 4, 2)}


def _inputs(grad: bool, hkv: int = SHAPE[1]):
    B, H, N, D = SHAPE
    q, k, v = (torch.randn(B, N, h, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
               .requires_grad_(grad) for h in (H, hkv, hkv))
    return q, k, v


def _warm(fn, stream):
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_captures_and_replays(name):
    cfg = CONFIGS[name]
    q, k, v = _inputs(False)
    fn = lambda: flashscope.attention(q, k, v, config=cfg)  # noqa: E731
    _warm(fn, torch.cuda.Stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    for _ in range(3):  # new inputs in the captured buffers, then one replay
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        assert rel_error(out, reference_attention(q, k, v)) <= ERROR_BOUND[q.dtype]


# GQA's causal backward runs its two passes on two streams, both captured; without a mask
# they run in turn
@pytest.mark.parametrize("hkv,causal", [(SHAPE[1], False), (2, False), (2, True)],
                         ids=["mha", "gqa", "gqa-causal"])
@pytest.mark.parametrize("name", CONFIGS)
def test_backward_captures_and_replays(name, hkv, causal):
    cfg = CONFIGS[name]
    q, k, v = _inputs(True, hkv)
    dout = torch.randn_like(q.detach())

    def step():
        out = flashscope.attention(q, k, v, is_causal=causal, config=cfg,
                                   enable_gqa=hkv != SHAPE[1])
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    _warm(step, torch.cuda.Stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = step()
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
        g.replay()
        torch.cuda.synchronize()
        ref = reference_attention_grads(q.detach(), k.detach(), v.detach(), dout,
                                        is_causal=causal)
        bound = 2 * ERROR_BOUND[q.dtype]
        for a, b in zip(got, ref):
            assert not torch.isnan(a).any() and rel_error(a, b) <= bound
