"""A/B timing of copies of the sm90 kernel file x configs on one shape with Nq != Nk
(GPU only): what runs 151-155 of the performance record used to find which line moved
the SPLIT_KV loop.

A VARIANT is ``NAME=FILE:CONFIG``: FILE a copy of ``attention_fwd_sm90.py`` or ``-``
(this tree's), CONFIG ``K=V,...`` on top of ``--entry`` (default: the tuned D = 64
non-causal 16k entry) or ``+K=V,...`` on flashscope's default for the shape. The name
picks what is timed:

- ``A...``: the public call ``flashscope.attention`` (host path included);
- ``...U``: the kernel alone on an uncut round-robin work list (SPLIT_KV builds: the
  build's per-tile speed without its cuts; the output is not the attention);
- ``...N``: the kernel alone, without the merge of cut blocks;
- ``M...``: the merge alone;
- otherwise the kernel, then the merge (as the library launches them).

Every variant's output is compared with cuDNN's (relative error printed; U and N
variants are expected to differ). Bursts of ``--reps`` launches take turns in the
shuffled order of :func:`flashscope.bench.timing.round_orders`; printed: median ms and
the median (IQR) of each round's time over the first variant's.

Usage: PYTHONPATH=src python scripts/gpu/ab_kernels.py --shape 1,44,576,131072,64
       [--rounds 160] [--reps 10] [--flush] E=-: V=-:SPLIT_KV=1 O=old.py:SPLIT_KV=1
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import _burst  # noqa: E402
from ab_file import _module  # noqa: E402

import flashscope  # noqa: E402
from flashscope import api, kernels, launch  # noqa: E402
from flashscope.bench.timing import round_orders  # noqa: E402
from flashscope.config import AttentionConfig  # noqa: E402

ENTRY = ("BLOCK_M=192,BLOCK_N=128,num_warps=4,num_stages=3,Q_IN_REGS=0,TMA=1,OVERLAP=2,"
         "GLUON=1,PERSISTENT=1,PINGPONG=1")


def _uncut(plan, cfg, n_q, n_k, programs):
    """A SPLIT_KV work list of whole blocks dealt round-robin (offsets, tiles, ranges
    0 | n_tiles << 16, slots -1)."""
    tiles = plan.scalars[4] * -(-n_q // cfg.BLOCK_M)
    lists = [list(range(p, tiles, programs)) for p in range(programs)]
    offsets = [0]
    for x in lists:
        offsets.append(offsets[-1] + len(x))
    n = offsets[-1]
    whole = -(-n_k // cfg.BLOCK_N) << 16
    return torch.tensor(offsets + [t for x in lists for t in x] + [whole] * n + [-1] * n,
                        dtype=torch.int32, device="cuda")


def _variant(name, spec, q, k, v, causal, base, entry):
    path, conf = spec.split(":", 1)
    cfg = (AttentionConfig.parse(conf.lstrip("+"), base=base) if conf.startswith("+")
           else AttentionConfig.parse(f"{entry},{conf}" if conf else entry))
    if name.startswith("A"):
        return cfg, lambda: flashscope.attention(q, k, v, is_causal=causal, config=cfg)
    fn = (kernels.load("attention_fwd_sm90") if path == "-" else _module(path))._attn_fwd_sm90
    out = torch.empty_like(q)
    scale = q.shape[-1] ** -0.5
    grid, args, consts = launch.forward_call(q, k, v, out, None, causal=causal, scale=scale,
                                             cfg=cfg)
    opts = launch.launch_options(cfg, q.device)
    plan = launch.gluon_plan(q, k, v, out, None, causal=causal, scale=scale, cfg=cfg)
    part = args[6]
    if name.endswith("U"):
        args = (*args[:5], _uncut(plan, cfg, q.shape[2], k.shape[2], grid[0]), *args[6:])
    kernel = not name.startswith("M")
    merge = not (name.endswith("U") or name.endswith("N"))

    def run():
        if kernel:
            fn[grid](*args, **consts, **opts)
        if merge:
            plan.merge(part, out, None)
        return out
    out.fill_(float("nan"))
    fn[grid](*args, **consts, **opts)
    plan.merge(part, out, None)
    return cfg, run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, help="B,H,Nq,Nk,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--flush", action="store_true", help="evict L2 before every launch")
    ap.add_argument("--entry", default=ENTRY, help="the config plain CONFIGs build on")
    ap.add_argument("variants", nargs="+", help="NAME=FILE:CONFIG (module docstring)")
    a = ap.parse_args()
    B, H, n_q, n_k, D = map(int, a.shape.split(","))
    q = torch.randn(B, H, n_q, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, H, n_k, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                               is_causal=a.causal).float()
    base = api._default_config(q, k, v, a.causal)
    names, fns = [], []
    for item in a.variants:
        name, spec = item.split("=", 1)
        cfg, run = _variant(name, spec, q, k, v, a.causal, base, a.entry)
        out = run()
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        print(f"{name}: {cfg.key}, relative error {err:.2e}", flush=True)
        names.append(name)
        fns.append(run)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda") if a.flush else None
    times = {n: [] for n in names}
    for order in round_orders(len(fns), a.rounds):
        for i in order:
            times[names[i]].append(_burst(fns[i], a.reps, flush))
    print(f"shape {a.shape} causal={a.causal} rounds {a.rounds}"
          f"{' L2 flushed' if a.flush else ''}")
    for n in names:
        ratios = sorted(t / b for t, b in zip(times[n], times[names[0]]))
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        print(f"{n:>8} {statistics.median(times[n]):.4f} ms  {statistics.median(ratios):.4f} "
              f"({q1:.4f}-{q3:.4f})")


if __name__ == "__main__":
    main()
