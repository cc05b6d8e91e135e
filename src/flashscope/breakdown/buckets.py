"""Kernel-name bucketing, as data, and the per-bucket summary with the Amdahl ceiling.

Rules are tried in order and the first regex that matches (``re.search``, case-sensitive
unless the pattern says otherwise) names the bucket; names no rule matches are "other".
Order matters: attention comes first because some attention kernels carry GEMM-ish words
(CK's ``ck_tile::FmhaFwdKernel``), normalization before elementwise because PyTorch's layer
norm is a ``vectorized_layer_norm_kernel`` and Inductor fuses it as
``triton_per_fused_native_layer_norm_*``. Softmax is attention: in an unfused (math)
attention it is part of the attention's cost.

Amdahl ceiling: with total time T and attention time A, the end-to-end speedup if attention
cost nothing is T / (T - A).
"""

from __future__ import annotations

import re

BUCKETS = ("gemm", "attention", "normalization", "elementwise", "memory", "other")

RULES = (
    # attention: cuDNN fused SDPA, FlashAttention 2/3, PyTorch mem-efficient (CUTLASS),
    # flashscope / Triton tutorial kernels, CK and CK-tile FMHA, aiter, CPU SDPA ops
    ("attention", r"(?i)fmha|flash_fwd|flash_bwd|flash_attn|_attn_fwd|_attn_bwd|attention|"
                  r"sdpa|softmax|flashscope::attention"),
    # GEMM: cuBLAS (sm90_xmma_gemm, nvjet, ampere_*gemm), CUTLASS, Tensile/rocBLAS/hipBLASLt
    # (Cijk_*), CK gemm, Inductor/Triton matmul templates, CPU aten GEMM ops
    ("gemm", r"(?i)gemm|^nvjet_|cutlass|Cijk_|xmma|wgmma|s16816|s1688|matmul|"
             r"^aten::(mm|addmm|bmm|baddbmm|linear|_addmm_activation)$|triton_tem_fused_mm"),
    ("normalization", r"(?i)layer_?norm|rms_?norm|group_?norm|batch_?norm|instance_?norm"),
    # memory: CUDA/HIP copies and fills, ROCclr blits, torch copy/fill ops
    ("memory", r"(?i)^memcpy|^memset|Memcpy|Memset|rocclr_(copy|fill)|copyBuffer|fillBuffer|"
               r"^aten::(copy_|fill_|zero_|clone|contiguous|cat|to|_to_copy|empty_like|"
               r"zeros|ones)$|CatArrayBatchedCopy"),
    # elementwise and bias: PyTorch's elementwise kernels, Inductor pointwise, CPU ops
    ("elementwise", r"(?i)elementwise|vectorized|unrolled_elementwise|triton_poi_|add_?bias|"
                    r"bias_?add|gelu|relu|silu|^aten::(add|add_|mul|mul_|div|sub|gelu|relu|"
                    r"silu|tanh|dropout|where|masked_fill)$"),
)
_COMPILED = tuple((b, re.compile(p)) for b, p in RULES)


def classify(name: str) -> str:
    """The bucket of a kernel or op name."""
    for bucket, rx in _COMPILED:
        if rx.search(name):
            return bucket
    return "other"


def summarize(events, source: str = "") -> dict:
    """``events``: iterable of (name, seconds[, calls]) -> per-bucket totals, shares, the
    top names per bucket and the Amdahl ceiling for attention."""
    totals = {b: 0.0 for b in BUCKETS}
    calls = {b: 0 for b in BUCKETS}
    names = {}
    for ev in events:
        name, sec = ev[0], float(ev[1])
        n = int(ev[2]) if len(ev) > 2 else 1
        b = classify(name)
        totals[b] += sec
        calls[b] += n
        key = (b, name)
        names[key] = names.get(key, 0.0) + sec
    total = sum(totals.values())
    att = totals["attention"]
    rows = [{"bucket": b, "seconds": totals[b], "calls": calls[b],
             "share": totals[b] / total if total else 0.0,
             "top": [n for (bb, n), _ in sorted(names.items(), key=lambda kv: -kv[1])
                     if bb == b][:3]} for b in BUCKETS]
    return {"source": source, "total_seconds": total, "buckets": rows,
            "attention_share": att / total if total else 0.0,
            "amdahl_ceiling": (total / (total - att)) if total > att else float("inf")}
