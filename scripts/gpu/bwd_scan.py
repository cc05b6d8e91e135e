"""Time backward configs on a GPU: the three backward kernels alone
(:func:`flashscope.launch.backward` on the forward's output and log-sum-exp), the
problem's default first, every config's gradients checked against a float32 reference
before it is timed. No command does this: ``flashscope bench --mode bwd`` times the
default backward against the peers, and ``flashscope sweep`` reads backward configs
offline only.

The shape is the standard suite's (B*N = 16384, H*D = 2048, bf16) at --head-dim and --n.
A config is ``K=V,...`` of :class:`flashscope.TritonBwdConfig` on top of the problem's
default; configs are separated by ``;``. Writes OUTDIR/bwd_scan.json, stamped as the
bench's results are; each finished row is also kept in OUTDIR/bwd_scan.partial.jsonl as
it is timed, so a sweep stopped by a signal or a time limit keeps what it finished.

Usage: PYTHONPATH=src python scripts/gpu/bwd_scan.py OUTDIR --head-dim 256 --n 4096 \\
       --configs "BLOCK_M1=64,BLOCK_N1=64,BLOCK_M2=64,BLOCK_N2=64,num_warps=8,num_stages=2"
"""

import argparse
import json
import shlex
import sys

import torch
import triton

import flashscope
from flashscope import api, launch
from flashscope.bench.output import stamp
from flashscope.bench.validate import GRAD_BOUND
from flashscope.commands.common import check_out_dir
from flashscope.errors import FlashscopeError
from flashscope.families import default_backward, family
from flashscope.masks import Mask
from flashscope.outfiles import PartialLines, json_text, write_atomic
from flashscope.testing.reference import reference_attention_grads, rel_error

MASKS = {"no": (False,), "yes": (True,), "both": (False, True)}
#: each finished row as it is timed, removed once bwd_scan.json holds them all
PARTIAL = "bwd_scan.partial.jsonl"


def scan(head_dim: int, n: int, texts: list, causal: bool, keep=None) -> list:
    """One row per config (the default first): its label, knobs off the family's defaults,
    gradient errors, and ms and TFLOP/s, or the reason it was not timed. ``keep``: a
    :class:`~flashscope.outfiles.PartialLines` each finished row is added to."""
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
        try:
            family(cfg.KERNEL).check(cfg, target, head_dim, "bfloat16")
        except FlashscopeError as e:  # the family's rules for this problem: a row
            rows.append({"head_dim": head_dim, "n": n, "causal": causal,
                         "config": cfg.label, "default": not text, "failed": str(e)})
            continue

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
        if keep is not None:
            keep.add(row)
    return rows


def _checked(args) -> tuple:
    """(config texts, the output folder) from the arguments, in the order given; a
    :class:`FlashscopeError` names the first that is wrong (or the missing GPU), before
    anything is written."""
    if not (1 <= args.head_dim <= 2048 and 2048 % args.head_dim == 0):
        raise FlashscopeError(f"--head-dim {args.head_dim}: expected a divisor of 2048 (H x "
                              "D is the suite's 2048), e.g. 64, 128, 256")
    if not (1 <= args.n <= 16384 and 16384 % args.n == 0):
        raise FlashscopeError(f"--n {args.n}: expected a divisor of 16384 (B x N is the "
                              "suite's 16384), e.g. 1024, 4096")
    try:
        texts = flashscope.TritonBwdConfig.parse_list(args.configs)
    except FlashscopeError as e:
        raise FlashscopeError(f"--configs {e}") from None
    out = check_out_dir(args.outdir, ("bwd_scan.json", PARTIAL), args.force, "OUTDIR")
    if not torch.cuda.is_available():
        raise FlashscopeError("no GPU visible: the scan times the suite's shapes on one")
    return texts, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--n", type=int, default=4096, help="sequence length (default 4096)")
    ap.add_argument("--configs", default="", help="K=V,... of TritonBwdConfig, ';' between")
    ap.add_argument("--causal", choices=tuple(MASKS), default="both")
    ap.add_argument("--force", action="store_true",
                    help="replace the results of an earlier sweep in OUTDIR")
    args = ap.parse_args(argv)
    try:
        texts, out = _checked(args)
    except FlashscopeError as e:
        print(f"bwd_scan: {e}")
        return 2
    keep = PartialLines(lambda: out.file(PARTIAL))
    rows = [row for causal in MASKS[args.causal]
            for row in scan(args.head_dim, args.n, texts, causal, keep=keep)]
    argv = sys.argv[1:] if argv is None else argv
    meta = {**stamp("cuda"), "command": shlex.join(["scripts/gpu/bwd_scan.py", *argv])}
    write_atomic(out.file("bwd_scan.json"), json_text({"meta": meta, "rows": rows}))
    keep.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
