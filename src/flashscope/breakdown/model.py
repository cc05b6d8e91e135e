"""A pre-LayerNorm transformer with random weights, for timing (no training, no tokenizer).

Each layer: x + Wo(attn(LN(x) Wqkv)), then x + W2(gelu(W1 LN(x))). Shapes: x (B, N, W);
heads h with head dim W / h; attention on (B, h, N, W/h) through either SDPA or
``flashscope.attention`` (same semantics, swapped by name). Built on the caller's device
and dtype; weights drawn by PyTorch's default initializers under a fixed seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import FlashscopeError, lookup


@dataclass(frozen=True)
class ModelSpec:
    layers: int
    width: int
    heads: int
    seq: int
    batch: int
    ffn: int  # hidden width of the MLP
    causal: bool = False
    note: str = ""

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def check(self) -> "ModelSpec":
        for k in ("layers", "width", "heads", "seq", "batch", "ffn"):
            if getattr(self, k) < 1:
                raise FlashscopeError(f"--{k}: expected a positive integer, got {getattr(self, k)}")
        if self.width % self.heads:
            raise FlashscopeError(f"--width {self.width} is not divisible by --heads {self.heads}")
        return self


PRESETS = {
    # The founding rocprofv3 study: lc0 network 768x15x24h (15 encoder layers, width 768,
    # 24 heads of 32) over 64 positions, batch 192 (3 batches x 64 positions in the study).
    # The study does not state the FFN width; 1024 is lc0's BT4-series encoder dff.
    "lc0-encoder": ModelSpec(15, 768, 24, 64, 192, 1024, False,
                             "rocprofv3 study model 768x15x24h; FFN width 1024 assumed"),
    # A decoder at long context: 8 layers of a 2048-wide, 16-head (D = 128) causal model,
    # one sequence of 8192 tokens (a prefill).
    "decoder-long": ModelSpec(8, 2048, 16, 8192, 1, 8192, True,
                              "causal prefill, D = 128, 8k context"),
}


def get_preset(name: str) -> ModelSpec:
    return lookup(PRESETS, name, "--preset")


def with_overrides(spec: ModelSpec, **kw) -> ModelSpec:
    return replace(spec, **{k: v for k, v in kw.items() if v is not None}).check()


def build(spec: ModelSpec, attention: str = "sdpa", device="cpu", dtype=None, seed: int = 0):
    """The model as an ``nn.Module`` taking x (B, N, W)."""
    import torch
    from torch import nn

    if attention not in ("sdpa", "flashscope"):
        raise FlashscopeError(f"--attention {attention!r}: expected sdpa or flashscope")
    torch.manual_seed(seed)

    def attend(q, k, v):
        if attention == "flashscope":
            import flashscope

            with torch.profiler.record_function("flashscope::attention"):
                return flashscope.attention(q, k, v, is_causal=spec.causal)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=spec.causal)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(spec.width), nn.LayerNorm(spec.width)
            self.qkv = nn.Linear(spec.width, 3 * spec.width)
            self.out = nn.Linear(spec.width, spec.width)
            self.fc1 = nn.Linear(spec.width, spec.ffn)
            self.fc2 = nn.Linear(spec.ffn, spec.width)

        def forward(self, x):
            B, N, W = x.shape
            q, k, v = (self.qkv(self.ln1(x)).view(B, N, 3, spec.heads, spec.head_dim)
                       .permute(2, 0, 3, 1, 4))
            a = attend(q, k, v).transpose(1, 2).reshape(B, N, W)
            x = x + self.out(a)
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    model = nn.Sequential(*[Layer() for _ in range(spec.layers)])
    return model.to(device=device, dtype=dtype).eval()
