"""Time backward configs on a GPU: the backward kernels alone
(:func:`flashscope.launch.backward` on the forward's output and log-sum-exp), the
problem's default first, then each config given, and with ``--peers cudnn`` cuDNN's
backward (SDPA, ``torch.autograd.grad`` of a recorded call) on the same tensors. Every
config's gradients are checked against a float32 reference before it is timed. No
command does this: ``flashscope bench --mode bwd`` times the default backward against
the peers, and ``flashscope sweep`` reads backward configs offline only.

Shapes: ``--shape B,H,N,D[,Nk,Hkv]`` (repeatable, as ``flashscope bench --shape``), or
the standard suite's (B*N = 16384, H*D = 2048, bf16) at --head-dim and --n. A config is
``[family:]K=V,...`` of a backward family (``sm90-bwd:BLOCK_M=64``, ``triton-bwd:`` for
that family's rule as it is), a bare one of the default's family, on top of the family's
rule for the problem; configs are separated by ``;``. A config the family's rules refuse
for a problem is a row with the reason. GPU time with the L2 flushed and the host kept
out (:func:`flashscope.bench.timing.gpu_time`, what ``bench --hide-host`` runs): a short
backward takes the host longer to queue than its kernels run, and do_bench's events
would time the host. ``--rounds R`` times the rows of a problem in turn R times, in
alternating order, and keeps each one's median; ``of_default`` is the default's median
over the row's. Writes OUTDIR/bwd_scan.json, stamped as the bench's results are; each
finished problem's rows are also kept in OUTDIR/bwd_scan.partial.jsonl as they are
timed, so a sweep stopped by a signal or a time limit keeps what it finished.

Usage: PYTHONPATH=src python scripts/gpu/bwd_scan.py OUTDIR --shape 32,16,577,64 \\
       --shape 64,12,197,128 --causal no --configs "sm90-bwd:BLOCK_M=64;triton-bwd:" \\
       --peers cudnn --rounds 4
"""

import argparse
import json
import shlex
import statistics
import sys

import torch

import flashscope
from flashscope import api, launch
from flashscope.bench.output import stamp
from flashscope.bench.suite import SUITE_TOKENS, SUITE_WIDTH, Case, case_flops, parse_shape
from flashscope.bench.timing import gpu_time
from flashscope.bench.validate import GRAD_BOUND
from flashscope.commands.common import check_out_dir
from flashscope.errors import FlashscopeError
from flashscope.families import BACKWARD, config_from_text, default_backward, family
from flashscope.masks import Mask
from flashscope.outfiles import PartialLines, json_text, write_atomic
from flashscope.testing.reference import reference_attention_grads, rel_error

MASKS = {"no": (False,), "yes": (True,), "both": (False, True)}
KERNELS = tuple(m.KERNEL for m in BACKWARD)
PEERS = ("cudnn",)
#: each finished row as it is timed, removed once bwd_scan.json holds them all
PARTIAL = "bwd_scan.partial.jsonl"


def knowing(body: str) -> list:
    """The backward families whose configs have every key of ``K=V,...`` ``body`` (all of
    them for an empty one)."""
    keys = {p.split("=", 1)[0].strip() for p in body.split(",") if p.strip()}
    return [n for n in KERNELS if keys <= set(family(n).Config().as_dict())]


def parse_configs(text: str) -> list:
    """The ``;``-separated configs of ``text`` as (family or None, ``K=V,...``), each
    checked to parse: a prefix names a backward family, a bare config parses for a family
    that has its keys; a :class:`FlashscopeError` names the first that does not."""
    out = []
    for t in (t.strip() for t in str(text or "").split(";")):
        if not t:
            continue
        name, sep, body = t.partition(":")
        if sep and name not in KERNELS:
            raise FlashscopeError(f"{t!r}: {name!r} is not a backward family; expected one "
                                  f"of {', '.join(KERNELS)} before ':'")
        body = body if sep else t
        name = name if sep else (knowing(body) or [KERNELS[-1]])[0]
        try:
            family(name).Config.parse(body)
        except FlashscopeError as e:
            raise FlashscopeError(f"{t!r}: {e}") from None
        out.append((name if sep else None, body))
    return out


def suite_shape(head_dim: int, n: int) -> tuple:
    """The standard suite's shape at ``head_dim`` and ``n``, as :func:`parse_shape` gives
    one."""
    B, H = SUITE_TOKENS // n, SUITE_WIDTH // head_dim
    return B, H, n, head_dim, n, H


def resolve(kernel, body: str, problem, default, target: str):
    """The config of (``kernel``, ``body``) for ``problem``, a bare ``body`` in the
    default's family where that has its keys, else in the family that has: on top of
    ``default`` in the default's family, else of that family's rule, checked against the
    family's rules (a :class:`FlashscopeError` says why not)."""
    fits = knowing(body)
    name = kernel or (default.KERNEL if default.KERNEL in fits or not fits else fits[0])
    cfg = config_from_text(body, problem, kernel=name,
                           base=default if name == default.KERNEL else None)
    family(cfg.KERNEL).check(cfg, target, problem.head_dim, problem.dtype)
    return cfg


def scan(shape: tuple, configs: list, causal: bool, peers=(), rounds: int = 1,
         keep=None) -> list:
    """Rows for one problem (the default first, then ``configs``, then ``peers``): label,
    knobs, gradient errors, then the median ms, TFLOP/s and ``of_default``, or the reason
    a row was not timed. ``keep``: a :class:`~flashscope.outfiles.PartialLines` the
    problem's rows are added to once timed."""
    B, H, N, D, Nk, Hkv = shape
    dt = torch.bfloat16
    q, dout = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", dtype=dt) for _ in range(2))
    mask, scale = Mask(causal=causal), launch.default_scale(D)
    out, lse = flashscope.attention(q, k, v, is_causal=causal, return_lse=True,
                                    enable_gqa=Hkv != H)
    ref = reference_attention_grads(q, k, v, dout, is_causal=causal,
                                    compute_dtype=torch.float32)[1:]
    target = launch.device_target(q.device)
    problem = api.problem_of(q, k, mask, target)
    default = default_backward(problem)
    flops = case_flops(Case(B, H, N, Nk, D, Hkv, causal, mode="bwd"))
    head = {"shape": ",".join(map(str, shape)), "causal": causal}
    rows, steps = [], []
    for kernel, body in [(default.KERNEL, None), *configs]:
        row = dict(head, default=body is None)
        try:
            cfg = default if body is None else resolve(kernel, body, problem, default, target)
        except FlashscopeError as e:  # the family's rules for this problem
            rows.append({**row, "config": f"{kernel or ''}:{body}", "failed": str(e)})
            continue

        def step(cfg=cfg):
            return launch.backward(dout, q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg)

        row.update(config=cfg.label, kernel=cfg.KERNEL, knobs=cfg.diff())
        rows.append(row)
        steps.append((row, step))
    if "cudnn" in peers:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        row = dict(head, default=False, config="cudnn", kernel="sdpa-cudnn")
        rows.append(row)
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                o2 = torch.nn.functional.scaled_dot_product_attention(
                    qq, kk, vv, is_causal=causal, enable_gqa=Hkv != H)
        except RuntimeError as e:  # no cuDNN kernel for this problem
            row["failed"] = str(e).splitlines()[0]
        else:
            steps.append((row, lambda: torch.autograd.grad(o2, (qq, kk, vv), dout,
                                                           retain_graph=True)))
    timed = []
    for row, step in steps:
        errors = [rel_error(got, want) for got, want in zip(step(), ref)]
        row["errors_dq_dk_dv"] = errors
        if not max(errors) <= GRAD_BOUND[torch.bfloat16]:
            row["failed"] = f"relative error {max(errors):.2e} > {GRAD_BOUND[torch.bfloat16]}"
        else:
            timed.append((row, step))
    times = {id(row): [] for row, _ in timed}
    for r in range(rounds):
        for row, step in (timed if r % 2 == 0 else timed[::-1]):
            times[id(row)].append(gpu_time(step))
    for row, _ in timed:
        row["ms"] = statistics.median(times[id(row)])
        row["ms_rounds"] = times[id(row)]
        row["tflops"] = flops / row["ms"] / 1e9
    base = next((row["ms"] for row in rows if row["default"] and "ms" in row), None)
    for row in rows:
        if base and "ms" in row:
            row["of_default"] = base / row["ms"]
        print(json.dumps(row), flush=True)
        if keep is not None:
            keep.add(row)
    return rows


def _checked(args) -> tuple:
    """(shapes, configs, peers, the output folder) from the arguments; a
    :class:`FlashscopeError` names the first that is wrong (or the missing GPU), before
    anything is written."""
    if args.shape:
        shapes = [parse_shape(s) for s in args.shape]
    else:
        if args.head_dim is None:
            raise FlashscopeError("--shape or --head-dim: expected one (a shape B,H,N,D or "
                                  "the standard suite's at --head-dim and --n)")
        if not (1 <= args.head_dim <= 2048 and 2048 % args.head_dim == 0):
            raise FlashscopeError(f"--head-dim {args.head_dim}: expected a divisor of 2048 "
                                  "(H x D is the suite's 2048), e.g. 64, 128, 256")
        if not (1 <= args.n <= 16384 and 16384 % args.n == 0):
            raise FlashscopeError(f"--n {args.n}: expected a divisor of 16384 (B x N is "
                                  "the suite's 16384), e.g. 1024, 4096")
        shapes = [suite_shape(args.head_dim, args.n)]
    try:
        configs = parse_configs(args.configs)
    except FlashscopeError as e:
        raise FlashscopeError(f"--configs {e}") from None
    peers = [p.strip() for p in (args.peers or "").split(",") if p.strip()]
    for p in peers:
        if p not in PEERS:
            raise FlashscopeError(f"--peers {p!r}: expected a comma list of "
                                  f"{', '.join(PEERS)}")
    if args.rounds < 1:
        raise FlashscopeError(f"--rounds {args.rounds}: expected 1 or more")
    out = check_out_dir(args.outdir, ("bwd_scan.json", PARTIAL), args.force, "OUTDIR")
    if not torch.cuda.is_available():
        raise FlashscopeError("no GPU visible: the scan times backward kernels on one")
    return shapes, configs, peers, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--shape", action="append",
                    help="B,H,N,D[,Nk,Hkv], repeatable (default: the suite's shape)")
    ap.add_argument("--head-dim", type=int, help="the suite's shape at this head dim")
    ap.add_argument("--n", type=int, default=4096, help="the suite's length (default 4096)")
    ap.add_argument("--configs", default="",
                    help="[family:]K=V,... of a backward family, ';' between")
    ap.add_argument("--causal", choices=tuple(MASKS), default="both")
    ap.add_argument("--peers", default="", help="comma list: cudnn")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of every row in turn, alternating order (default 3)")
    ap.add_argument("--force", action="store_true",
                    help="replace the results of an earlier sweep in OUTDIR")
    args = ap.parse_args(argv)
    try:
        shapes, configs, peers, out = _checked(args)
    except FlashscopeError as e:
        print(f"bwd_scan: {e}")
        return 2
    keep = PartialLines(lambda: out.file(PARTIAL))
    rows = [row for shape in shapes for causal in MASKS[args.causal]
            for row in scan(shape, configs, causal, peers, args.rounds, keep=keep)]
    argv = sys.argv[1:] if argv is None else argv
    meta = {**stamp("cuda"), "command": shlex.join(["scripts/gpu/bwd_scan.py", *argv])}
    write_atomic(out.file("bwd_scan.json"), json_text({"meta": meta, "rows": rows}))
    keep.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
