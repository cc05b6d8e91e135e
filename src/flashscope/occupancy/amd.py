"""AMD occupancy, by LLVM's AMDGPU rules (``llvm/lib/Target/AMDGPU/Utils/AMDGPUBaseInfo.cpp``:
``getNumWavesPerEUWithNumVGPRs``, ``getVGPRAllocGranule``, ``getTotalNumVGPRs``,
``getMaxWorkGroupsPerCU``, ``getOccupancyWithNumSGPRs``; ``AMDGPUSubtarget.cpp``:
``getOccupancyWithWorkGroupSizes``).

Inputs are the code object's numbers: V = ``.vgpr_count`` (on gfx90a and later CDNA this is
already the unified count, arch VGPRs rounded up to 4 then AGPRs: see
:func:`unified_vgpr_count`), S = ``.sgpr_count``, L = LDS bytes per workgroup (static
``.group_segment_fixed_size`` plus dynamic), a workgroup of T threads = N = ceil(T / wave)
waves. The unit is the CU on CDNA (4 SIMDs) and the WGP on RDNA in its default WGP mode
(4 SIMDs, 128 KB LDS); LLVM calls the SIMDs "EUs".

- VGPR waves per SIMD: V < granule -> max; else min(max, max(1, floor(file / roundup(V,
  granule)))), file/granule = 512/8 (CDNA2-4), 1536/24 (RDNA3/4 wave32), 768/12 (wave64).
- SGPR waves per SIMD (GFX9 only): <= 80 -> 10, <= 88 -> 9, <= 100 -> 8, else 7, capped.
- Workgroups per unit, each resource alone:
  VGPRs floor(vgpr_waves x 4 / N) (a workgroup's waves are resident together, spread over
  the SIMDs); SGPRs likewise; LDS floor(lds_per_unit / roundup(L, lds_alloc_unit));
  wave slots floor(max_waves x 4 / N); barriers 16 per CU (32 per WGP) for N > 1.
- active workgroups = the minimum; active waves = that x N; occupancy = waves / (max x 4);
  ``waves_per_simd`` = min(VGPR/SGPR waves, ceil(active waves / 4)), the most waves any
  SIMD holds when the waves spread evenly.

LLVM's ``Occupancy [waves/SIMD]`` remark folds the same pieces differently: it takes the
VGPR and SGPR waves per SIMD as they are and the LDS/barrier workgroups as
clamp(ceil(workgroups x N / 4), 1, max), on raw LDS bytes (its FIXME: no allocation
granule). :func:`llvm_waves_per_simd` reproduces that number exactly; it equals
``waves_per_simd`` except where whole-workgroup packing costs waves (e.g. RDNA wave32, 256
threads = 8 waves, 5 VGPR waves per SIMD: 2 workgroups = 4 waves per SIMD, LLVM says 5) or
where the LDS size is not a multiple of the granule.
"""

from __future__ import annotations

from ..errors import FlashscopeError
from ..targets import AmdArch
from .result import Occupancy, binding, cliff, nonneg_int, positive_int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def unified_vgpr_count(arch_vgprs: int, agprs: int = 0) -> int:
    """gfx90a+ ``.vgpr_count`` from arch VGPRs and AGPRs: AGPRs start at accum_offset =
    roundup(arch, 4), so 50 arch + 20 AGPRs -> 72 (LLVM ``TotalNumVgprs``)."""
    return _round_up(arch_vgprs, 4) + agprs if agprs else arch_vgprs


def vgpr_waves(t: AmdArch, vgprs: int, wave_size: int) -> int:
    file, granule = t.vgpr_file(wave_size)
    if vgprs < granule:
        return t.max_waves_per_simd
    return min(t.max_waves_per_simd, max(1, file // _round_up(vgprs, granule)))


def sgpr_waves(t: AmdArch, sgprs) -> int:
    if sgprs is None or not t.sgpr_wave_steps:
        return t.max_waves_per_simd
    for bound, waves in t.sgpr_wave_steps:
        if bound is None or sgprs <= bound:
            return min(waves, t.max_waves_per_simd)
    raise AssertionError("sgpr_wave_steps must end with an open step")


def barrier_cap(t: AmdArch, waves_per_wg: int) -> int:
    """getMaxWorkGroupsPerCU: single-wave workgroups use no barrier and are bounded by wave
    slots only; larger ones by min(slots / N, barriers)."""
    if waves_per_wg == 1:
        return t.max_waves_per_unit
    return min(t.max_waves_per_unit // waves_per_wg, t.max_workgroups_per_cu)


def llvm_waves_per_simd(t: AmdArch, *, threads, vgprs, sgprs=None, lds=0, wave_size=None) -> int:
    """LLVM's ``Occupancy [waves/SIMD]`` for a kernel compiled with
    ``amdgpu-flat-work-group-size`` = threads,threads (getOccupancyWithWorkGroupSizes with
    min = max, then min with the VGPR and SGPR waves)."""
    wave = wave_size or t.wave_size
    n = _ceil_div(threads, wave)
    if lds > t.lds_per_unit:
        by_wg = 1
    else:
        wgs = min(barrier_cap(t, n), t.lds_per_unit // max(lds, 1))
        by_wg = min(max(_ceil_div(wgs * n, t.simds_per_unit), 1), t.max_waves_per_simd)
    return min(vgpr_waves(t, vgprs, wave), sgpr_waves(t, sgprs), by_wg)


def check_inputs(t: AmdArch, threads, vgprs, agprs, sgprs, lds, wave_size) -> tuple:
    wave = t.wave_size if wave_size is None else positive_int("wave_size", wave_size)
    if wave not in t.wave_sizes():
        raise FlashscopeError(f"wave_size={wave}: {t.name} runs waves of "
                              + " or ".join(map(str, t.wave_sizes())))
    threads = positive_int("threads", threads)
    if threads > t.max_threads_per_block:
        raise FlashscopeError(f"threads={threads}: at most {t.max_threads_per_block} "
                              f"work-items per workgroup on {t.name}")
    if vgprs is None:
        raise FlashscopeError(f"vgprs: the VGPR count (.vgpr_count) is required for {t.name}")
    vgprs = positive_int("vgprs", vgprs)
    if vgprs > t.max_vgprs_per_wave:
        raise FlashscopeError(f"vgprs={vgprs}: at most {t.max_vgprs_per_wave} VGPRs per lane "
                              f"on {t.name}" + (" (256 arch + 256 AGPR)" if t.unified_vgprs
                                                else ""))
    if agprs is not None:
        agprs = nonneg_int("agprs", agprs)
        if not t.unified_vgprs and agprs:
            raise FlashscopeError(f"agprs={agprs}: {t.name} has no AGPRs")
        if agprs > 256 or agprs > vgprs:
            raise FlashscopeError(f"agprs={agprs}: expected at most 256 and at most vgprs="
                                  f"{vgprs} (.vgpr_count already includes the AGPRs)")
    if sgprs is not None:
        sgprs = positive_int("sgprs", sgprs)
    lds = nonneg_int("lds", lds)
    if lds > t.lds_per_workgroup:
        raise FlashscopeError(f"lds={lds}: at most {t.lds_per_workgroup} bytes of LDS per "
                              f"workgroup on {t.name}")
    return threads, vgprs, agprs, sgprs, lds, wave


def amd_occupancy(t: AmdArch, *, threads, vgprs, agprs=None, sgprs=None, lds=0,
                  wave_size=None, with_cliffs=True) -> Occupancy:
    threads, vgprs, agprs, sgprs, lds, wave = check_inputs(
        t, threads, vgprs, agprs, sgprs, lds, wave_size)
    n = _ceil_div(threads, wave)
    simds = t.simds_per_unit
    v_waves = vgpr_waves(t, vgprs, wave)
    s_waves = sgpr_waves(t, sgprs)
    lds_alloc = _round_up(lds, t.lds_alloc_unit)
    limits = {
        "vgprs": v_waves * simds // n,
        "sgprs": s_waves * simds // n if (sgprs is not None and t.sgpr_wave_steps) else None,
        "lds": t.lds_per_unit // lds_alloc if lds_alloc else None,
        "waves": t.max_waves_per_unit // n,
        "workgroups": t.max_workgroups_per_cu if n > 1 else None,
    }
    active, limiter = binding(limits)
    waves = active * n
    per_simd = min(v_waves, s_waves, _ceil_div(waves, simds))
    reason = None
    if active == 0:
        short = [k for k in limiter]
        reason = (f"a workgroup of {n} waves needs {_ceil_div(n, simds)} waves per SIMD; "
                  f"{', '.join(short)} allow{'s' if len(short) == 1 else ''} "
                  f"{min(v_waves, s_waves)}: no workgroup can be resident")
    details = {"unit": t.unit, "waves_per_workgroup": n, "wave_size": wave,
               "vgpr_waves_per_simd": v_waves, "sgpr_waves_per_simd": s_waves,
               "lds_per_workgroup_allocated": lds_alloc, "agprs": agprs,
               "llvm_waves_per_simd": llvm_waves_per_simd(
                   t, threads=threads, vgprs=vgprs, sgprs=sgprs, lds=lds, wave_size=wave)}
    cliffs = {}
    if with_cliffs:
        def by_vgprs(v):
            return amd_occupancy(t, threads=threads, vgprs=v, sgprs=sgprs, lds=lds,
                                 wave_size=wave, with_cliffs=False).active_blocks

        def by_lds(b):
            return amd_occupancy(t, threads=threads, vgprs=vgprs, sgprs=sgprs, lds=b,
                                 wave_size=wave, with_cliffs=False).active_blocks

        cliffs = {"registers": cliff(by_vgprs, vgprs, 1, t.max_vgprs_per_wave),
                  "shared_mem": cliff(by_lds, lds, 0, t.lds_per_workgroup)}
    return Occupancy(target=t.name, active_blocks=active, active_warps=waves,
                     occupancy=waves / t.max_waves_per_unit, limiter=limiter, limits=limits,
                     cliffs=cliffs, waves_per_simd=per_simd, reason=reason, details=details)
