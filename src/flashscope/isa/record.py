"""The :class:`KernelRecord`: what one compiled kernel uses, read from its binary.

One record per kernel and target, both vendors in one shape; fields that do not apply to a
vendor are ``None`` (AGPRs and SGPRs on NVIDIA, SASS spill counts on AMD). The JSON schema
is documented in ``docs/inspect.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

#: Bumped whenever a reader changes what it extracts, so cached records are re-read.
READER_VERSION = 4

#: Global loads of 16 bits or fewer a thread, at least this many and a quarter of a
#: kernel's global loads, mark it as reading narrow (:attr:`KernelRecord.reads_narrow`)
NARROW_LOADS = 8

#: Keys compared by ``inspect --diff`` (numeric fields; ``mix`` is compared per class).
DIFF_FIELDS = ("registers", "agprs", "sgprs", "spill_stores", "spill_loads", "vgpr_spills",
               "sgpr_spills", "local_bytes", "shared_bytes", "static_shared_bytes",
               "dynamic_shared_bytes", "reserved_shared_bytes", "threads", "barriers",
               "instructions", "wgmma_serialized")


@dataclass
class KernelRecord:
    """Resources and instruction mix of one kernel binary.

    registers: per thread (NVIDIA EIATTR_REGCOUNT) or per lane (AMD ``.vgpr_count``, which on
    gfx90a+ already counts the AGPRs of the unified file). shared_bytes = static + dynamic
    as the driver counts them (NVIDIA ``.nv.shared.<k>`` less the system reserve + Triton's
    ``metadata.shared``; AMD ``.group_segment_fixed_size`` + Triton's dynamic shared when
    known). reserved_shared_bytes: the 1 KB system window ptxas places at the start of an
    sm_90+ kernel's shared memory (0 on older cubins, None on AMD); it is the driver's
    per-block reserve, which the occupancy calculator adds itself, so it is not in
    shared_bytes. local_bytes: the
    per-thread stack frame (NVIDIA) or ``.private_segment_fixed_size`` (AMD scratch).
    spill_stores/spill_loads count STL/LDL instructions in SASS, not bytes.
    wgmma_serialized: wgmma that ptxas made wait for the one before them
    (:func:`flashscope.isa.nvidia.serialized_wgmma`; None on AMD).
    global_widths: global loads and stores by the bits one thread (lane) moves,
    ``{"load.b16": n, "load.b128": m, ...}`` (:func:`flashscope.isa.nvidia.global_widths`,
    :func:`flashscope.isa.amd.global_widths`); :attr:`narrow_loads` reads it.
    """

    kernel: str
    target: str
    vendor: str
    registers: Optional[int] = None
    agprs: Optional[int] = None
    sgprs: Optional[int] = None
    spill_stores: Optional[int] = None
    spill_loads: Optional[int] = None
    vgpr_spills: Optional[int] = None
    sgpr_spills: Optional[int] = None
    local_bytes: Optional[int] = None
    static_shared_bytes: Optional[int] = None
    dynamic_shared_bytes: Optional[int] = None
    reserved_shared_bytes: Optional[int] = None
    shared_bytes: Optional[int] = None
    threads: Optional[int] = None
    num_warps: Optional[int] = None
    wave_size: Optional[int] = None
    barriers: Optional[int] = None
    instructions: Optional[int] = None
    wgmma_serialized: Optional[int] = None
    global_widths: Optional[dict] = None
    mix: Optional[dict] = None
    opcodes: Optional[dict] = None
    features: list = field(default_factory=list)
    config: Optional[dict] = None
    head_dim: Optional[int] = None
    dtype: Optional[str] = None
    causal: Optional[bool] = None
    num_stages: Optional[int] = None
    constants: Optional[dict] = None
    source: Optional[str] = None
    occupancy: Optional[float] = None
    limiter: Optional[list] = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "KernelRecord":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def narrow_loads(self) -> tuple:
        """(loads of 16 bits or fewer, global loads): a tile read one 16-bit element a
        thread at a time, which a compiler does where it cannot prove rows 16 bytes
        apart (docs/inspect.md)."""
        w = self.global_widths or {}
        loads = {int(k.split(".b")[1]): n for k, n in w.items() if k.startswith("load.")}
        return sum(n for b, n in loads.items() if b <= 16), sum(loads.values())

    @property
    def reads_narrow(self) -> bool:
        """At least :data:`NARROW_LOADS` global loads of 16 bits or fewer, a quarter of
        the kernel's or more (:attr:`narrow_loads`)."""
        narrow, loads = self.narrow_loads
        return narrow >= NARROW_LOADS and 4 * narrow >= loads

    @property
    def label(self) -> str:
        cfg = self.config or {}
        name = (cfg.get("label") or cfg.get("key")) if isinstance(cfg, dict) else None
        return f"{name} @ {self.target}" if name else f"{self.kernel} @ {self.target}"


def by_width(counts) -> dict:
    """``{"load.b<bits>": n, "store.b<bits>": n}`` counts in order: loads, then stores,
    each by width (the readers' ``global_widths``)."""
    return dict(sorted(counts.items(), key=lambda kv: (kv[0].split(".")[0],
                                                         int(kv[0].split(".b")[1]))))


def diff(a: KernelRecord, b: KernelRecord, opcodes: bool = False) -> dict:
    """b - a for every numeric field and every mix class present in either record, and
    with ``opcodes`` every opcode whose count differs.

    A field missing (None) on one side gives None. Returns {"a": label, "b": label,
    "fields": {name: {"a", "b", "delta"}}, "mix": {class: {"a", "b", "delta"}}, "global":
    {width: {"a", "b", "delta"}}} (global loads and stores by width) and with
    ``opcodes`` "opcodes": {opcode: {"a", "b", "delta"}}, the largest changes first."""
    def entry(x, y):
        return {"a": x, "b": y, "delta": None if x is None or y is None else y - x}

    def counts(x, y):
        return {k: entry(x.get(k, 0) if x is not None else None,
                         y.get(k, 0) if y is not None else None)
                for k in sorted(set(x or {}) | set(y or {}))}

    fields = {k: entry(getattr(a, k), getattr(b, k)) for k in DIFF_FIELDS}
    out = {"a": a.label, "b": b.label, "fields": fields, "mix": counts(a.mix, b.mix),
           "global": counts(a.global_widths, b.global_widths)}
    if opcodes:
        ops = counts(a.opcodes, b.opcodes)
        out["opcodes"] = dict(sorted(((k, e) for k, e in ops.items() if e["delta"] != 0),
                                     key=lambda kv: -abs(kv[1]["delta"] or 0)))
    return out
