"""Host cost of one forward call against its GPU time, on the short rows where it shows.

For each shape and caller: ``host_us``, the wall time of one call measured while the GPU
is held busy by a sleep kernel (so no call waits on the GPU); ``gpu_us``, the kernel time
of back-to-back calls queued behind that sleep (no host gaps, inputs warm in L2);
``bench_us``, the harness's timing (``triton.testing.do_bench``, L2 flushed before each
call), which adds the host time wherever it exceeds the flush. Callers: flashscope's
public API with its default config (``fs-api``); the same with every sm_90 launch plan
built again and the kernel bound through Triton's ``kernel[grid]`` on every call
(``fs-api-jit``: what :func:`flashscope.families.sm90_fwd.plan` and
:func:`flashscope.launch.launch_compiled` save); with the config given (``fs-api-cfg``);
:func:`flashscope.launch.forward` alone (``fs-launch``); cuDNN (SDPA) and
FlashAttention-4 when importable. A cProfile of the API default's calls goes to
OUTDIR/host_profile_D<D>.txt. No command measures host time: the bench harness and
``flashscope tune`` time the GPU.

Usage: PYTHONPATH=src python scripts/gpu/host_overhead.py OUTDIR [--ns 512,1024]
"""

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscope
from flashscope import api, launch
from flashscope.families import sm90_fwd
from flashscope.masks import Mask


def host_and_gpu_us(fn, n=100):
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # ~0.2 s of GPU busy: every call below only queues
    t0 = time.perf_counter()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    host = (time.perf_counter() - t0) / n * 1e6
    end.synchronize()
    return host, start.elapsed_time(end) / n * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--ns", default="512,1024", help="sequence lengths (default 512,1024)")
    a = ap.parse_args(argv)
    Path(a.outdir).mkdir(parents=True, exist_ok=True)
    try:
        from flash_attn.cute import flash_attn_func as fa4
    except Exception:  # noqa: BLE001
        fa4 = None
    rows = []
    for D in (64, 128):
        for causal in (False, True):
            for N in (int(x) for x in a.ns.split(",")):
                B, H = 16384 // N, 2048 // D
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                mask, sc = Mask(causal=causal), launch.default_scale(D)
                cfg = api._default_config(q, k, v, mask, sc)
                callers = {
                    "fs-api": lambda: flashscope.attention(q, k, v, is_causal=causal),
                    "fs-api-jit": lambda: _jit_path(q, k, v, causal),
                    "fs-api-cfg": lambda: flashscope.attention(q, k, v, is_causal=causal,
                                                               config=cfg),
                    "fs-launch": lambda: launch.forward(q, k, v, mask=mask, scale=sc,
                                                        cfg=cfg, return_lse=False),
                }
                callers["cudnn"] = lambda: _cudnn(q, k, v, causal)
                if fa4 is not None:
                    qf, kf, vf = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    callers["fa4"] = lambda: fa4(qf, kf, vf, causal=causal)
                row = {"D": D, "N": N, "causal": causal, "config": cfg.label}
                for name, fn in callers.items():
                    h, g = host_and_gpu_us(fn)
                    b = triton.testing.do_bench(fn, warmup=25, rep=100,
                                                return_mode="median") * 1e3
                    row[name] = {"host_us": round(h, 1), "gpu_us": round(g, 1),
                                 "bench_us": round(b, 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if N == 1024 and not causal:
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(200):
                        callers["fs-api"]()
                    prof.disable()
                    torch.cuda.synchronize()
                    buf = io.StringIO()
                    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
                    with open(f"{a.outdir}/host_profile_D{D}.txt", "w") as f:
                        f.write(buf.getvalue())
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}
    json.dump({"meta": meta, "rows": rows}, open(f"{a.outdir}/host_overhead.json", "w"),
              indent=1)
    print(f"{'D/N/causal':>12} {'config':>22}  caller: host / gpu / bench (us)")
    for r in rows:
        cells = [f"{n}: {c['host_us']}/{c['gpu_us']}/{c['bench_us']}"
                 for n, c in r.items() if isinstance(c, dict)]
        print(f"{r['D']}/{r['N']}/{int(r['causal']):>1} {r['config']:>22}  " + "  ".join(cells))
    print(meta, file=sys.stderr)
    return 0


class _NeverHit(dict):
    """Stands in for sm90_fwd._PLANS: no plan (and so no compiled handle) is ever found or
    kept."""

    def get(self, key, default=None):
        return None

    def __setitem__(self, key, value):
        pass


def _jit_path(q, k, v, causal):
    saved, sm90_fwd._PLANS = sm90_fwd._PLANS, _NeverHit()
    try:
        return flashscope.attention(q, k, v, is_causal=causal)
    finally:
        sm90_fwd._PLANS = saved


def _cudnn(q, k, v, causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


if __name__ == "__main__":
    raise SystemExit(main())
