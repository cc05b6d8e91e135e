"""Forward config scan on a GPU: time flashscope's forward for a grid of configs on the
standard suite shapes (B*N = 16384, H*D = 2048, bf16) next to SDPA's cuDNN and
FlashAttention-2 backends, timed in the same run. Writes OUTDIR/fwd_scan.json.

Usage: PYTHONPATH=src python scripts/gpu/fwd_scan.py OUTDIR [--quick]
"""

import itertools
import json
import sys
import time

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscope
from flashscope import AttentionConfig


def tflops(B, H, N, D, causal, ms):
    f = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    return f / (ms * 1e-3) / 1e12


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def main():
    out_dir = sys.argv[1]
    quick = "--quick" in sys.argv
    rows = []
    space = [AttentionConfig(bm, bn, w, s) for bm, bn, w, s in itertools.product(
        (64, 128), (32, 64, 128), (4, 8), (2, 3)) if not (bm == 64 and w == 8)]
    t0 = time.time()
    for D in (64, 128):
        for causal in (False, True):
            H = 2048 // D
            results = {}
            for N in ((4096,) if quick else (4096, 1024, 16384)):
                B = 16384 // N
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                ref = None
                for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                 ("fa2", SDPBackend.FLASH_ATTENTION)):
                    with sdpa_kernel(be):
                        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        if ref is None:
                            ref = o.float()
                        ms = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, is_causal=causal))
                    rows.append(dict(D=D, N=N, causal=causal, provider=name, ms=ms,
                                     tflops=tflops(B, H, N, D, causal, ms)))
                cands = space if N == 4096 else sorted(
                    results, key=lambda c: results[c])[:4]
                for cfg in cands:
                    try:
                        o = flashscope.attention(q, k, v, is_causal=causal, config=cfg)
                        err = ((o.float() - ref).norm() / ref.norm()).item()
                        ms = bench(lambda: flashscope.attention(q, k, v, is_causal=causal, config=cfg))
                    except Exception as e:  # noqa: BLE001 - record and go on
                        rows.append(dict(D=D, N=N, causal=causal, provider="flashscope",
                                         config=cfg.key, error=str(e)[:200]))
                        print("error", cfg.key, str(e)[:200], flush=True)
                        continue
                    if N == 4096:
                        results[cfg] = ms
                    rows.append(dict(D=D, N=N, causal=causal, provider="flashscope",
                                     config=cfg.key, ms=ms, err=err,
                                     tflops=tflops(B, H, N, D, causal, ms)))
                best = max((r for r in rows if r["D"] == D and r["N"] == N and r["causal"] == causal
                            and r["provider"] == "flashscope" and "ms" in r), key=lambda r: r["tflops"])
                peers = {r["provider"]: r["tflops"] for r in rows if r["D"] == D and r["N"] == N
                         and r["causal"] == causal and r["provider"] != "flashscope"}
                print(f"D={D} N={N} causal={causal}: best {best['config']} {best['tflops']:.0f} "
                      f"TFLOP/s (err {best['err']:.1e}); cudnn {peers['cudnn']:.0f}, fa2 {peers['fa2']:.0f} "
                      f"[{time.time() - t0:.0f}s]", flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d"))
    with open(f"{out_dir}/fwd_scan.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
