"""The attention reference every correctness check is measured against.

``reference_attention`` computes softmax(Q K^T * scale [+ causal mask]) V in float64 (or
float32 when asked) on the inputs' own device, in plain torch, so it shares no code with any
kernel under test. Shapes: q (B, H, Nq, D), k/v (B, Hkv, Nk, D) with H % Hkv == 0 (GQA: each
group of H/Hkv query heads reads one kv head, ``repeat_interleave`` order, as SDPA's
``enable_gqa``). Masks are written here from their definition, apart from the kernels':
query i sits at position p_i = i (``align="top_left"``, SDPA's ``is_causal``) or
i + Nk - Nq (``"bottom_right"``, FlashAttention's) and sees key j when j <= p_i (causal) and
p_i - left <= j <= p_i + right (``window=(left, right)``, None or negative: unbounded). A
row that sees no key is zero (FlashAttention's convention). Rows are processed in chunks so
the score block stays under ~1 GiB.

``rel_error(out, ref) = max|out - ref| / max|ref|``: the worst element's error in units of
the output's scale. The max (not a norm ratio) is deliberate: a bug confined to one row or
one partial tile moves the max but vanishes in a norm over millions of elements.

``ERROR_BOUND`` per dtype, against this metric. Measured with a flash-style emulation
(fp32 scores, P rounded to the input dtype, fp32 accumulation, output rounded) on unit-normal
inputs, N = 17..4096, D = 64/128, causal or not: fp16 at most 4.0e-4, bf16 at most 3.5e-3
(the output rounding alone is 2^-11 resp. 2^-8 of an element). The bounds leave ~5x headroom
and still fail real bugs: a causal off-by-one is ~0.3, one key dropped from a 257-long row
is ~2e-2 (see tests/bench/test_reference.py).
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Optional

import torch

from ..errors import FlashscopeError

ERROR_BOUND = MappingProxyType({
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.float32: 1e-5,
})

_CHUNK_BYTES = 1 << 30


def _hidden(r0: int, r1: int, n_q: int, n_k: int, is_causal: bool, window, align: str,
            device) -> "torch.Tensor | None":
    """(r1 - r0, n_k) bool: the keys rows r0..r1 do not see, or None when they see all."""
    left, right = window if window is not None else (None, None)
    left = None if left is None or left < 0 else left
    right = None if right is None or right < 0 else right
    if is_causal:
        right = 0 if right is None else min(right, 0)
    if left is None and right is None:
        return None
    pos = torch.arange(r0, r1, device=device)[:, None]
    if align == "bottom_right":
        pos = pos + (n_k - n_q)
    cols = torch.arange(n_k, device=device)[None, :]
    hidden = torch.zeros(r1 - r0, n_k, dtype=torch.bool, device=device)
    if right is not None:
        hidden |= cols > pos + right
    if left is not None:
        hidden |= cols < pos - left
    return hidden


def _softmax(s: torch.Tensor, hidden) -> torch.Tensor:
    if hidden is None:
        return torch.softmax(s, dim=-1)
    p = torch.softmax(s.masked_fill(hidden, float("-inf")), dim=-1)
    return p.masked_fill(hidden.all(-1, keepdim=True), 0.0)  # rows that see no key


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        is_causal: bool = False, scale: Optional[float] = None,
                        compute_dtype: torch.dtype = torch.float64, window=None,
                        align: str = "top_left", softcap=None,
                        row_range: Optional[tuple] = None) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v in ``compute_dtype`` (float64 by default), shape
    (B, H, Nq, D), on q's device. ``scale`` defaults to 1/sqrt(D). ``row_range=(a, b)``:
    query rows a..b-1 only, shape (B, H, b - a, D), masked as rows of the whole problem."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise FlashscopeError(f"q, k, v: expected rank-4 (B, H, N, D) tensors, got shapes "
                              f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise FlashscopeError(f"k, v: expected shape ({B}, Hkv, Nk, {D}) for both, got "
                              f"{tuple(k.shape)} and {tuple(v.shape)}")
    if Hkv == 0 or H % Hkv:
        raise FlashscopeError(f"k: {Hkv} kv heads must divide q's {H} heads")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    qd, kd, vd = (t.to(compute_dtype) for t in (q, k, v))
    if Hkv != H:
        kd = kd.repeat_interleave(H // Hkv, dim=1)
        vd = vd.repeat_interleave(H // Hkv, dim=1)
    kt = kd.transpose(-1, -2)
    itemsize = torch.empty((), dtype=compute_dtype).element_size()
    rows = max(1, _CHUNK_BYTES // max(1, B * H * Nk * itemsize))
    a, b = (0, Nq) if row_range is None else (int(row_range[0]), int(row_range[1]))
    if not 0 <= a <= b <= Nq:
        raise FlashscopeError(f"row_range: expected 0 <= a <= b <= {Nq}, got {row_range}")
    out = torch.empty(B, H, b - a, D, dtype=compute_dtype, device=q.device)
    for r0 in range(a, b, rows):
        r1 = min(b, r0 + rows)
        s = (qd[:, :, r0:r1] @ kt) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        hidden = _hidden(r0, r1, Nq, Nk, is_causal, window, align, q.device)
        out[:, :, r0 - a:r1 - a] = _softmax(s, hidden) @ vd
    return out


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref| in float64; inf when ``out`` is NaN/inf anywhere ``ref`` is
    finite (so NaN never passes a bound), 0.0 for an all-zero match."""
    if tuple(out.shape) != tuple(ref.shape):
        raise FlashscopeError(f"out: expected shape {tuple(ref.shape)}, got {tuple(out.shape)}")
    o = out.detach().to(device=ref.device, dtype=torch.float64)
    r = ref.detach().to(torch.float64)
    finite_ref = torch.isfinite(r)
    if bool((~torch.isfinite(o) & finite_ref).any()):
        return math.inf
    if o.numel() == 0:
        return 0.0
    err = (o - r).abs().masked_fill(~finite_ref, 0.0).max().item()
    scale = r.abs().masked_fill(~finite_ref, 0.0).max().item()
    if scale == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return err / scale


def reference_attention_grads(q, k, v, dout, *, is_causal: bool = False,
                              scale: Optional[float] = None,
                              compute_dtype: torch.dtype = torch.float64, window=None,
                              align: str = "top_left", softcap=None):
    """(out, dq, dk, dv) in ``compute_dtype`` for the loss <out, dout>, by the closed form
    (chunked over query rows like the forward, no autograd graph):
    P = softmax(scale Q K^T), dV = P^T dO, dP = dO V^T, Delta_i = sum_d dO_id O_id,
    dS = P (dP - Delta), dQ = scale dS K, dK = scale dS^T Q; GQA sums dK, dV over each group
    of H / Hkv query heads. dout has q's shape (B, H, Nq, D)."""
    out = reference_attention(q, k, v, is_causal=is_causal, scale=scale,
                              compute_dtype=compute_dtype, window=window, align=align,
                              softcap=softcap)
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if tuple(dout.shape) != tuple(q.shape):
        raise FlashscopeError(f"dout: expected q's shape {tuple(q.shape)}, got "
                              f"{tuple(dout.shape)}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    qd, kd, vd, dod = (t.to(compute_dtype) for t in (q, k, v, dout))
    if Hkv != H:
        kd = kd.repeat_interleave(H // Hkv, dim=1)
        vd = vd.repeat_interleave(H // Hkv, dim=1)
    itemsize = torch.empty((), dtype=compute_dtype).element_size()
    rows = max(1, _CHUNK_BYTES // max(1, 2 * B * H * Nk * itemsize))
    dq = torch.empty_like(qd)
    dk = torch.zeros_like(kd)
    dv = torch.zeros_like(vd)
    for r0 in range(0, Nq, rows):
        r1 = min(Nq, r0 + rows)
        s = (qd[:, :, r0:r1] @ kd.transpose(-1, -2)) * scale
        t = None
        if softcap:
            t = torch.tanh(s / softcap)
            s = softcap * t
        p = _softmax(s, _hidden(r0, r1, Nq, Nk, is_causal, window, align, q.device))
        do = dod[:, :, r0:r1]
        dv += p.transpose(-1, -2) @ do
        delta = (do * out[:, :, r0:r1]).sum(-1, keepdim=True)
        ds = p * (do @ vd.transpose(-1, -2) - delta)
        if t is not None:  # d(c tanh(s / c)) / ds
            ds = ds * (1 - t * t)
        dq[:, :, r0:r1] = (ds @ kd) * scale
        dk += (ds.transpose(-1, -2) @ qd[:, :, r0:r1]) * scale
    if Hkv != H:
        dk = dk.view(B, Hkv, H // Hkv, Nk, D).sum(2)
        dv = dv.view(B, Hkv, H // Hkv, Nk, D).sum(2)
    return out, dq, dk, dv


def cache_keys(cache: torch.Tensor, b: int, n: int, block_table=None) -> torch.Tensor:
    """Keys (or values) 0..n-1 of sequence ``b`` of a KV cache, (n, Hkv, D): rows of a
    dense cache (B, Ncache, Hkv, D), or gathered from the pages (num_pages, page_size,
    Hkv, D) that row b of ``block_table`` names."""
    if block_table is None:
        return cache[b, :n]
    page = cache.shape[1]
    pages = block_table[b, :-(-n // page)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


def reference_kvcache(q, k_cache, v_cache, cache_seqlens, *, block_table=None, k=None,
                      v=None, is_causal: bool = True, scale: Optional[float] = None,
                      window=None, softcap=None,
                      compute_dtype: torch.dtype = torch.float64) -> tuple:
    """(out (B, Nq, H, D), lse (B, H, Nq)) in ``compute_dtype`` of decoding against a KV
    cache, from the definition (:func:`flashscope.attention_with_kvcache`): sequence b's
    keys are its cache's first ``cache_seqlens[b]`` followed by the new ``k``/``v`` (the
    cache is only read), query i sits at position n_b - Nq + i for the n_b keys
    (bottom-right), masked like :func:`reference_attention`. A row that sees no key is 0
    with lse -inf. One sequence at a time, a GQA group's rows against its kv head."""
    B, Nq, H, D = q.shape
    hkv = k_cache.shape[2]
    g = H // hkv
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.zeros(B, Nq, H, D, dtype=compute_dtype, device=q.device)
    lse = torch.full((B, H, Nq), float("-inf"), dtype=compute_dtype, device=q.device)
    lens = cache_seqlens.tolist()
    for b in range(B):
        kb, vb = (cache_keys(c, b, lens[b], block_table) for c in (k_cache, v_cache))
        if k is not None:
            kb, vb = torch.cat([kb, k[b]]), torch.cat([vb, v[b]])
        n = kb.shape[0]
        if n == 0 or Nq == 0:
            continue
        qb = q[b].to(compute_dtype).permute(1, 0, 2).reshape(hkv, g * Nq, D)
        s = qb @ kb.to(compute_dtype).permute(1, 2, 0) * scale  # (Hkv, g Nq, n)
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        hidden = _hidden(0, Nq, Nq, n, is_causal, window, "bottom_right", q.device)
        if hidden is not None:
            s = s.masked_fill(hidden.repeat(g, 1), float("-inf"))
        m = s.logsumexp(-1, keepdim=True)
        p = torch.exp(s - m.masked_fill(m == float("-inf"), 0.0))
        o = p @ vb.to(compute_dtype).permute(1, 0, 2)  # (Hkv, g Nq, D)
        out[b] = o.reshape(H, Nq, D).permute(1, 0, 2)
        lse[b] = m.reshape(H, Nq)
    return out, lse
