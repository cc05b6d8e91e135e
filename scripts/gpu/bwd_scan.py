"""Time backward configs on a GPU: the three backward kernels alone
(:func:`flashscope.launch.backward` on the forward's output and log-sum-exp), the
problem's default first, every config's gradients checked against a float32 reference
before it is timed. No command does this: ``flashscope bench --mode bwd`` times the
default backward against the peers, and ``flashscope sweep`` reads backward configs
offline only.

The shape is the standard suite's (B*N = 16384, H*D = 2048, bf16) at --head-dim and --n.
A config is ``K=V,...`` of :class:`flashscope.TritonBwdConfig` on top of the problem's
default; configs are separated by ``;``. Writes OUTDIR/bwd_scan.json.

Usage: PYTHONPATH=src python scripts/gpu/bwd_scan.py OUTDIR --head-dim 256 --n 4096 \\
       --configs "BLOCK_M1=64,BLOCK_N1=64,BLOCK_M2=64,BLOCK_N2=64,num_warps=8,num_stages=2"
"""

import argparse
import json
import time
from pathlib import Path

import torch
import triton

import flashscope
from flashscope import api, launch
from flashscope.bench.validate import GRAD_BOUND
from flashscope.families import default_backward, family
from flashscope.masks import Mask
from flashscope.testing.reference import reference_attention_grads, rel_error

MASKS = {"no": (False,), "yes": (True,), "both": (False, True)}


def scan(head_dim: int, n: int, texts: list, causal: bool) -> list:
    """One row per config (the default first): its label, knobs off the family's defaults,
    gradient errors, and ms and TFLOP/s, or the reason it was not timed."""
    B, H = 16384 // n, 2048 // head_dim
    q, k, v, dout = (torch.randn(B, H, n, head_dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    mask, scale = Mask(causal=causal), launch.default_scale(head_dim)
    out, lse = flashscope.attention(q, k, v, is_causal=causal, return_lse=True)
    ref = reference_attention_grads(q, k, v, dout, is_causal=causal,
                                    compute_dtype=torch.float32)[1:]
    target = launch.device_target(q.device)
    default = default_backward(api.problem_of(q, k, mask, target))
    flops = 2.5 * 4 * B * H * n * n * head_dim * (0.5 if causal else 1.0)
    rows = []
    for text in ["", *texts]:
        cfg = flashscope.TritonBwdConfig.parse(text, base=default)
        family(cfg.KERNEL).check(cfg, target, head_dim, "bfloat16")

        def run(cfg=cfg):
            return launch.backward(dout, q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg)

        errors = [rel_error(got, want) for got, want in zip(run(), ref)]
        row = {"head_dim": head_dim, "n": n, "causal": causal, "config": cfg.label,
               "knobs": cfg.diff(), "default": not text, "errors_dq_dk_dv": errors}
        if not max(errors) <= GRAD_BOUND[torch.bfloat16]:
            row["failed"] = f"relative error {max(errors):.2e} > {GRAD_BOUND[torch.bfloat16]}"
        else:
            row["ms"] = triton.testing.do_bench(run, warmup=10, rep=50)
            row["tflops"] = flops / row["ms"] / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--n", type=int, default=4096, help="sequence length (default 4096)")
    ap.add_argument("--configs", default="", help="K=V,... of TritonBwdConfig, ';' between")
    ap.add_argument("--causal", choices=tuple(MASKS), default="both")
    args = ap.parse_args(argv)
    texts = [t.strip() for t in args.configs.split(";") if t.strip()]
    rows = [row for causal in MASKS[args.causal]
            for row in scan(args.head_dim, args.n, texts, causal)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bwd_scan.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
