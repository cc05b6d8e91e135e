"""Forward on the standard suite with the Hopper variants (TMA, warp specialization) next
to the pointer-load default, cuDNN (SDPA) and FlashAttention-4 when importable, all timed
in one run. Each flashscope output is checked against cuDNN's (relative error, no NaN).
Writes OUTDIR/fwd_hopper.json and prints a table.

Usage: PYTHONPATH=src python scripts/gpu/fwd_hopper.py OUTDIR [--ns 1024,4096,16384]
       [--dims 64,128] [--variants NAME=CONFIG;...]
"""

import argparse
import json
import sys
import time

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscope
from flashscope import AttentionConfig
from flashscope.roofline import attention_flops

VARIANTS = {
    "tma-m128n64w8s3": "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3,TMA=1",
    "tma-m128n128w8s2": "BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=2,TMA=1",
    "ws-m128n64w4s3": "BLOCK_M=128,BLOCK_N=64,num_warps=4,num_stages=3,TMA=1,WARP_SPEC=1",
    "ws-m128n64w4s2": "BLOCK_M=128,BLOCK_N=64,num_warps=4,num_stages=2,TMA=1,WARP_SPEC=1",
    "ws-m128n128w4s2": "BLOCK_M=128,BLOCK_N=128,num_warps=4,num_stages=2,TMA=1,WARP_SPEC=1",
    "ws-m128n128w4s3": "BLOCK_M=128,BLOCK_N=128,num_warps=4,num_stages=3,TMA=1,WARP_SPEC=1",
}


def tflops(B, H, N, D, causal, ms):
    return attention_flops(B, H, N, N, D, causal) / (ms * 1e-3) / 1e12


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def fa4():
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func
    except Exception as e:  # noqa: BLE001
        print("FA4 not available:", type(e).__name__, str(e)[:120], file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--ns", default="1024,4096,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--variants", default=None)
    a = ap.parse_args()
    variants = VARIANTS if not a.variants else dict(
        x.split("=", 1) for x in a.variants.split(";"))
    f4 = fa4()
    rows = []
    t0 = time.time()
    for D in (int(x) for x in a.dims.split(",")):
        for causal in (False, True):
            for N in (int(x) for x in a.ns.split(",")):
                B, H = 16384 // N, 2048 // D
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    def cudnn():
                        return torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, is_causal=causal)
                    ref = cudnn().float()
                    res = {"cudnn": bench(cudnn)}
                if f4 is not None:
                    qf, kf, vf = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    res["fa4"] = bench(lambda: f4(qf, kf, vf, causal=causal))
                cands = {"fs-default": None,
                         **{n: AttentionConfig.parse(c) for n, c in variants.items()}}
                errs = {}
                for name, cfg in cands.items():
                    print(f"> D={D} N={N} causal={causal} {name}", file=sys.stderr, flush=True)
                    try:
                        o = flashscope.attention(q, k, v, is_causal=causal, config=cfg)
                        torch.cuda.synchronize()
                        err = ((o.float() - ref).norm() / ref.norm()).item()
                        if not (err < 1e-2) or torch.isnan(o).any():
                            errs[name] = f"validation: rel err {err:.2e}"
                            continue
                        res[name] = bench(lambda: flashscope.attention(
                            q, k, v, is_causal=causal, config=cfg))
                    except Exception as e:  # noqa: BLE001
                        errs[name] = f"{type(e).__name__}: {str(e)[:160]}"
                best_peer = max(tflops(B, H, N, D, causal, res[p])
                                for p in ("cudnn", "fa4") if p in res)
                row = {"D": D, "N": N, "causal": causal, "B": B, "H": H,
                       "tflops": {p: round(tflops(B, H, N, D, causal, ms), 1)
                                  for p, ms in res.items()},
                       "ms": {p: round(ms, 4) for p, ms in res.items()}, "errors": errs}
                fs = {p: t for p, t in row["tflops"].items() if p not in ("cudnn", "fa4")}
                bp = max(fs, key=fs.get)
                row["best_fs"], row["best_fs_vs_peer"] = bp, round(fs[bp] / best_peer, 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "cudnn": torch.backends.cudnn.version(),
            "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0, 1)}
    json.dump({"meta": meta, "variants": variants, "rows": rows},
              open(f"{a.outdir}/fwd_hopper.json", "w"), indent=1)
    names = ["cudnn", "fa4", "fs-default", *variants]
    print(" ".join(f"{n[:16]:>16}" for n in ["D/N/causal", *names]))
    for r in rows:
        cells = [f"{r['D']}/{r['N']}/{int(r['causal'])}"]
        cells += [str(r["tflops"].get(n, "-")) for n in names]
        print(" ".join(f"{c:>16}" for c in cells), r["best_fs"], r["best_fs_vs_peer"])
    print(meta)


if __name__ == "__main__":
    main()
