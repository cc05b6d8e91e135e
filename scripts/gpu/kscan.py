"""Forward TFLOP/s against the key length at a fixed query length (non-causal), so the time
of a row block splits into a + b * N_K: b is the inner loop, a the work tile's prologue
and epilogue. flashscope (the configs of CFG), cuDNN and, with --fa4, FlashAttention-4
are timed in interleaved 10-launch bursts (10 rounds, median), each output checked
against cuDNN's first. The JSON is rewritten after every shape.

Usage: PYTHONPATH=src NQ=1024 python scripts/gpu/kscan.py OUT.json [--fa4]
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import _provider, checked, interleaved  # noqa: E402

from flashscope.roofline import attention_flops  # noqa: E402

G = "Q_IN_REGS=0,num_warps=4,TMA=1,GLUON=1,PERSISTENT=1,BLOCK_N=128"
CFG = {64: {"f192": f"BLOCK_M=192,num_stages=3,PINGPONG=1,EARLY_Q=1,{G}",
            "f128": f"BLOCK_M=128,num_stages=3,EARLY_Q=1,K_EARLY=1,{G}"},
       128: {"f128": f"BLOCK_M=128,num_stages=2,OVERLAP=1,PINGPONG=1,LAZY_RESCALE=1,"
                     f"EARLY_Q=1,K_EARLY=1,{G}"}}


def main():
    out = sys.argv[1]
    use_fa4 = "--fa4" in sys.argv
    nq = int(os.environ.get("NQ", "1024"))
    rows = []
    for D in (64, 128):
        H = 2048 // D
        for nk in (128, 256, 512, 1024, 2048, 4096, 8192):
            B = max(1, 16 * 1024 // nk)
            q = torch.randn(B, H, nq, D, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(B, H, nk, D, device="cuda", dtype=torch.bfloat16)
                    for _ in range(2))
            ref = _provider("cudnn", q, k, v, False)().float()
            names = list(CFG[D]) + ["cudnn"] + (["fa4"] if use_fa4 else [])
            fns = [checked(n, CFG[D].get(n, n), q, k, v, False, ref) for n in names]
            times = interleaved(names, fns, 10, 10)
            flops = attention_flops(B, H, nq, nk, D, False)
            row = {"D": D, "nk": nk, "B": B,
                   **{n: round(flops / statistics.median(times[n]) / 1e9, 1) for n in names}}
            rows.append(row)
            print(row, flush=True)
            with open(out, "w") as f:
                json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "nq": nq,
                           "device": torch.cuda.get_device_name(), "configs": CFG,
                           "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
