"""``flashscope occupancy``: theoretical occupancy of a kernel from its resource numbers.

NVIDIA: ``--target sm90 --regs 168 --threads 384 --smem 232448``; AMD: ``--target gfx942
--vgprs 192 [--agprs N] [--sgprs N] --threads 256 --lds 32768 [--wave-size 32|64]``.
Occupancy = active warps / max warps per SM (waves / wave slots per CU or WGP); each
resource's own block limit is listed, the binding ones marked, with the cliffs: registers
(bytes) to save for one more block, and how many can be added before losing one.
"""

from __future__ import annotations

import json


def register(sub):
    p = sub.add_parser("occupancy", help="active blocks/warps per SM (CU), the limiter and "
                                         "the cliffs for a kernel's registers and memory")
    p.add_argument("--target", required=True, help="sm80 ... sm120, gfx90a ... gfx1201")
    p.add_argument("--threads", type=int, required=True, help="threads per block (workgroup)")
    p.add_argument("--regs", type=int, help="NVIDIA: registers per thread")
    p.add_argument("--smem", type=int, default=0,
                   help="NVIDIA: static + dynamic shared memory per block, bytes")
    p.add_argument("--vgprs", type=int, help="AMD: .vgpr_count (arch + AGPRs on CDNA)")
    p.add_argument("--agprs", type=int, help="AMD: .agpr_count (reported only)")
    p.add_argument("--sgprs", type=int, help="AMD: .sgpr_count")
    p.add_argument("--lds", type=int, default=0, help="AMD: LDS bytes per workgroup")
    p.add_argument("--wave-size", type=int, help="AMD RDNA: 32 (default) or 64")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write the occupancy staircase")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..occupancy import occupancy

    occ = occupancy(args.target, threads=args.threads, regs=args.regs, smem=args.smem,
                    vgprs=args.vgprs, agprs=args.agprs, sgprs=args.sgprs, lds=args.lds,
                    wave_size=args.wave_size)
    if args.plot:
        from ..occupancy.plot import plot_staircase

        regs = args.regs if args.regs is not None else args.vgprs
        plot_staircase(args.plot, occ, threads=args.threads, regs=regs, smem=args.smem,
                       lds=args.lds, sgprs=args.sgprs, wave_size=args.wave_size)
    if args.json:
        print(json.dumps(occ.as_dict(), indent=2))
        return 0
    _print(occ)
    return 0


def _print(occ) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    unit = "SM" if occ.waves_per_simd is None else occ.details.get("unit", "CU")
    head = (f"{occ.target}: {occ.active_blocks} blocks, {occ.active_warps} warps per {unit}, "
            f"occupancy {100 * occ.occupancy:.1f}%")
    if occ.waves_per_simd is not None:
        head += f", {occ.waves_per_simd} waves per SIMD"
    console.print(head)
    if occ.reason:
        console.print(f"cannot launch: {occ.reason}")
    table = Table("resource", f"blocks per {unit}", "binding")
    for k, v in occ.limits.items():
        table.add_row(k, "-" if v is None else str(v), "yes" if k in occ.limiter else "")
    console.print(table)
    cl = Table("cliff", "save to gain a block", "room before losing one")
    for k, v in occ.cliffs.items():
        cl.add_row(k, "-" if v["save_to_gain"] is None else str(v["save_to_gain"]),
                   "-" if v["room_before_loss"] is None else str(v["room_before_loss"]))
    console.print(cl)
