"""Input factories for tests and checks: fresh random inputs on a device, with the seed
recorded so a failure can be replayed."""

from __future__ import annotations

import secrets

import torch


def fresh_seed() -> int:
    seed = secrets.randbits(31)
    torch.manual_seed(seed)
    return seed


def make_qkv(device, B, H, Nq, Nk, D, *, Hkv=None, dtype=torch.float16, bnhd=False,
             scale_inputs=1.0):
    """q (B, H, Nq, D), k/v (B, Hkv, Nk, D). With ``bnhd`` the tensors are stored
    (B, N, H, D) and returned as ``.transpose(1, 2)`` views (non-contiguous)."""
    Hkv = Hkv or H
    dev = "cuda" if device == "cuda" else "cpu"

    def one(h, n):
        if bnhd:
            t = torch.randn(B, n, h, D, device=dev, dtype=torch.float32) * scale_inputs
            return t.to(dtype).transpose(1, 2)
        return (torch.randn(B, h, n, D, device=dev, dtype=torch.float32) * scale_inputs).to(dtype)

    return one(H, Nq), one(Hkv, Nk), one(Hkv, Nk)
