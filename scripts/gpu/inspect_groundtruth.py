"""Ground truth for `flashscope inspect` on an H100: launch the real forward kernel for a
set of configs and compare the offline numbers with what the launch reports.

Modes:
  launch (default): for each config, run flashscope.attention with config=...; read n_regs,
      n_spills and metadata.shared from the kernel Triton launched, and the offline record
      (compiled without a GPU for sm90); write OUTDIR/inspect_groundtruth.json with both and
      the comparison.
  ncu: launch each config exactly once in a fixed order and write OUTDIR/ncu_order.json
      (configs + offline values); run it under Nsight Compute:

  ncu --clock-control none --print-units base --csv --log-file OUTDIR/ncu.csv \\
      --metrics launch__registers_per_thread,launch__shared_mem_per_block_static,\\
launch__shared_mem_per_block_dynamic,launch__block_size \\
      python scripts/gpu/inspect_groundtruth.py OUTDIR --mode ncu

  then `python scripts/gpu/inspect_groundtruth.py OUTDIR --mode compare` writes
  OUTDIR/ncu_compare.json (flashscope.isa.groundtruth.compare_ncu).

The problem is the one offline builds bind (flashscope.compile.DEFAULT_PROBLEM: B=2, H=16,
N=1024, contiguous bf16), so both compile the same specialization.
Usage: PYTHONPATH=src python scripts/gpu/inspect_groundtruth.py OUTDIR [--mode M]
"""

import argparse
import json
import os
from pathlib import Path

CONFIGS = (  # (head_dim, causal, config text)
    (64, False, "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"),
    (128, False, "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"),
    (128, True, "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=3"),
    (128, False, "BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=2"),
    (128, False, "BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=2,maxnreg=96"),
    (256, False, "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2"),
    (64, True, "BLOCK_M=64,BLOCK_N=32,num_warps=4,num_stages=1,Q_IN_REGS=false"),
    (128, False, "BLOCK_M=128,BLOCK_N=128,num_warps=4,num_stages=2"),
)

OFFLINE_FIELDS = ("registers", "static_shared_bytes", "dynamic_shared_bytes", "local_bytes",
                  "spill_stores", "spill_loads", "threads", "features")


def offline(cfg, head_dim, causal):
    from flashscope.isa import inspect_config

    r = inspect_config(cfg, "sm90", head_dim=head_dim, causal=causal, occupancy=False)
    return {k: getattr(r, k) for k in OFFLINE_FIELDS}


def launch(cfg, head_dim, causal):
    """Run the forward once with a fresh in-memory JIT cache; return the launched kernel."""
    import torch

    import flashscope
    from flashscope import kernels
    from flashscope.compile import DEFAULT_PROBLEM

    fn = kernels.load("attention_fwd", interpret=False)._attn_fwd
    fn.device_caches.clear()
    B, H, Hkv, Nq, Nk = DEFAULT_PROBLEM
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, Nq, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, Nk, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, Nk, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    flashscope.attention(q, k, v, is_causal=causal, config=cfg)
    torch.cuda.synchronize()
    (kernel,) = fn.device_caches[torch.cuda.current_device()][0].values()
    return kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--mode", choices=("launch", "ncu", "compare"), default="launch")
    a = ap.parse_args()
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FLASHSCOPE_CACHE", str(out / "flashscope-cache"))
    from flashscope.config import AttentionConfig
    from flashscope.isa.groundtruth import compare_launch, compare_ncu

    if a.mode == "compare":
        order = json.loads((out / "ncu_order.json").read_text())
        rows = compare_ncu(order, (out / "ncu.csv").read_text(errors="replace"))
        (out / "ncu_compare.json").write_text(json.dumps({"rows": rows}, indent=1))
        bad = [r for r in rows if not r["equal"]]
        print(f"{len(rows) - len(bad)}/{len(rows)} equal", *bad, sep="\n")
        return
    rows = []
    for head_dim, causal, text in CONFIGS:
        cfg = AttentionConfig.parse(text)
        row = {"config": cfg.key, "head_dim": head_dim, "causal": causal,
               "offline": offline(cfg, head_dim, causal)}
        kernel = launch(cfg, head_dim, causal)
        if a.mode == "launch":
            row["launched"] = {"n_regs": kernel.n_regs, "n_spills": kernel.n_spills,
                               "shared": kernel.metadata.shared,
                               "num_warps": kernel.metadata.num_warps}
        rows.append(row)
    if a.mode == "ncu":
        (out / "ncu_order.json").write_text(json.dumps({"rows": rows}, indent=1))
        return
    import torch
    import triton

    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "rows": rows}
    doc["compare"] = compare_launch(doc)
    (out / "inspect_groundtruth.json").write_text(json.dumps(doc, indent=1))
    bad = [r for r in doc["compare"] if not r["equal"]]
    print(f"{len(doc['compare']) - len(bad)}/{len(doc['compare'])} equal", *bad, sep="\n")


if __name__ == "__main__":
    main()
