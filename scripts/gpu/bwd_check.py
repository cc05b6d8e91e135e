"""Backward check on a GPU: speed on the standard suite, a few alternative configs, then
the GPU test subset of the backward. Writes OUTDIR/bwd_check.json (timings, errors) and
OUTDIR/bwd_tests.xml (pytest JUnit report), in under 3 minutes on an H100.

Suite: bf16, (B, H, N, D) with B*N = 16384 and H*D = 2048, D in {64, 128},
N in {1024, 4096, 16384}, causal or not. FLOPs: fwd = 4*B*H*N^2*D (halved when causal),
bwd = 2.5 * fwd (five N^2*D products against two). Times are
``triton.testing.do_bench`` medians; the backward is timed alone, as
``torch.autograd.grad`` of a retained forward graph, for flashscope and for SDPA's
FlashAttention-2 and cuDNN backends alike. Gradient errors are relative Frobenius norms
against SDPA's math backend in fp32.

Usage: PYTHONPATH=src python scripts/gpu/bwd_check.py OUTDIR [--no-tests] [--quick]
"""

import json
import os
import subprocess
import sys
import time

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscope
from flashscope import launch
from flashscope.config import AttentionBwdConfig, select_bwd_config

SDPA = torch.nn.functional.scaled_dot_product_attention
PROVIDERS = {
    "fa2": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
# Alternatives timed next to the default at N = 4096 (dK/dV tile, dQ tile, warps, stages).
CANDIDATES = {
    64: [AttentionBwdConfig(32, 128, 128, 32, 4, 3), AttentionBwdConfig(64, 128, 128, 64, 8, 2),
         AttentionBwdConfig(32, 64, 64, 32, 4, 3)],
    128: [AttentionBwdConfig(32, 128, 128, 32, 8, 2), AttentionBwdConfig(32, 64, 64, 32, 4, 3),
          AttentionBwdConfig(64, 64, 64, 64, 8, 2), AttentionBwdConfig(32, 128, 128, 32, 4, 3)],
}


def flops(B, H, N, D, causal):
    return 4 * B * H * N * N * D * (0.5 if causal else 1.0)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def fwd_bwd_times(attn, q, k, v, dout):
    """(fwd ms, bwd ms, (out, dq, dk, dv)) of one attention callable."""
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out = attn(qg, kg, vg)
    grads = torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
    with torch.no_grad():
        fwd_ms = bench(lambda: attn(q, k, v))
    bwd_ms = bench(lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True))
    return fwd_ms, bwd_ms, (out.detach(), *grads)


def suite(rows, quick, t0):
    for D in (64, 128):
        H = 2048 // D
        for causal in (False, True):
            for N in ((4096,) if quick else (1024, 4096, 16384)):
                B = 16384 // N
                q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
                                 for _ in range(4))
                f = flops(B, H, N, D, causal)
                base = dict(D=D, N=N, B=B, H=H, causal=causal)
                ref = None
                if N <= 4096:
                    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
                    with sdpa_kernel(SDPBackend.MATH):
                        o = SDPA(qf, kf, vf, is_causal=causal)
                    ref = (o.detach(), *torch.autograd.grad(o, (qf, kf, vf), dout.float()))
                    del qf, kf, vf, o
                line = []
                for name, be in PROVIDERS.items():
                    def attn(a, b, c, be=be):
                        with sdpa_kernel(be):
                            return SDPA(a, b, c, is_causal=causal)
                    try:
                        fm, bm, res = fwd_bwd_times(attn, q, k, v, dout)
                    except RuntimeError as e:
                        rows.append(dict(base, provider=name, error=str(e)[:200]))
                        continue
                    errs = [rel(a, b) for a, b in zip(res, ref)] if ref else None
                    rows.append(dict(base, provider=name, fwd_ms=fm, bwd_ms=bm,
                                     fwd_tflops=f / fm / 1e9, bwd_tflops=2.5 * f / bm / 1e9,
                                     err_out_dq_dk_dv=errs))
                    line.append(f"{name} {2.5 * f / bm / 1e9:.0f}")
                cfg = select_bwd_config(D, "bfloat16", causal, "sm90")
                fm, bm, res = fwd_bwd_times(
                    lambda a, b, c: flashscope.attention(a, b, c, is_causal=causal), q, k, v, dout)
                errs = [rel(a, b) for a, b in zip(res, ref)] if ref else None
                rows.append(dict(base, provider="flashscope", bwd_config=cfg.key, fwd_ms=fm,
                                 bwd_ms=bm, fwd_tflops=f / fm / 1e9,
                                 bwd_tflops=2.5 * f / bm / 1e9, err_out_dq_dk_dv=errs))
                print(f"D={D} N={N} causal={causal}: bwd TFLOP/s flashscope "
                      f"{2.5 * f / bm / 1e9:.0f} ({cfg.key}), {', '.join(line)}; fwd "
                      f"{f / fm / 1e9:.0f}; errs {errs and ['%.1e' % e for e in errs]} "
                      f"[{time.time() - t0:.0f}s]", flush=True)
                if N == 4096:
                    candidates(rows, base, q, k, v, dout, causal, f, res)


def candidates(rows, base, q, k, v, dout, causal, f, res):
    """Time launch.backward alone for the default and the alternatives of this head dim."""
    D = q.shape[-1]
    scale = D ** -0.5
    out, lse = flashscope.attention(q, k, v, is_causal=causal, return_lse=True)
    default = select_bwd_config(D, "bfloat16", causal, "sm90")
    for cfg in [default] + CANDIDATES[D]:
        try:
            got = launch.backward(dout, q, k, v, out, lse, causal=causal, scale=scale, cfg=cfg)
            errs = [rel(a, b) for a, b in zip(got, res[1:])]
            ms = bench(lambda: launch.backward(dout, q, k, v, out, lse, causal=causal,
                                               scale=scale, cfg=cfg))
        except Exception as e:  # noqa: BLE001 - a config that fails is a result too
            rows.append(dict(base, provider="flashscope-candidate", bwd_config=cfg.key,
                             error=str(e)[:200]))
            continue
        rows.append(dict(base, provider="flashscope-candidate", bwd_config=cfg.key,
                         default=cfg == default, bwd_ms=ms, bwd_tflops=2.5 * f / ms / 1e9,
                         diff_vs_default_grads=errs))
        print(f"    {cfg.key}: {2.5 * f / ms / 1e9:.0f} TFLOP/s (launch.backward only)",
              flush=True)


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: bwd_check.py OUTDIR [--no-tests] [--quick]")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    quick = "--quick" in sys.argv
    t0 = time.time()
    rows = []
    suite(rows, quick, t0)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d"),
                bench_seconds=round(time.time() - t0, 1))
    tests = None
    if "--no-tests" not in sys.argv:
        budget = max(30, 170 - int(time.time() - t0))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", "cuda",
               "tests/api/test_backward.py", "tests/api/test_compile.py",
               f"--junitxml={out_dir}/bwd_tests.xml"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget)
            tail = proc.stdout.strip().splitlines()[-15:]
            tests = dict(rc=proc.returncode, tail=tail)
        except subprocess.TimeoutExpired:
            tests = dict(rc=None, tail=[f"timed out after {budget}s"])
        print("\n".join(tests["tail"]), flush=True)
    with open(f"{out_dir}/bwd_check.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows, tests=tests), f, indent=1)
    print(f"wrote {out_dir}/bwd_check.json [{time.time() - t0:.0f}s]")


if __name__ == "__main__":
    main()
