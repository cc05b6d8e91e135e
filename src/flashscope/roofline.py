"""The attention roofline: FLOPs, minimum bytes, ceilings, each kernel's point, a verdict.

FLOPs (the FlashAttention papers' and tritonbench's count; two per multiply-add):
    forward   F = 4 B H Nq Nk D            (x 0.5 when causal)
    backward  2.5 F  (with recomputation: S = Q K^T again, then dV, dP, dS, dQ, dK: 5 GEMMs
                      against the forward's 2)
    fwd+bwd   3.5 F
Minimum bytes (each tensor crosses DRAM once; e = bytes per element, LSE fp32):
    forward   e (2 B H Nq D + 2 B Hkv Nk D) + 4 B H Nq              read Q, K, V; write O, LSE
    backward  e (3 B H Nq D + 2 B Hkv Nk D) + 4 B H Nq              read Q, K, V, O, dO, LSE
              + e (B H Nq D + 2 B Hkv Nk D)                         write dQ, dK, dV
Causal masking skips work but not data (every K/V row is read by some query), so it halves
F, not the bytes. Arithmetic intensity AI = F / bytes; the roof is
min(peak FLOP/s, AI x bandwidth); the ridge is peak / bandwidth.

The roofline alone assumes the kernel can reach one of its roofs. Counters say whether it
does: a kernel far below both roofs whose DRAM is idle and whose tensor pipe is idle is
latency-bound whatever side of the ridge it sits on (the founding rocprofv3 study's
"memory-bound" kernel ran DRAM at 0.4 % of peak). :func:`verdict` reports both views and
says when they disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import FlashscopeError, lookup


@dataclass(frozen=True)
class Ceilings:
    name: str
    flops: float  # FLOP/s
    bandwidth: float  # bytes/s (read + written)
    source: str

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the two roofs meet."""
        return self.flops / self.bandwidth


CEILINGS = (
    Ceilings("h100-measured", 780e12, 3.0e12,
             "measured on a lent H100 SXM 80GB (docs anchors.md): bf16 GEMM "
             "8192^3 = 780 TFLOP/s, device-to-device copy = 3.0 TB/s (bytes read + written)"),
    Ceilings("h100-datasheet", 989.4e12, 3.35e12,
             "NVIDIA H100 SXM5 datasheet: dense bf16 tensor core 989.4 TFLOP/s, HBM3 3.35 TB/s"),
)
_CEILINGS = {c.name: c for c in CEILINGS}

DIRECTIONS = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}

#: Counter evidence, in order: (verdict, metric key, threshold in % of peak). The first
#: metric at or above its threshold names the bound; none -> latency-bound (neither the
#: memory system nor the math pipes are near busy, so the kernel waits on dependencies,
#: synchronization or too few warps).
COUNTER_RULES = (
    ("memory", "dram_throughput", 60.0),
    ("compute", "tensor_pipe", 60.0),
    ("compute", "issue_active", 80.0),
)

#: A kernel reaching less than this fraction of its roof is "below the roof".
BELOW_ROOF = 0.5


def get_ceilings(name: str) -> Ceilings:
    return lookup(_CEILINGS, name, "--ceilings",
                  hint=" (or give --peak-tflops and --peak-bandwidth)")


def _direction(direction: str) -> float:
    try:
        return DIRECTIONS[direction]
    except KeyError:
        raise FlashscopeError(f"direction {direction!r}: expected one of "
                              f"{', '.join(DIRECTIONS)}") from None


def attention_flops(B, H, Nq, Nk, D, causal=False, direction="fwd") -> float:
    return 4.0 * B * H * Nq * Nk * D * (0.5 if causal else 1.0) * _direction(direction)


def attention_min_bytes(B, H, Nq, Nk, D, Hkv=None, elt=2, direction="fwd") -> float:
    """Minimum DRAM bytes (see the module docstring); LSE is fp32."""
    _direction(direction)
    Hkv = H if Hkv is None else Hkv
    q = B * H * Nq * D * elt
    kv = B * Hkv * Nk * D * elt
    lse = B * H * Nq * 4
    fwd = 2 * q + 2 * kv + lse
    bwd = (3 * q + 2 * kv + lse) + (q + 2 * kv)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[direction]


@dataclass(frozen=True)
class Point:
    """One kernel on the roofline."""

    name: str
    flops: float
    bytes: float
    seconds: Optional[float] = None

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def achieved(self) -> Optional[float]:
        return self.flops / self.seconds if self.seconds else None

    def roof(self, c: Ceilings) -> float:
        return min(c.flops, self.intensity * c.bandwidth)

    def side(self, c: Ceilings) -> str:
        return "memory" if self.intensity < c.ridge else "compute"


def counter_verdict(counters: dict, c: Ceilings) -> Optional[dict]:
    """The bound the counters show (see COUNTER_RULES), with the evidence; None if the
    counters hold none of the rule metrics. DRAM % of peak falls back to the achieved DRAM
    bytes/s over the bandwidth ceiling."""
    vals = {k: counters.get(k) for _, k, _ in COUNTER_RULES}
    if vals["dram_throughput"] is None and counters.get("dram_bandwidth") is not None:
        vals["dram_throughput"] = 100.0 * counters["dram_bandwidth"] / c.bandwidth
    if all(v is None for v in vals.values()):
        return None
    for bound, key, thr in COUNTER_RULES:
        if vals[key] is not None and vals[key] >= thr:
            return {"bound": bound, "evidence": f"{key} {vals[key]:.1f}% >= {thr:g}%", **vals}
    shown = ", ".join(f"{k} {v:.1f}%" for k, v in vals.items() if v is not None)
    return {"bound": "latency", "evidence": f"no unit near busy ({shown})", **vals}


def verdict(p: Point, c: Ceilings, counters: Optional[dict] = None) -> dict:
    """Roofline view, counter view, and which to believe.

    Roofline: the side of the ridge; "below the roof" when the kernel reaches < 50 % of the
    roof at its intensity. Counters (if given) decide; ``agree`` is False and ``note``
    explains when they name a different bound than the roofline. A point above its roof
    is flagged (inconsistent shape, time or ceilings)."""
    return _flag_above(_verdict(p, c, counters))


def _verdict(p: Point, c: Ceilings, counters: Optional[dict] = None) -> dict:
    side = p.side(c)
    out = {"kernel": p.name, "flops": p.flops, "bytes": p.bytes, "intensity": p.intensity,
           "ridge": c.ridge, "roof_flops": p.roof(c), "roofline_bound": side,
           "min_time_ms": p.flops / p.roof(c) * 1e3, "achieved_flops": p.achieved,
           "fraction_of_roof": p.achieved / p.roof(c) if p.achieved else None}
    frac = out["fraction_of_roof"]
    below = frac is not None and frac < BELOW_ROOF
    cv = counter_verdict(counters, c) if counters else None
    out["counters"] = cv
    out["above_roof"] = frac is not None and frac > 1.0
    if cv is None:
        out["bound"] = side
        out["agree"] = None
        out["note"] = (f"roofline only: {side}-bound by AI {p.intensity:.1f} vs ridge "
                       f"{c.ridge:.1f} FLOP/B"
                       + (f"; at {frac:.0%} of its roof it is likely latency-bound (give "
                          "--counters to check)" if below else ""))
        return out
    out["bound"] = cv["bound"]
    out["agree"] = cv["bound"] == side
    if out["agree"]:
        out["note"] = f"roofline and counters agree: {side}-bound ({cv['evidence']})"
    else:
        out["note"] = (f"roofline says {side}-bound (AI {p.intensity:.1f} vs ridge "
                       f"{c.ridge:.1f} FLOP/B) but the counters say {cv['bound']}-bound: "
                       f"{cv['evidence']}"
                       + (f"; the kernel reaches {frac:.0%} of its roof" if frac else ""))
    return out


def _flag_above(out: dict) -> dict:
    if out["above_roof"]:
        out["note"] += (f"; ABOVE the roof ({out['fraction_of_roof']:.0%}): the shape, the time "
                        "or the ceilings are inconsistent")
    return out


def measure_ceilings(device: str = "cuda") -> Ceilings:
    """bf16 GEMM 8192^3 (FLOP/s) and a device-to-device copy of 1 GiB (bytes read +
    written per second), median of triton.testing.do_bench. GPU only."""
    import torch
    import triton

    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    gemm_ms = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=200)
    src = torch.empty(1 << 29, device=device, dtype=torch.int16)
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200)
    name = torch.cuda.get_device_name()
    return Ceilings("measured", 2 * n ** 3 / (gemm_ms * 1e-3),
                    2 * src.numel() * 2 / (copy_ms * 1e-3),
                    f"measured now on {name}: bf16 GEMM 8192^3 {gemm_ms:.3f} ms, "
                    f"1 GiB device-to-device copy {copy_ms:.3f} ms")


def plot(points, c: Ceilings, path, title: str = "") -> None:
    """Log-log roofline PNG: the two roofs, the ridge, and each kernel with a time
    (labels placed so that no two overlap)."""
    from .plotting import place_labels, pyplot

    plt = pyplot()
    ais = [p.intensity for p in points] + [c.ridge]
    lo, hi = min(ais) / 8, max(ais) * 8
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(xs, [min(c.flops, x * c.bandwidth) / 1e12 for x in xs], color="black", lw=1.5,
              label=f"roof: {c.flops / 1e12:.0f} TFLOP/s, {c.bandwidth / 1e12:.2f} TB/s")
    ax.axvline(c.ridge, color="grey", ls=":", lw=1)
    timed = [p for p in points if p.achieved]
    for p in timed:
        ax.scatter([p.intensity], [p.achieved / 1e12], zorder=3)
    ax.set_xlabel("arithmetic intensity (FLOP / minimum DRAM byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title or "attention roofline", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    place_labels(ax, [(p.intensity, p.achieved / 1e12) for p in timed],
                 [f"{p.name} {p.achieved / 1e12:.0f}" for p in timed], fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
