"""Replay the H100 runtime readings (tests/data/occupancy/nvidia_h100_runtime.json, made by
scripts/gpu/occupancy_validate.py) against the calculator: every case must agree."""

import json
from pathlib import Path

from flashscope.occupancy import occupancy

DATA = json.loads((Path(__file__).parents[1] / "data/occupancy/nvidia_h100_runtime.json")
                  .read_text())


def test_runtime_api_agrees_on_every_case():
    bad = []
    for r in DATA["readings"]:
        occ = occupancy(DATA.get("target", "sm90"), threads=r["threads"], regs=r["regs"],
                        smem=r["dynamic_smem"] + r.get("static_smem", 0))
        if occ.active_blocks != r["active_blocks"]:
            bad.append((r, occ.active_blocks, occ.limits))
    assert not bad, bad[:5]
    assert len(DATA["readings"]) >= 4


def test_ncu_shared_mem_limit_is_the_launch_carveout_view():
    ncu = json.loads((Path(__file__).parents[1] / "data/occupancy/nvidia_h100_ncu.json")
                     .read_text())
    assert ncu["readings"]
    for r in ncu["readings"]:
        occ = occupancy("sm90", threads=r["threads"], regs=r["regs"],
                        smem=r["dynamic_smem"] + r.get("static_smem", 0))
        assert occ.details["launch_shared_mem_limit"] == r["launch__occupancy_limit_shared_mem"]
        if "launch__occupancy_limit_registers" in r:
            assert occ.limits["registers"] == r["launch__occupancy_limit_registers"]
            assert occ.limits["warps"] == r["launch__occupancy_limit_warps"]
            assert occ.limits["blocks"] == r["launch__occupancy_limit_blocks"]
            assert round(100 * occ.occupancy, 2) == r["sm__maximum_warps_per_active_cycle_pct"]


def test_ncu_covers_real_attention_kernels():
    """cuDNN, FlashAttention-2, the memory-efficient kernel and five flashscope configs,
    read by ncu on the H100 (`flashscope profile`, docs/profile.md)."""
    ncu = json.loads((Path(__file__).parents[1] / "data/occupancy/nvidia_h100_ncu.json")
                     .read_text())
    providers = {r.get("provider") for r in ncu["readings"]}
    assert {"cudnn", "flash", "efficient", "flashscope"} <= providers
