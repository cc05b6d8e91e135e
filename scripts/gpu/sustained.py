"""Speed under sustained load, with the clock and power it ran at.

The bench harness times each call after zeroing a 256 MB buffer (triton's do_bench), so
the GPU runs back to back for tens of milliseconds; Nsight Compute times one launch. When
the two disagree for one kernel and not another, the difference is in the clock a kernel
can hold, or in the gaps between calls. For each NAME=SPEC (``cudnn``, ``fa4`` or a
flashscope config ``K=V,...``; ``default`` for the tuned one), this prints:

- ``bench``: do_bench with the L2 flush, median (the harness's number);
- ``graph``: do_bench_cudagraph, median (no launch gaps, no flush);
- ``loop``: a 300 ms back-to-back loop, median per call from CUDA events, with the median
  SM clock (MHz) and power (W) that ``nvidia-smi`` sampled every 20 ms during it.

Writes OUTDIR/sustained.json. Usage: PYTHONPATH=src python scripts/gpu/sustained.py OUTDIR
--shape 1,32,16384,64 [--causal] --runs "p3=GLUON=1,...;fa4=fa4;cudnn=cudnn"
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def _fn(spec, q, k, v, causal):
    if spec == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                        is_causal=causal)
        return run
    if spec == "fa4":
        from flash_attn.cute import flash_attn_func

        qf, kf, vf = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        return lambda: flash_attn_func(qf, kf, vf, causal=causal)
    import flashscope

    cfg = None if spec == "default" else flashscope.AttentionConfig.parse(spec)
    return lambda: flashscope.attention(q, k, v, is_causal=causal, config=cfg)


def _loop(fn, seconds):
    """Per-call ms of a back-to-back loop, with nvidia-smi sampling clock and power."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "20"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.1)
    events, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        events.append((a, b))
        if len(events) % 8 == 0:
            events[-8][1].synchronize()
    torch.cuda.synchronize()
    smi.terminate()
    samples = []
    for line in smi.communicate()[0].splitlines():
        try:
            mhz, watts = (float(x) for x in line.split(","))
            samples.append((mhz, watts))
        except ValueError:
            continue
    ms = [a.elapsed_time(b) for a, b in events[len(events) // 4:]]
    tail = samples[len(samples) // 4:] or samples or [(float("nan"), float("nan"))]
    return (statistics.median(ms), statistics.median(s[0] for s in tail),
            statistics.median(s[1] for s in tail), len(ms))


def main():
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--shape", default="1,32,16384,64")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--runs", required=True)
    ap.add_argument("--seconds", type=float, default=0.3)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    B, H, N, D = map(int, a.shape.split(","))
    flops = 4 * B * H * N * N * D / (2 if a.causal else 1)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rows = []
    for item in a.runs.split(";"):
        name, spec = item.split("=", 1)
        fn = _fn(spec, q, k, v, a.causal)
        fn()
        torch.cuda.synchronize()
        bench = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
        graph = triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median")
        loop, mhz, watts, n = _loop(fn, a.seconds)
        row = {"name": name, "spec": spec, "bench_ms": bench, "graph_ms": graph,
               "loop_ms": loop, "loop_calls": n, "mhz": mhz, "watts": watts,
               "tflops": {k_: round(flops / ms / 1e9, 1) for k_, ms in
                          (("bench", bench), ("graph", graph), ("loop", loop))}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(a.outdir, "sustained.json"), "w") as f:
            json.dump({"shape": a.shape, "causal": a.causal, "device":
                       torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)
    print(f"{'name':>10} {'bench':>8} {'graph':>8} {'loop':>8} {'MHz':>6} {'W':>6}  TFLOP/s")
    for r in rows:
        print(f"{r['name']:>10} {r['bench_ms']:8.3f} {r['graph_ms']:8.3f} {r['loop_ms']:8.3f} "
              f"{r['mhz']:6.0f} {r['watts']:6.0f}  {r['tflops']}")


if __name__ == "__main__":
    sys.exit(main())
