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
variants are expected to differ). Timed and printed as :mod:`ab` does
(:func:`ab.interleaved`, :func:`ab.report`): bursts of ``--reps`` launches in shuffled
rounds; median ms, TFLOP/s and the median (IQR) of each round's time over the first
variant's.

Usage: PYTHONPATH=src python scripts/gpu/ab_kernels.py --shape 1,44,576,131072,64
       [--rounds 160] [--reps 10] [--flush] E=-: V=-:SPLIT_KV=1 O=old.py:SPLIT_KV=1
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import _provider, interleaved, report  # noqa: E402
from ab_file import _module  # noqa: E402

import flashscope  # noqa: E402
from flashscope import api, kernels, launch  # noqa: E402
from flashscope.config import AttentionConfig  # noqa: E402
from flashscope.schedule import pack_entries  # noqa: E402

ENTRY = ("BLOCK_M=192,BLOCK_N=128,num_warps=4,num_stages=3,Q_IN_REGS=0,TMA=1,OVERLAP=2,"
         "GLUON=1,PERSISTENT=1,PINGPONG=1,MASKED_FIRST=1")


def _uncut(plan, cfg, n_q, n_k, programs):
    """A SPLIT_KV work list of whole blocks dealt round-robin, no piece cut."""
    tiles = plan.scalars[4] * -(-n_q // cfg.BLOCK_M)
    whole = -(-n_k // cfg.BLOCK_N)
    entries = [[(t, 0, whole) for t in range(p, tiles, programs)] for p in range(programs)]
    return torch.from_numpy(pack_entries(entries, {})).to("cuda")


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


def main(argv=None):
    """``argv``: the arguments (sys.argv[1:] when None)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, help="B,H,Nq,Nk,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--flush", action="store_true", help="evict L2 before every launch")
    ap.add_argument("--entry", default=ENTRY, help="the config plain CONFIGs build on")
    ap.add_argument("variants", nargs="+", help="NAME=FILE:CONFIG (module docstring)")
    a = ap.parse_args(argv)
    B, H, n_q, n_k, D = map(int, a.shape.split(","))
    if n_q != n_k and a.causal:
        sys.exit("--shape: Nq != Nk is timed non-causal only (as ab.py --nk)")
    q = torch.randn(B, H, n_q, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, H, n_k, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ref = _provider("cudnn", q, k, v, a.causal)().float()
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
    times = interleaved(names, fns, a.rounds, a.reps, a.flush)
    a.shape, a.nk, a.json = f"{B},{H},{n_q},{D}", n_k, None
    report(a, names, times)


if __name__ == "__main__":
    main()
