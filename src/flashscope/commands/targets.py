"""``flashscope targets``: every compile target with its hardware facts (the tables the
occupancy calculator reads), the product names that resolve to it, and whether Triton (3.6
to 3.9) compiles for it."""

from __future__ import annotations

import dataclasses

from . import common

#: Triton's backends (3.6 to 3.9): CUDA for sm_80 and later; HIP for CDNA2+ and RDNA3+.
TRITON_VENDORS = ("nvidia", "amd")


def register(sub):
    p = sub.add_parser("targets", help="list targets, their hardware facts and Triton support",
                       description=__doc__)
    common.add_target(p, default=None, help="only these targets (comma list, e.g. "
                                            "H100,MI300X); default: all")
    common.add_output(p)
    p.set_defaults(func=run)


def rows(targets=None) -> list:
    from ..targets import ALL_TARGETS, PRODUCTS

    out = []
    for t in targets or ALL_TARGETS:
        d = dataclasses.asdict(t)
        d["warp_size"] = t.warp_size
        d["smem_per_block_optin"] = t.smem_per_block_optin
        d["max_regs_per_thread"] = t.max_regs_per_thread
        d["triton_compiles"] = bool(t.triton_supported and t.vendor in TRITON_VENDORS)
        d["products"] = [p for p, a in PRODUCTS.items() if a == t.name]
        out.append(d)
    return out


def run(args) -> int:
    common.prepare(args)
    data = rows(args.target)
    common.emit(args, data, rows=data, render=lambda con: common.show(con, _table(data)))
    return 0


def _table(data):
    t = common.table("target", "family", "example", "units", "warp", "warps per unit",
                     "regs per thread", "reg file", "smem per block", "smem per unit",
                     "Triton",
                     title="Compile targets (products such as H100 or MI300X resolve too; "
                           "--json lists them)",
                     left=("target", "family", "example"))
    for d in data:
        if d["vendor"] == "nvidia":
            t.add_row(d["name"], d["family"], d["example"], f"{d['sm_count']} SM", "32",
                      str(d["max_warps_per_sm"]), str(d["max_regs_per_thread"]),
                      f"{d['regs_per_sm'] // 1024}K/SM",
                      f"{d['smem_per_block_optin'] // 1024} KB",
                      f"{d['smem_per_sm'] // 1024} KB", "yes" if d["triton_compiles"] else "no")
        else:
            t.add_row(d["name"], d["family"], d["example"], f"{d['cu_count']} CU",
                      str(d["wave_size"]), str(d["max_waves_per_simd"] * d["simds_per_unit"]),
                      str(d["max_vgprs_per_wave"]), f"{d['vgprs_per_simd_lane']}/lane",
                      f"{d['lds_per_workgroup'] // 1024} KB",
                      f"{d['lds_per_cu'] // 1024} KB/{d['unit']}",
                      "yes" if d["triton_compiles"] else "no")
    return t
