"""Compile targets and their hardware facts, as data.

One frozen record per architecture; the occupancy calculator, the config feasibility checks,
``flashscope targets`` and the reports all read these tables and nothing else.

Sources: CUDA Programming Guide, "Compute Capabilities" tables, and the CUDA toolkit's
``cuda_occupancy.h`` (NVIDIA); LLVM's ``AMDGPUBaseInfo.cpp`` / ``AMDGPUUsage`` and the ROCm
GPU specification table (AMD). Names parse as ``sm90``, ``sm_90``, ``sm90a``, ``90``,
``gfx942`` (case-insensitive), or as the product a person has in hand: ``H100``, ``A100``,
``MI300X``, ``RX7900``, ``RTX 4090`` (:data:`PRODUCTS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

from .errors import UnknownTargetError, closest

KB = 1024
MB = 1024 * KB


@dataclass(frozen=True)
class NvidiaArch:
    """Per-SM limits of one NVIDIA compute capability."""

    name: str  # canonical: "sm90"
    cc: int  # compute capability x10: 90
    example: str  # a product with this CC, for orientation
    sm_count: int  # SMs of that product
    max_warps_per_sm: int
    max_blocks_per_sm: int
    smem_per_sm: int  # bytes, the largest carveout
    smem_per_block_optin: int  # bytes a block may request (opt-in maximum)
    smem_carveouts_kb: tuple  # carveout sizes the driver may pick, KB
    smem_alloc_unit: int = 128
    reserved_smem_per_block: int = 1 * KB  # 0 before sm_80
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_regs_per_block: int = 65536
    reg_alloc_unit: int = 256  # registers are allocated per warp in these units
    subpartitions: int = 4  # warp schedulers per SM
    max_threads_per_block: int = 1024
    warp_size: int = 32
    triton_supported: bool = True
    vendor: str = "nvidia"
    family: str = ""  # filled from FAMILY_BY_CC below
    l2_bytes: Optional[int] = None  # L2 cache of the example product, bytes (None: unknown)

    def __post_init__(self):
        if not self.family:
            object.__setattr__(self, "family", NVIDIA_FAMILY_BY_CC.get(self.cc, "unknown"))

    @property
    def max_threads_per_sm(self) -> int:
        return self.max_warps_per_sm * self.warp_size

    @property
    def units(self) -> int:
        """The example product's SMs: how many programs a grid fills at one apiece."""
        return self.sm_count

    @property
    def triton_arch(self) -> int:
        return self.cc


@dataclass(frozen=True)
class AmdArch:
    """Per-CU limits of one AMD GPU architecture (LLVM's view)."""

    name: str  # "gfx942"
    family: str  # "cdna2", "cdna3", "cdna4", "rdna3", "rdna4"
    example: str
    cu_count: int
    simds_per_cu: int
    wave_size: int  # the default wavefront size Triton compiles for
    vgprs_per_simd_lane: int  # register file per SIMD lane, in wave`wave_size` terms
    max_vgprs_per_wave: int  # architectural VGPRs (plus AGPRs on CDNA: see unified_vgprs)
    vgpr_granule: int
    max_waves_per_simd: int
    lds_per_workgroup: int  # bytes
    lds_per_cu: int  # bytes (per WGP on RDNA)
    unified_vgprs: bool  # one file for arch VGPRs and AGPRs (gfx90a and later CDNA)
    sgprs_per_simd: int = 800
    max_sgprs_per_wave: int = 102
    lds_alloc_unit: int = 512
    max_workgroups_per_cu: int = 16  # workgroups of more than one wave (barrier slots)
    max_threads_per_block: int = 1024
    triton_supported: bool = True
    vendor: str = "amd"
    # Occupancy unit: the block whose SIMDs and LDS one workgroup's waves share. On CDNA the
    # CU (4 SIMDs); on RDNA in the default WGP mode the work-group processor (2 CUs, 4 SIMDs,
    # 128 KB LDS). LLVM calls these SIMDs "EUs" (IsaInfo::getEUsPerCU).
    unit: str = "CU"
    simds_per_unit: int = 4
    # RDNA runs wave64 too: the same file then holds half as many wave-wide registers
    # (getTotalNumVGPRs: 1536 -> 768, getVGPRAllocGranule: 24 -> 12). None where wave64 is
    # the only size.
    wave64_vgprs_per_simd_lane: Optional[int] = None
    wave64_vgpr_granule: Optional[int] = None
    # SGPR occupancy steps (max SGPRs, waves per SIMD), GFX8/9 (getOccupancyWithNumSGPRs);
    # empty on GFX10+, where SGPRs do not limit occupancy.
    sgpr_wave_steps: tuple = ()

    @property
    def warp_size(self) -> int:
        return self.wave_size

    @property
    def units(self) -> int:
        """The example product's CUs: how many programs a grid fills at one apiece."""
        return self.cu_count

    @property
    def triton_arch(self) -> str:
        return self.name

    @property
    def smem_per_block_optin(self) -> int:
        return self.lds_per_workgroup

    @property
    def max_regs_per_thread(self) -> int:
        return self.max_vgprs_per_wave

    @property
    def lds_per_unit(self) -> int:
        return self.lds_per_cu

    @property
    def max_waves_per_unit(self) -> int:
        return self.max_waves_per_simd * self.simds_per_unit

    def wave_sizes(self) -> tuple:
        return (32, 64) if self.wave64_vgprs_per_simd_lane else (self.wave_size,)

    def vgpr_file(self, wave_size: int) -> tuple:
        """(VGPRs per SIMD lane, allocation granule) for ``wave_size``."""
        if wave_size == self.wave_size:
            return self.vgprs_per_simd_lane, self.vgpr_granule
        return self.wave64_vgprs_per_simd_lane, self.wave64_vgpr_granule


Target = Union[NvidiaArch, AmdArch]

NVIDIA_FAMILY_BY_CC = {80: "ampere", 86: "ampere", 89: "ada", 90: "hopper", 100: "blackwell",
                       120: "blackwell"}

#: getOccupancyWithNumSGPRs for GFX8/GFX9: SGPRs <= 80 -> 10, <= 88 -> 9, <= 100 -> 8,
#: else 7 (capped by max_waves_per_simd). The count is the code object's .sgpr_count
#: (VCC, FLAT_SCRATCH and XNACK included).
GFX9_SGPR_WAVE_STEPS = ((80, 10), (88, 9), (100, 8), (None, 7))

NVIDIA_ARCHS = (
    NvidiaArch("sm80", 80, "A100 SXM4", 108, 64, 32, 164 * KB, 163 * KB,
               (0, 8, 16, 32, 64, 100, 132, 164), l2_bytes=40 * MB),
    NvidiaArch("sm86", 86, "RTX 3090", 82, 48, 16, 100 * KB, 99 * KB,
               (0, 8, 16, 32, 64, 100), l2_bytes=6 * MB),
    NvidiaArch("sm89", 89, "L4", 58, 48, 24, 100 * KB, 99 * KB,
               (0, 8, 16, 32, 64, 100), l2_bytes=48 * MB),
    NvidiaArch("sm90", 90, "H100 SXM5", 132, 64, 32, 228 * KB, 227 * KB,
               (0, 8, 16, 32, 64, 100, 132, 164, 196, 228), l2_bytes=50 * MB),
    NvidiaArch("sm100", 100, "B200", 148, 64, 32, 228 * KB, 227 * KB,
               (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)),
    NvidiaArch("sm120", 120, "RTX 5090", 170, 48, 24, 100 * KB, 99 * KB,
               (0, 8, 16, 32, 64, 100)),
)

AMD_ARCHS = (
    AmdArch("gfx90a", "cdna2", "MI250X (one GCD)", 110, 4, 64, 512, 512, 8, 8,
            64 * KB, 64 * KB, True, sgpr_wave_steps=GFX9_SGPR_WAVE_STEPS),
    AmdArch("gfx942", "cdna3", "MI300X", 304, 4, 64, 512, 512, 8, 8,
            64 * KB, 64 * KB, True, sgpr_wave_steps=GFX9_SGPR_WAVE_STEPS),
    AmdArch("gfx950", "cdna4", "MI355X", 256, 4, 64, 512, 512, 8, 8,
            160 * KB, 160 * KB, True, sgpr_wave_steps=GFX9_SGPR_WAVE_STEPS),
    AmdArch("gfx1100", "rdna3", "RX 7900 XTX", 96, 2, 32, 1536, 256, 24, 16,
            64 * KB, 128 * KB, False, max_workgroups_per_cu=32, unit="WGP",
            wave64_vgprs_per_simd_lane=768, wave64_vgpr_granule=12),
    AmdArch("gfx1201", "rdna4", "RX 9070 XT", 64, 2, 32, 1536, 256, 24, 16,
            64 * KB, 128 * KB, False, max_workgroups_per_cu=32, unit="WGP",
            wave64_vgprs_per_simd_lane=768, wave64_vgpr_granule=12),
)

ALL_TARGETS = NVIDIA_ARCHS + AMD_ARCHS
_BY_NAME = {t.name: t for t in ALL_TARGETS}

#: Product names -> architecture, keyed as :func:`_product_key` writes them (lower case,
#: no spaces or dashes, no vendor or form-factor words). Compute capabilities from NVIDIA's
#: CUDA GPUs table; gfx names from the ROCm GPU specification table.
PRODUCTS = {
    # NVIDIA Ampere (sm80: data centre; sm86: workstation and GeForce 30)
    "a100": "sm80", "a800": "sm80", "a30": "sm80",
    "a10": "sm86", "a40": "sm86", "a16": "sm86", "a2": "sm86", "a6000": "sm86",
    "rtxa6000": "sm86", "rtx3090": "sm86", "rtx3090ti": "sm86", "rtx3080": "sm86",
    "rtx3080ti": "sm86", "rtx3070": "sm86", "rtx3060": "sm86",
    # Ada
    "l4": "sm89", "l40": "sm89", "l40s": "sm89", "rtx6000ada": "sm89", "rtx4090": "sm89",
    "rtx4080": "sm89", "rtx4070": "sm89",
    # Hopper
    "h100": "sm90", "h200": "sm90", "h800": "sm90", "h20": "sm90", "gh200": "sm90",
    # Blackwell (data centre sm100; GeForce 50 and RTX PRO sm120)
    "b200": "sm100", "b100": "sm100", "gb200": "sm100",
    "rtx5090": "sm120", "rtx5080": "sm120", "rtxpro6000": "sm120",
    # AMD CDNA
    "mi250x": "gfx90a", "mi250": "gfx90a", "mi210": "gfx90a",
    "mi300x": "gfx942", "mi300a": "gfx942", "mi300": "gfx942", "mi325x": "gfx942",
    "mi350x": "gfx950", "mi355x": "gfx950",
    # AMD RDNA
    "rx7900": "gfx1100", "rx7900xtx": "gfx1100", "rx7900xt": "gfx1100",
    "rx7900gre": "gfx1100", "w7900": "gfx1100", "w7800": "gfx1100",
    "rx9070": "gfx1201", "rx9070xt": "gfx1201", "r9700": "gfx1201",
}

_VENDOR_WORDS = re.compile(r"^(nvidia|amd|geforce|tesla|radeon|instinct|pro)+")
_FORM_WORDS = re.compile(r"(sxm\d?|pcie|nvl\d*|hbm\d?e?"
                         r"|(16|24|32|40|48|64|80|94|96|141|192|256|288)gb)+$")


def _product_key(name: str) -> str:
    """``NVIDIA H100 SXM5 80GB`` -> ``h100``; ``Radeon RX 7900 XTX`` -> ``rx7900xtx``."""
    s = re.sub(r"[\s_\-]+", "", str(name).lower())
    s = _VENDOR_WORDS.sub("", s)
    return _FORM_WORDS.sub("", s) or s


def canonical_name(name: str) -> str:
    """Normalise ``sm_90``, ``SM90a``, ``90``, ``cuda:90``, ``GFX942``, ``H100``,
    ``MI300X`` to a table key."""
    s = str(name).strip().lower()
    s = re.sub(r"^(cuda|hip|rocm)[:/]", "", s)
    m = re.fullmatch(r"(?:sm_?|compute_?)?(\d{2,3})a?", s)
    if m:
        return f"sm{m.group(1)}"
    m = re.fullmatch(r"(gfx[0-9a-f]+)(?::.*)?", s)
    if m:
        return m.group(1)
    return PRODUCTS.get(_product_key(s), s)


def get_target(name) -> Target:
    """The hardware record for a target name; raises with the closest known name."""
    if isinstance(name, (NvidiaArch, AmdArch)):
        return name
    hit = _BY_NAME.get(name) if isinstance(name, str) else None
    if hit is not None:  # a table key already (every default-config call asks)
        return hit
    key = canonical_name(name)
    try:
        return _BY_NAME[key]
    except KeyError:
        raise UnknownTargetError(
            f"unknown target {name!r}{_suggest(name)}; known targets: "
            + ", ".join(_BY_NAME) + " or products such as H100, A100, MI300X, RX7900"
        ) from None


def _suggest(name) -> str:
    """' (did you mean X?)' over architectures and products alike: a product's close
    match names its architecture, so 'H10' is not taken for an sm100 look-alike."""
    key = _product_key(name)
    pool = {**{n: n for n in _BY_NAME}, **{p: f"{p.upper()} ({a})" for p, a in
                                            PRODUCTS.items()}}
    hint = closest(key, pool)
    if not hint:
        return ""
    match = hint.split("'")[1]
    return f" (did you mean {pool[match]}?)" if match in PRODUCTS else hint


def parse_targets(spec) -> list:
    """``"sm90,gfx942"`` (or a list of names) -> list of records, order kept, duplicates
    dropped."""
    parts = str(spec).split(",") if isinstance(spec, str) else list(spec)
    out = []
    for part in parts:
        if str(part).strip():
            t = get_target(str(part).strip())
            if t not in out:
                out.append(t)
    if not out:
        raise UnknownTargetError("no target given (expected e.g. 'sm90,gfx942' or 'H100')")
    return out


def gpu_target(target):
    """Triton's ``GPUTarget`` for a record (imports Triton lazily)."""
    from triton.backends.compiler import GPUTarget

    t = get_target(target)
    backend = "cuda" if t.vendor == "nvidia" else "hip"
    return GPUTarget(backend, t.triton_arch, t.warp_size)
