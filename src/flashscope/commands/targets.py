"""``flashscope targets``: every compile target with its hardware facts (the tables the
occupancy calculator reads) and whether Triton (3.6 to 3.9) compiles for it."""

from __future__ import annotations

import dataclasses
import json

#: Triton's backends (3.6 to 3.9): CUDA for sm_80 and later; HIP for CDNA2+ and RDNA3+.
TRITON_VENDORS = ("nvidia", "amd")


def register(sub):
    p = sub.add_parser("targets", help="list targets, their hardware facts and Triton support")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def rows() -> list:
    from ..targets import ALL_TARGETS

    out = []
    for t in ALL_TARGETS:
        d = dataclasses.asdict(t)
        d["warp_size"] = t.warp_size
        d["smem_per_block_optin"] = t.smem_per_block_optin
        d["max_regs_per_thread"] = t.max_regs_per_thread
        d["triton_compiles"] = bool(t.triton_supported and t.vendor in TRITON_VENDORS)
        out.append(d)
    return out


def run(args) -> int:
    data = rows()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("target", "family", "example", "units", "warp", "max warps/unit",
                  "regs (file)", "smem/LDS per block", "per unit", "Triton")
    for d in data:
        if d["vendor"] == "nvidia":
            table.add_row(d["name"], d["family"], d["example"], f"{d['sm_count']} SM", "32",
                          str(d["max_warps_per_sm"]), f"{d['max_regs_per_thread']} ({d['regs_per_sm']})",
                          f"{d['smem_per_block_optin'] // 1024} KB",
                          f"{d['smem_per_sm'] // 1024} KB", "yes" if d["triton_compiles"] else "no")
        else:
            table.add_row(d["name"], d["family"], d["example"], f"{d['cu_count']} CU",
                          str(d["wave_size"]), str(d["max_waves_per_simd"] * d["simds_per_unit"]),
                          f"{d['max_vgprs_per_wave']} ({d['vgprs_per_simd_lane']}/lane)",
                          f"{d['lds_per_workgroup'] // 1024} KB",
                          f"{d['lds_per_cu'] // 1024} KB/{d['unit']}",
                          "yes" if d["triton_compiles"] else "no")
    Console().print(table)
    return 0
