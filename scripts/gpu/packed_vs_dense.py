"""A packed batch of equal lengths against its dense twin, on a GPU: one batch's memory read
two ways, (B, H, N, D) views of (B, N, H, D) tensors through :func:`flashscope.attention`
and (B N, H, D) through :func:`flashscope.attention_varlen`, forward and backward, each
one's output and gradients checked against the other's, then the GPU time of each in R
rounds, the two in alternating order. The varlen issue asks a packed batch of equal
lengths to run within 5% of the dense call; the bench's varlen suite times a contiguous
(B, H, N, D) twin, another layout, and both against FlashAttention-4 rather than each other.

Prints one JSON line per shape and mask (times in microseconds, ``packed_over_dense``: the
dense call's time over the packed one's, above 1 where packed is faster) and a table.

Usage: PYTHONPATH=src python scripts/gpu/packed_vs_dense.py --rounds 5 \\
       --shapes "16,32,4096,64;16,16,4096,128" --causal both
"""

import argparse
import json
import statistics

import torch

import flashscope
from flashscope.bench.timing import gpu_time


def shapes(text: str) -> list:
    out = []
    for part in filter(None, text.split(";")):
        try:
            b, h, n, d = (int(x) for x in part.split(","))
        except ValueError:
            raise SystemExit(f"--shapes: expected B,H,N,D;... got {part!r}") from None
        out.append((b, h, n, d))
    return out


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def compare(b, h, n, d, causal, rounds) -> dict:
    mem = [torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3)]
    grad = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
    cu = torch.arange(0, (b + 1) * n, n, device="cuda", dtype=torch.int32)

    def dense():
        q, k, v = (m.transpose(1, 2) for m in mem)
        return flashscope.attention(q, k, v, is_causal=causal).transpose(1, 2)

    def packed():
        q, k, v = (m.reshape(b * n, h, d) for m in mem)
        out = flashscope.attention_varlen(q, k, v, cu, cu, n, n, is_causal=causal)
        return out.view(b, n, h, d)

    def step(fwd):
        return lambda: torch.autograd.grad(fwd(), mem, grad)

    errors = {"out": rel(packed(), dense())}
    for name, x, y in zip("qkv", step(packed)(), step(dense)()):
        errors["d" + name] = rel(x, y)
    calls = {"dense fwd": dense, "packed fwd": packed,
             "dense step": step(dense), "packed step": step(packed)}
    times = {k: [] for k in calls}
    for r in range(rounds):
        for k in (list(calls) if r % 2 == 0 else list(reversed(calls))):
            times[k].append(gpu_time(calls[k]) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"shape": [b, h, n, d], "causal": causal, "errors": errors,
            "us": {k: round(v, 1) for k, v in med.items()},
            "packed_over_dense": {
                "fwd": round(med["dense fwd"] / med["packed fwd"], 3),
                "step": round(med["dense step"] / med["packed step"], 3),
                "bwd": round((med["dense step"] - med["dense fwd"])
                             / (med["packed step"] - med["packed fwd"]), 3)}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="16,32,4096,64;16,16,4096,128",
                    help="B,H,N,D;... (default: the varlen suite's equal batches)")
    ap.add_argument("--causal", choices=("no", "yes", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    if a.rounds < 1:
        raise SystemExit("--rounds: expected a positive integer")
    masks = {"no": (False,), "yes": (True,), "both": (False, True)}[a.causal]
    rows = []
    for b, h, n, d in shapes(a.shapes):
        for causal in masks:
            rows.append(compare(b, h, n, d, causal, a.rounds))
            print(json.dumps(rows[-1]), flush=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; packed over dense "
          "(the dense call's GPU time over the packed one's):")
    print(f"{'B,H,N,D':>16} {'causal':>6} {'fwd':>6} {'bwd':>6} {'step':>6}  worst rel. error")
    for r in rows:
        p = r["packed_over_dense"]
        print(f"{','.join(map(str, r['shape'])):>16} {str(r['causal']):>6} {p['fwd']:6.3f} "
              f"{p['bwd']:6.3f} {p['step']:6.3f}  {max(r['errors'].values()):.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
