"""``flashscope occupancy``: theoretical occupancy of a kernel from its resource numbers.

NVIDIA: ``--target sm90 --regs 168 --threads 384 --smem 232448``; AMD: ``--target gfx942
--vgprs 192 [--agprs N] [--sgprs N] --threads 256 --lds 32768 [--wave-size 32|64]``; a
comma list of targets (``--target sm80,sm90`` or ``H100,A100``) gives one answer each.
Occupancy = active warps / max warps per SM (waves / wave slots per CU or WGP); each
resource's own block limit is listed, the binding ones marked, with the cliffs: registers
(bytes) to save for one more block, and how many can be added before losing one.
"""

from __future__ import annotations

from . import common


def register(sub):
    p = sub.add_parser("occupancy", help="active blocks/warps per SM (CU), the limiter and "
                                         "the cliffs for a kernel's registers and memory",
                       description=__doc__)
    common.add_target(p, default=None, required=True,
                      help="sm80 ... sm120, gfx90a ... gfx1201 or products (H100, MI300X); "
                           "a comma list gives one answer per target")
    p.add_argument("--threads", type=common.integer(1), required=True,
                   help="threads per block (workgroup)")
    p.add_argument("--regs", type=common.integer(0), help="NVIDIA: registers per thread")
    p.add_argument("--smem", type=common.integer(0), default=0,
                   help="NVIDIA: static + dynamic shared memory per block, bytes")
    p.add_argument("--vgprs", type=common.integer(0),
                   help="AMD: .vgpr_count (arch + AGPRs on CDNA)")
    p.add_argument("--agprs", type=common.integer(0), help="AMD: .agpr_count (reported only)")
    p.add_argument("--sgprs", type=common.integer(0), help="AMD: .sgpr_count")
    p.add_argument("--lds", type=common.integer(0), default=0,
                   help="AMD: LDS bytes per workgroup")
    p.add_argument("--wave-size", type=common.integer(1), help="AMD RDNA: 32 (default) or 64")
    common.add_output(p, plot=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import FlashscopeError
    from ..occupancy import occupancy

    if args.plot and len(args.target) > 1:
        raise FlashscopeError("--plot draws one target's staircase; give one --target")
    common.prepare(args, plot=True, extra=["staircase.png"])
    results = [occupancy(t, threads=args.threads, **_inputs(args, t.vendor,
                                                            len(args.target) > 1))
               for t in args.target]
    plots = [args.plot] if args.plot else []
    if args.out_dir is not None and len(results) == 1:
        plots.append(args.out_dir.file("staircase.png"))
    for path in plots:
        from ..occupancy.plot import plot_staircase

        occ = results[0]
        regs = args.regs if args.regs is not None else args.vgprs
        plot_staircase(path, occ, threads=args.threads, regs=regs, smem=args.smem,
                       lds=args.lds, sgprs=args.sgprs, wave_size=args.wave_size)
    doc = [o.as_dict() for o in results]
    rows = [{"target": o.target, "active_blocks": o.active_blocks,
             "active_warps": o.active_warps, "occupancy": o.occupancy,
             "limiter": list(o.limiter), "waves_per_simd": o.waves_per_simd,
             **{f"blocks_by_{k}": v for k, v in o.limits.items()},
             "reason": o.reason} for o in results]
    common.emit(args, doc, rows=rows, render=lambda con: [_print(con, o) for o in results])
    return 0


def _inputs(args, vendor: str, mixed: bool) -> dict:
    """The resource numbers for one target. With several targets, each vendor takes its
    own (--regs/--smem for NVIDIA, --vgprs/--agprs/--sgprs/--lds/--wave-size for AMD), so
    one command compares an H100 with an MI300X; with one target, numbers of the other
    vendor are an error (the calculator names them)."""
    nv = {"regs": args.regs, "smem": args.smem}
    amd = {"vgprs": args.vgprs, "agprs": args.agprs, "sgprs": args.sgprs, "lds": args.lds,
           "wave_size": args.wave_size}
    if not mixed:
        return {**nv, **amd}
    return nv if vendor == "nvidia" else amd


def _print(con, occ) -> None:
    unit = "SM" if occ.waves_per_simd is None else occ.details.get("unit", "CU")
    head = (f"{occ.target}: {occ.active_blocks} blocks, {occ.active_warps} warps per {unit}, "
            f"occupancy {common.pct(occ.occupancy)}")
    if occ.waves_per_simd is not None:
        head += f", {occ.waves_per_simd} waves per SIMD"
    con.print(head)
    if occ.reason:
        con.print(f"cannot launch: {occ.reason}")
    table = common.table("resource", f"blocks per {unit}", "binding", left=("resource",
                                                                          "binding"))
    for k, v in occ.limits.items():
        table.add_row(k, "-" if v is None else str(v), "yes" if k in occ.limiter else "")
    unit_of = {"registers": "registers/thread" if unit == "SM" else "VGPRs/lane",
               "shared_mem": "bytes"}
    cl = common.table("cliff", "unit", "save to gain a block", "room before losing one",
                      left=("cliff", "unit"))
    for k, v in occ.cliffs.items():
        cl.add_row(k, unit_of.get(k, ""),
                   "-" if v["save_to_gain"] is None else str(v["save_to_gain"]),
                   "-" if v["room_before_loss"] is None else str(v["room_before_loss"]))
    common.show(con, table, cl)
