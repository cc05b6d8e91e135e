"""Theoretical occupancy for NVIDIA and AMD targets: pure functions over the tables in
:mod:`flashscope.targets`.

Which inputs are errors and which are "cannot launch":

- A :class:`~flashscope.errors.FlashscopeError` (naming the limit) for numbers no compiled
  kernel can have: an unknown target, non-positive threads/registers, negative shared memory,
  threads > 1024, regs > 255 (NVIDIA), VGPRs above the per-lane maximum (512 on CDNA with
  AGPRs, 256 on RDNA), shared memory/LDS above the per-block maximum, a wave size the target
  does not run.
- Occupancy 0 with ``reason`` for a valid kernel that still cannot be resident: its block's
  registers (VGPRs) do not fit the register file, e.g. 1024 threads x 255 registers on
  NVIDIA, or 1024 work-items x 192 VGPRs on CDNA (16 waves need 4 per SIMD, 192 VGPRs allow 2).
"""

from __future__ import annotations

from ..errors import FlashscopeError
from ..targets import get_target
from .amd import amd_occupancy, llvm_waves_per_simd, unified_vgpr_count
from .nvidia import nvidia_occupancy
from .result import Occupancy

__all__ = ["Occupancy", "occupancy", "occupancy_for_record", "llvm_waves_per_simd",
           "unified_vgpr_count"]


def occupancy(target, *, threads, regs=None, smem=0, vgprs=None, agprs=None, sgprs=None,
              lds=0, wave_size=None, carveout_pref=None) -> Occupancy:
    """Occupancy of a block of ``threads`` on ``target``.

    NVIDIA reads ``regs`` (per thread) and ``smem`` (static + dynamic bytes per block;
    ``carveout_pref`` in percent, default none = the maximum); AMD reads ``vgprs`` (the
    unified ``.vgpr_count``), ``agprs`` (reported only), ``sgprs``, ``lds`` (bytes per
    workgroup) and ``wave_size`` (RDNA: 32 or 64).
    """
    t = get_target(target)
    if t.vendor == "nvidia":
        extra = [k for k, v in (("vgprs", vgprs), ("agprs", agprs), ("sgprs", sgprs))
                 if v is not None] + (["lds"] if lds else [])
        if extra:
            raise FlashscopeError(f"{', '.join(extra)}: AMD inputs given for {t.name}; "
                                  f"use regs and smem")
        if wave_size not in (None, t.warp_size):
            raise FlashscopeError(f"wave_size={wave_size}: {t.name} runs warps of 32")
        return nvidia_occupancy(t, threads=threads, regs=regs, smem=smem,
                                carveout_pref=carveout_pref)
    extra = (["regs"] if regs is not None else []) + (["smem"] if smem else [])
    if extra:
        raise FlashscopeError(f"{', '.join(extra)}: NVIDIA inputs given for {t.name}; "
                              f"use vgprs and lds")
    return amd_occupancy(t, threads=threads, vgprs=vgprs, agprs=agprs, sgprs=sgprs, lds=lds,
                         wave_size=wave_size)


def occupancy_for_record(record) -> Occupancy:
    """Occupancy of a compiled kernel's record (duck-typed: ``target, registers, agprs,
    sgprs, shared_bytes, threads, wave_size``; ``registers`` is the per-thread register
    count on NVIDIA and the unified ``.vgpr_count`` on AMD)."""
    t = get_target(getattr(record, "target"))
    get = lambda name: getattr(record, name, None)  # noqa: E731
    shared = get("shared_bytes") or 0
    if t.vendor == "nvidia":
        return occupancy(t, threads=get("threads"), regs=get("registers"), smem=shared)
    return occupancy(t, threads=get("threads"), vgprs=get("registers"), agprs=get("agprs"),
                     sgprs=get("sgprs"), lds=shared, wave_size=get("wave_size"))
