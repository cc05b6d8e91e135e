"""Golden cases for the ISA readers, pinned to Triton 3.6.0.

Regenerate (after a deliberate kernel or Triton change):
    PYTHONPATH=src python tests/isa/golden.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "isa" / "golden.json"

#: (target, config text, head_dim, causal): small head dims keep compiles fast.
CASES = (
    ("sm90", "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3", 64, False),
    ("sm80", "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2", 64, True),
    ("sm80", "BLOCK_M=128,BLOCK_N=64,num_warps=4,num_stages=2,maxnreg=32", 64, False),
    ("gfx942", "BLOCK_M=64,BLOCK_N=32,num_warps=4,num_stages=1", 64, False),
)

#: Fields pinned per case.
FIELDS = ("registers", "agprs", "sgprs", "spill_stores", "spill_loads", "vgpr_spills",
          "sgpr_spills", "local_bytes", "static_shared_bytes", "dynamic_shared_bytes",
          "reserved_shared_bytes", "shared_bytes", "threads", "barriers", "instructions", "mix", "features")


def case_id(case) -> str:
    target, cfg, d, causal = case
    return f"{target}-{cfg.replace('=', '').replace(',', '-')}-d{d}{'-causal' if causal else ''}"


def record(case):
    from flashscope import TritonFwdConfig
    from flashscope.isa import inspect_config

    target, cfg, d, causal = case
    return inspect_config(TritonFwdConfig.parse(cfg), target, head_dim=d, causal=causal,
                          occupancy=False)


def main():
    import triton

    out = {"triton": triton.__version__, "ptxas": triton.knobs.nvidia.ptxas.version,
           "cases": {}}
    for case in CASES:
        r = record(case).as_dict()
        out["cases"][case_id(case)] = {k: r[k] for k in FIELDS}
    if "--write" in sys.argv:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    else:
        print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
