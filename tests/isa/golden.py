"""Golden cases for the ISA readers, one file of values per Triton release.

The compiler's output differs between releases (Triton's passes, and the ptxas each one
runs: :func:`flashscope.compat.ptxas`), so each release has its own values in
``tests/data/isa/golden/triton-<version>.json``. Regenerate the running Triton's file
(after a deliberate kernel change, or for a new release) with

    PYTHONPATH=src python tests/isa/golden.py --write

in an environment with that Triton (for one without it: ``python -m venv V; V/bin/pip
install torch==2.13.0 triton==<version> 'numpy<2.4' pyelftools msgpack rich matplotlib``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "isa" / "golden"

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


def golden_path(version: str) -> Path:
    """The file of golden values for Triton ``version``."""
    return GOLDEN_DIR / f"triton-{version}.json"


def ptxas_version(target: str):
    """The version of the ptxas this Triton runs for ``target`` (None for AMD targets):
    NVIDIA values depend on it, and a GPU image may point Triton at its CUDA's."""
    from flashscope.compat import ptxas
    from flashscope.targets import get_target

    t = get_target(target)
    return ptxas(t.triton_arch).version if t.vendor == "nvidia" else None


def record(case):
    from flashscope import TritonFwdConfig
    from flashscope.isa import inspect_config

    target, cfg, d, causal = case
    return inspect_config(TritonFwdConfig.parse(cfg), target, head_dim=d, causal=causal,
                          occupancy=False)


def main():
    import triton

    out = {"triton": triton.__version__, "cases": {}}
    for case in CASES:
        r = record(case).as_dict()
        out["cases"][case_id(case)] = {**{k: r[k] for k in FIELDS},
                                       "ptxas": ptxas_version(case[0])}
    text = json.dumps(out, indent=1, sort_keys=True) + "\n"
    if "--write" in sys.argv:
        path = golden_path(triton.__version__)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
