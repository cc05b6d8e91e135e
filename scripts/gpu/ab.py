"""A/B timing of forward variants on one shape, in short interleaved bursts.

The H100's clock follows its power and temperature, so one kernel reads several percent
apart between passes a few seconds apart (run 45 of the performance record saw -11% to
+16% between two identical configs). Here every variant runs a burst of ``--reps``
launches (CUDA events around the burst, after one warm-up launch), the variants take turns
burst by burst, and this repeats ``--rounds`` times, so all of them sample the same
drift; each round's order is a fresh permutation, so no variant always follows the same
one (the clock also follows the previous burst's power). Printed per variant: the median
burst time, TFLOP/s, and the median over rounds of its time divided by the first
variant's time in the same round (with the interquartile range of that ratio).

A VARIANT is ``NAME=SPEC``: ``cudnn``, ``fa4``, a config ``K=V,...``, or ``+K=V,...`` on
top of flashscope's default for the shape (``@CONST=V`` overrides a kernel constant, as
in ``fwd_hopper.py``). Every flashscope output is checked against cuDNN's first.

Usage: PYTHONPATH=src python scripts/gpu/ab.py --shape 1,32,16384,64 [--causal]
       --variants "a=+;b=+LAZY_RESCALE=1" [--rounds 20] [--reps 10] [--json OUT.json]
       [--flush]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_cells import variant_specs  # noqa: E402
from fwd_hopper import _run, fa4, tflops, variant  # noqa: E402

from flashscope.bench.timing import round_orders  # noqa: E402


def _provider(spec, q, k, v, causal):
    """A zero-argument callable running one variant."""
    if spec == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal)
        return run
    if spec == "fa4":
        f4 = fa4()
        if f4 is None:
            raise RuntimeError("FA4 is not importable")
        qf, kf, vf = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        return lambda: f4(qf, kf, vf, causal=causal)
    cfg, over = variant(spec, q, k, v, causal)
    return lambda: _run(q, k, v, causal, cfg, over)


def _burst(fn, reps, flush=None):
    """Milliseconds per launch of ``reps`` launches after one warm-up. With ``flush`` (a
    large buffer), each launch is preceded by zeroing it, which evicts the inputs from L2
    as the bench harness's timer does, and is timed by events of its own."""
    fn()
    if flush is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return sum(s.elapsed_time(e) for s, e in events) / reps


def check_output(name, out, ref):
    """Stop the script unless ``out`` is within a relative error of 1e-2 of ``ref``
    (cuDNN's, fp32); NaN never passes."""
    err = ((out.float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        sys.exit(f"{name}: relative error {err:.2e} against cuDNN")


def checked(name, spec, q, k, v, causal, ref):
    """The provider of :func:`_provider`, run once and its output checked against ``ref``
    (:func:`check_output`)."""
    fn = _provider(spec, q, k, v, causal)
    o = fn()
    out = o[0] if isinstance(o, tuple) else o
    if spec == "fa4":
        out = out.transpose(1, 2)
    check_output(name, out, ref)
    return fn


def interleaved(names, fns, rounds, reps, flush=False):
    """{name: [ms per launch, one per round]}: each round runs every provider's burst of
    ``reps`` launches in the order of :func:`round_orders`; ``flush``: L2 evicted before
    every launch (:func:`_burst`)."""
    buf = torch.empty(256 << 20, dtype=torch.int8, device="cuda") if flush else None
    times = {n: [] for n in names}
    for order in round_orders(len(fns), rounds):
        for i in order:
            times[names[i]].append(_burst(fns[i], reps, buf))
    return times


def shape_args(ap, rounds=20):
    """The arguments every A/B script here takes: shape, causal, rounds, reps, JSON out."""
    ap.add_argument("--shape", required=True, help="B,H,N,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    ap.add_argument("--flush", action="store_true",
                    help="evict L2 before every launch (256 MB zeroed), as the bench does")


def report(a, names, times, extra=None):
    """Print and (with ``--json``) save each variant's median time, TFLOP/s and median
    ratio to the first variant's time in the same round (with its interquartile range)."""
    B, H, N, D = map(int, a.shape.split(","))
    base = times[names[0]]
    rows = []
    for n in names:
        ratios = sorted(t / b for t, b in zip(times[n], base))
        ms = statistics.median(times[n])
        nk = getattr(a, "nk", None) or N  # Nq != Nk: non-causal, 4 B H Nq Nk D flops
        rows.append({"name": n, "ms": round(ms, 4),
                     "tflops": round(tflops(B, H, N, D, a.causal, ms) * nk / N, 1),
                     "ratio": round(statistics.median(ratios), 4),
                     "ratio_q1": round(ratios[len(ratios) // 4], 4),
                     "ratio_q3": round(ratios[(3 * len(ratios)) // 4], 4)})
    meta = {"device": torch.cuda.get_device_name(), "shape": a.shape, "causal": a.causal,
            "rounds": a.rounds, "reps": a.reps, "flush": a.flush,
            "date": time.strftime("%Y-%m-%d %H:%M"), **(extra or {})}
    keys = f" Nk={a.nk}" if getattr(a, "nk", None) else ""
    print(f"{a.shape}{keys} causal={int(a.causal)}{' L2 flushed' if a.flush else ''}: time / "
          f"{names[0]}'s, median of {a.rounds} rounds (IQR)")
    for r in rows:
        print(f"  {r['name']:>12} {r['ms']:8.4f} ms {r['tflops']:7.1f} TFLOP/s  "
              f"{r['ratio']:.4f} ({r['ratio_q1']:.4f}-{r['ratio_q3']:.4f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "times": times}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    shape_args(ap)
    ap.add_argument("--variants", required=True)
    ap.add_argument("--nk", type=int, default=None,
                    help="keys (and values) per head, if not N: Nq = N != Nk (non-causal)")
    a = ap.parse_args()
    B, H, N, D = map(int, a.shape.split(","))
    nk = a.nk or N
    if nk != N and a.causal:
        sys.exit("--nk: Nq != Nk is timed non-causal only")
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, H, nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ref = _provider("cudnn", q, k, v, a.causal)().float()
    names, fns = [], []
    for name, spec in variant_specs(a.variants).items():
        names.append(name)
        t0 = time.time()
        fns.append(checked(name, spec, q, k, v, a.causal, ref))
        print(f"{name}: built and checked in {time.time() - t0:.1f} s", file=sys.stderr,
              flush=True)
    report(a, names, interleaved(names, fns, a.rounds, a.reps, a.flush),
           {"variants": a.variants, "nk": nk})


if __name__ == "__main__":
    main()
