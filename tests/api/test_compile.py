"""torch.compile sees ``flashscope.attention`` as the custom ops ``flashscope::attention_fwd``
and ``flashscope::attention_bwd``: one graph, no breaks, forward and backward.

On CPU (interpreter) the module compiles with ``backend="aot_eager"``: Dynamo captures the
graph and AOTAutograd traces forward and backward through the fake implementations, then
runs them eagerly. Inductor works on CPU too but takes about 20 s to build its C++ wrapper
code, so it runs in the ``gpu`` set.
"""

import pytest
import torch

import flashscope
from flashscope.api import config_text
from flashscope.families.triton_bwd import TritonBwdConfig


class TinyBlock(torch.nn.Module):
    """Projections around causal GQA attention, inputs (B, N, E)."""

    def __init__(self, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, N, _ = x.shape
        q = self.q(x).view(B, N, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(B, N, 2, self.kv_heads, self.head_dim).unbind(2)
        y = flashscope.attention(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                 enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(B, N, -1))


def _setup(device, dtype=torch.float16, seed=0):
    torch.manual_seed(seed)
    model = TinyBlock().to(device=device, dtype=dtype)
    x = torch.randn(2, 37, 64, device=device, dtype=dtype)
    return model, x


def _run(model, x):
    model.zero_grad(set_to_none=True)
    xg = x.detach().requires_grad_()
    y = model(xg)
    y.float().square().mean().backward()
    return [y.detach(), xg.grad] + [p.grad for p in model.parameters()]


def test_one_graph_no_breaks(device):
    model, x = _setup(device)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    ops = {str(n.target) for g in explained.graphs for n in g.graph.nodes
           if n.op == "call_function"}
    assert "flashscope.attention_fwd.default" in ops, sorted(ops)


def test_compiled_forward_and_backward_match_eager(device):
    model, x = _setup(device)
    eager = _run(model, x)
    torch._dynamo.reset()
    backend = "aot_eager" if device == "cpu" else "inductor"
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    got = _run(compiled, x)
    for i, (a, b) in enumerate(zip(got, eager)):
        assert a is not None and not torch.isnan(a).any(), i
        # Same kernels; only the surrounding linears may be fused or reordered.
        tol = 0 if backend == "aot_eager" else 2e-3
        err = ((a.float() - b.float()).norm() / b.float().norm()).item()
        assert err <= tol, f"tensor {i}: relative difference {err:.2e} from eager"


CHECKS = ("test_schema", "test_faketensor", "test_autograd_registration")


def test_custom_ops_pass_opcheck(device):
    """Schemas, fake implementations (shapes, strides, dtypes) and autograd registration."""
    q, k, v = (torch.randn(1, 4, 9, 16, device=device, dtype=torch.float16)
               .requires_grad_() for _ in range(3))
    fwd_cfg = config_text(flashscope.TritonFwdConfig(32, 16, 4, 1))
    torch.library.opcheck(torch.ops.flashscope.attention_fwd.default,
                          (q, k, v, True, -1, -1, False, 0.0, 0.25, fwd_cfg), test_utils=CHECKS)
    # a window (8 keys to the left), bottom-right alignment and a softcap cross the op
    # boundary too
    torch.library.opcheck(torch.ops.flashscope.attention_fwd.default,
                          (q, k, v, False, 8, 2, True, 30.0, 0.25, fwd_cfg), test_utils=CHECKS)
    out, lse = torch.ops.flashscope.attention_fwd(q, k, v, True, -1, -1, False, 0.0, 0.25,
                                                  fwd_cfg)
    dout = torch.randn_like(out).transpose(1, 2).contiguous().transpose(1, 2)
    bwd_cfg = config_text(TritonBwdConfig(16, 16, 16, 16, 4, 1, PRE_BLOCK=16))
    torch.library.opcheck(torch.ops.flashscope.attention_bwd.default,
                          (dout, q.detach(), k[:, :2].detach(), v[:, :2].detach(),
                           out.detach(), lse, True, -1, -1, False, 0.0, 0.25, bwd_cfg),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
def test_inductor_bf16_training_step(device):
    model, x = _setup(device, torch.bfloat16, seed=1)
    eager = _run(model, x)
    torch._dynamo.reset()
    got = _run(torch.compile(model, fullgraph=True), x)
    for i, (a, b) in enumerate(zip(got, eager)):
        err = ((a.float() - b.float()).norm() / b.float().norm()).item()
        assert err <= 1e-2, f"tensor {i}: relative difference {err:.2e} from eager"
