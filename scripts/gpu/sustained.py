"""Speed under sustained load, with the clock and power it ran at (GPU, nvidia-smi).

``flashscope bench`` times each call after evicting the L2, and ``flashscope tune ab``
times bursts of 10 launches; a loop that runs for hundreds of milliseconds settles at
another clock. Where two kernels compare differently in bursts and back to back, the
difference is the clock each can hold. For every variant (``tune ab``'s specs: ``+`` the
default, ``+K=V,...``, ``FAMILY:K=V,...``, ``cudnn``, ``fa4``, any bench provider),
validated as ``tune ab`` validates, this prints:

- ``bench``: ``triton.testing.do_bench`` with the L2 flush, median;
- ``graph``: ``do_bench_cudagraph``, median (no launch gaps, no flush);
- ``loop``: a back-to-back loop of --seconds, median ms a call from CUDA events over its
  last three quarters, with the median SM clock (MHz) and power (W) that nvidia-smi
  sampled every 20 ms meanwhile.

Writes OUTDIR/sustained.json.

Usage: PYTHONPATH=src python scripts/gpu/sustained.py OUTDIR --shape 1,32,16384,64 \\
       --variants "d=+;f=fa4;n=cudnn" [--causal] [--seconds 0.3]
"""

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch
import triton.testing

from flashscope.launch import device_target
from flashscope.roofline import attention_flops
from flashscope.tune.ab import _validated
from flashscope.tune.cells import problem, shape_cell
from flashscope.tune.variants import parse_variants, resolve_all


def loop(step, seconds: float) -> dict:
    """ms a call of a back-to-back loop, and the SM clock and power nvidia-smi read."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "20"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.1)
    events, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        events.append((start, end))
        if len(events) % 8 == 0:  # keep the queue short: the loop is timed, not queued
            events[-8][1].synchronize()
    torch.cuda.synchronize()
    smi.terminate()
    samples = []
    for line in smi.communicate()[0].splitlines():
        try:
            samples.append(tuple(float(x) for x in line.split(",")))
        except ValueError:
            continue
    tail = samples[len(samples) // 4:] or [(float("nan"), float("nan"))]
    ms = [s.elapsed_time(e) for s, e in events[len(events) // 4:]]
    return {"loop_ms": statistics.median(ms), "loop_calls": len(ms),
            "mhz": statistics.median(s[0] for s in tail),
            "watts": statistics.median(s[1] for s in tail)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--shape", required=True, help="B,H,N,D[,Nk[,Hkv]]")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--variants", required=True, help="NAME=SPEC;... as tune ab takes them")
    ap.add_argument("--seconds", type=float, default=0.3)
    args = ap.parse_args(argv)
    cell = shape_cell(args.shape, args.causal)
    dev = torch.device("cuda")
    variants = resolve_all(parse_variants(args.variants), problem(cell, device_target(dev)))
    kept, dropped = _validated(cell, variants, dev, print)
    c = cell.case
    flops = attention_flops(c.B, c.H, c.Nq, c.Nk, c.D, c.causal, "fwd")
    rows = []
    for name, k in kept.items():
        step = k["step"]
        row = {"name": name, "spec": k["variant"].spec,
               "bench_ms": triton.testing.do_bench(step, warmup=10, rep=40),
               "graph_ms": triton.testing.do_bench_cudagraph(step, rep=40),
               **loop(step, args.seconds)}
        row["tflops"] = {w: round(flops / row[f"{w}_ms"] / 1e9, 1)
                         for w in ("bench", "graph", "loop")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {"cell": cell.name, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows, "dropped": dropped}
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sustained.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
