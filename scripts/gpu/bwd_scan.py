"""Time backward configs on a GPU: ``launch.backward`` alone (the forward run once to get
out and lse), bf16, suite shape B*N = 16384, H*D = 2048, for each config given, causal and
not; gradients checked against SDPA's math backend in fp32 first. Writes OUTDIR/bwd_scan.json.

Usage: PYTHONPATH=src python scripts/gpu/bwd_scan.py OUTDIR D N "M1,N1,M2,N2,warps,stages" ...
"""

import json
import sys
import time

import torch
import triton

from flashscope import launch
from flashscope.config import AttentionBwdConfig, check_bwd_config, select_config


def main():
    out_dir, D, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cfgs = [AttentionBwdConfig(*map(int, c.split(","))) for c in sys.argv[4:]]
    B, H = 16384 // N, 2048 // D
    rows = []
    for causal in (False, True):
        q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
                       for _ in range(4))
        scale = D ** -0.5
        fcfg = select_config(D, "bfloat16", causal, "sm90")
        o, lse = launch.forward(q, k, v, causal=causal, scale=scale, cfg=fcfg, return_lse=True)
        qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        ref.backward(do.float())
        for cfg in cfgs:
            check_bwd_config(cfg, "sm90", D)
            dq, dk, dv = launch.backward(do, q, k, v, o, lse, causal=causal, scale=scale, cfg=cfg)
            errs = [((a.float() - b.grad).norm() / b.grad.norm()).item()
                    for a, b in ((dq, qr), (dk, kr), (dv, vr))]
            ms = triton.testing.do_bench(lambda: launch.backward(
                do, q, k, v, o, lse, causal=causal, scale=scale, cfg=cfg), warmup=10, rep=50)
            tf = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12
            rows.append(dict(D=D, N=N, causal=causal, config=cfg.key, ms=ms, tflops=tf,
                             errors=errs))
            print(f"D={D} N={N} causal={causal} {cfg.key}: {tf:.0f} TFLOP/s, "
                  f"errors {', '.join(f'{e:.1e}' for e in errs)}", flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d"))
    with open(f"{out_dir}/bwd_scan.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
