"""NVIDIA occupancy, by the rules of the CUDA toolkit's ``cuda_occupancy.h``
(``cudaOccMaxActiveBlocksPerMultiprocessor`` and its helpers), the same arithmetic as the
runtime's ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``.

For a block of T threads, R registers per thread and S bytes of shared memory (static +
dynamic), with W = ceil(T / 32) warps:

- registers (``cudaOccMaxBlocksPerSMRegsLimit``): a warp gets roundup(32 R, 256) registers;
  registers live in 4 sub-partitions of 16384 each, so k = floor(16384 / regs_per_warp)
  warps fit per sub-partition and floor(4 k / W) blocks per SM. Zero when W > 4 k (the
  per-block hardware check, which rounds W up to a multiple of 4, fails in the same cases).
  The naive floor(65536 / (regs_per_warp W)) over-counts: (104 regs, 32 threads) gives 19
  naively, 16 by sub-partition (k = 4).
- warps: floor(max_warps_per_sm / W); blocks: the table's max blocks per SM.
- shared memory (``cudaOccMaxBlocksPerSMSmemLimit``): per block roundup(S + reserve, unit)
  with the 1 KB driver reserve from sm_80 on; the SM's capacity is the preferred carveout
  (the default preference is the maximum, ``cudaOccSMemPreferenceVoltaPlus``), or, when one
  block needs more than the preference, that block's need snapped up to a supported
  carveout (``cudaOccAlignUpShmemSizeVoltaPlus``).
- active blocks = the minimum; occupancy = blocks W / max_warps_per_sm.

At launch the driver picks the carveout itself: the smallest supported size that holds the
blocks the other limits allow ("avoid shared memory occupancy bottlenecks", CUDA
Programming Guide, compute capability 8.x/9.0), leaving the rest to L1. Nsight Compute
reports its ``launch__occupancy_limit_shared_mem`` against that configured size, so it can
read lower than the runtime API while the active blocks agree: PyTorch's memory-efficient
attention (256 threads, 128 regs, 52,224 B dynamic) is register-limited to 2 blocks; the
driver configures 132 KB (2 x 53,248 B = 104 KB does not fit 100 KB), and 132 KB / 52 KB = 2
is what ncu shows. ``details["launch_carveout"]`` and ``details["launch_shared_mem_limit"]``
give that view.

sm_90 adds no barrier limit to this calculation: the header and the runtime API combine
only the four limits above (thread-block clusters, a separate API, are out of scope).
"""

from __future__ import annotations

from ..errors import FlashscopeError
from ..targets import KB, NvidiaArch
from .result import Occupancy, binding, cliff, nonneg_int, positive_int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def snap_carveout(t: NvidiaArch, nbytes: int):
    """Smallest supported carveout (bytes) >= ``nbytes``; None if none is that large."""
    for kb in t.smem_carveouts_kb:
        if kb * KB >= nbytes:
            return kb * KB
    return None


def regs_per_warp(t: NvidiaArch, regs: int) -> int:
    return _round_up(regs * t.warp_size, t.reg_alloc_unit)


def smem_per_block(t: NvidiaArch, smem: int) -> int:
    """Bytes the SM sets aside for one block: static + dynamic + reserve, rounded up."""
    return _round_up(smem + t.reserved_smem_per_block, t.smem_alloc_unit)


def register_limit(t: NvidiaArch, threads: int, regs: int) -> int:
    warps = _ceil_div(threads, t.warp_size)
    per_sub = (t.regs_per_sm // t.subpartitions) // regs_per_warp(t, regs)
    return (per_sub * t.subpartitions) // warps


def smem_limit(t: NvidiaArch, smem: int, carveout_pref=None) -> int:
    """Blocks per SM by shared memory as the runtime API computes it.

    ``carveout_pref``: the preferred carveout in percent (cudaFuncAttributePreferred-
    SharedMemoryCarveout); None = no preference = the maximum.
    """
    alloc = smem_per_block(t, smem)
    if carveout_pref is None:
        pref = t.smem_per_sm
    else:
        pref = snap_carveout(t, carveout_pref * t.smem_per_sm // 100)
    cap = pref if pref >= alloc else snap_carveout(t, alloc)
    return cap // alloc


def check_inputs(t: NvidiaArch, threads, regs, smem) -> tuple:
    threads = positive_int("threads", threads)
    if threads > t.max_threads_per_block:
        raise FlashscopeError(f"threads={threads}: at most {t.max_threads_per_block} threads "
                              f"per block on {t.name}")
    if regs is None:
        raise FlashscopeError(f"regs: registers per thread are required for {t.name}")
    regs = positive_int("regs", regs)
    if regs > t.max_regs_per_thread:
        raise FlashscopeError(f"regs={regs}: at most {t.max_regs_per_thread} registers per "
                              f"thread on {t.name}")
    smem = nonneg_int("smem", smem)
    if smem > t.smem_per_block_optin:
        raise FlashscopeError(f"smem={smem}: at most {t.smem_per_block_optin} bytes of shared "
                              f"memory per block on {t.name} (opt-in maximum)")
    return threads, regs, smem


def nvidia_occupancy(t: NvidiaArch, *, threads, regs, smem=0, carveout_pref=None,
                     with_cliffs=True) -> Occupancy:
    threads, regs, smem = check_inputs(t, threads, regs, smem)
    warps = _ceil_div(threads, t.warp_size)
    limits = {
        "registers": register_limit(t, threads, regs),
        "shared_mem": smem_limit(t, smem, carveout_pref),
        "warps": t.max_warps_per_sm // warps,
        "blocks": t.max_blocks_per_sm,
    }
    active, limiter = binding(limits)
    alloc = smem_per_block(t, smem)
    details = {"warps_per_block": warps, "regs_per_warp": regs_per_warp(t, regs),
               "regs_per_block": regs_per_warp(t, regs) * warps,
               "smem_per_block": alloc, "smem_reserved": t.reserved_smem_per_block}
    reason = None
    if active == 0:
        reason = (f"{warps} warps x {details['regs_per_warp']} registers per warp do not fit "
                  f"the register file ({t.regs_per_sm // t.subpartitions} per sub-partition, "
                  f"{t.subpartitions} sub-partitions): no block can be resident")
    else:
        carve = snap_carveout(t, active * alloc)
        details["launch_carveout"] = carve
        details["launch_shared_mem_limit"] = carve // alloc
    cliffs = {}
    if with_cliffs:
        def by_regs(r):
            return nvidia_occupancy(t, threads=threads, regs=r, smem=smem,
                                    carveout_pref=carveout_pref,
                                    with_cliffs=False).active_blocks

        def by_smem(s):
            return nvidia_occupancy(t, threads=threads, regs=regs, smem=s,
                                    carveout_pref=carveout_pref,
                                    with_cliffs=False).active_blocks

        cliffs = {"registers": cliff(by_regs, regs, 1, t.max_regs_per_thread),
                  "shared_mem": cliff(by_smem, smem, 0, t.smem_per_block_optin)}
    return Occupancy(target=t.name, active_blocks=active, active_warps=active * warps,
                     occupancy=active * warps / t.max_warps_per_sm, limiter=limiter,
                     limits=limits, cliffs=cliffs, reason=reason, details=details)
