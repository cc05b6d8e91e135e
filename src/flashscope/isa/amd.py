"""AMD code objects (hsaco): resources from the ``amdhsa.kernels`` metadata note, mix from
the amdgcn text.

The metadata is a msgpack map in an ELF note (name ``AMDGPU``, type
NT_AMDGPU_METADATA = 32). Per kernel it gives ``.vgpr_count`` (on gfx90a and later CDNA
the unified count: architectural VGPRs rounded to the AGPR alignment plus AGPRs, so the
AGPRs are not added again), ``.agpr_count``, ``.sgpr_count``, ``.vgpr_spill_count``,
``.sgpr_spill_count``, ``.group_segment_fixed_size`` (static LDS),
``.private_segment_fixed_size`` (scratch bytes per work-item) and ``.wavefront_size``.

The mix counts mnemonics of the amdgcn text that Triton keeps next to the hsaco (a code
object read alone has no mix). LDS accesses are also counted by the bits one instruction
moves per lane: ``ds_read2_b64`` moves 2 x 64 = 128 bits, ``ds_read_u16`` 16.
"""

from __future__ import annotations

import re
from collections import Counter

from ..errors import ArtifactError
from . import elf as elfmod
from .record import by_width

NT_AMDGPU_METADATA = 32

#: Instruction classes: mix key -> mnemonic prefixes (lower-case amdgcn).
CLASSES = {
    "mfma": ("v_mfma",),
    "wmma": ("v_wmma", "v_swmmac"),
    "ds_read": ("ds_read", "ds_load"),
    "ds_write": ("ds_write", "ds_store"),
    "buffer_load": ("buffer_load",),
    "buffer_store": ("buffer_store",),
    "global_load": ("global_load",),
    "global_store": ("global_store",),
    "scratch_load": ("scratch_load",),
    "scratch_store": ("scratch_store",),
    "s_waitcnt": ("s_waitcnt",),
    "s_barrier": ("s_barrier",),
    "exp": ("v_exp_",),
}

FEATURES = (
    ("uses_mfma", ("mfma",)),
    ("uses_wmma", ("wmma",)),
    ("uses_buffer_ops", ("buffer_load", "buffer_store")),
    ("spills", ("scratch_load", "scratch_store")),
)

_MNEMONIC = re.compile(r"^\s+([a-z][a-z0-9_]*)\b")
_LABEL = re.compile(r"^([A-Za-z_][\w.$]*):")
_DS_WIDTH = re.compile(r"^ds_(?:read|write|load|store)(2)?(?:st64)?_[bui](\d+)")
#: A global or buffer access's width in its mnemonic: ``global_load_dwordx4`` (GCN/CDNA),
#: ``global_load_b128`` (RDNA 3+), ``_ushort``/``_u16``/``_short_d16``, ``_ubyte``/``_u8``
_GLOBAL_ACCESS = re.compile(r"^(?:global|buffer)_(load|store)_(?:lds_)?(\w+)$")
_GLOBAL_BITS = {"byte": 8, "ubyte": 8, "sbyte": 8, "u8": 8, "i8": 8, "b8": 8, "short": 16,
                "ushort": 16, "sshort": 16, "u16": 16, "i16": 16, "b16": 16, "dword": 32,
                "b32": 32, "dwordx2": 64, "b64": 64, "dwordx3": 96, "b96": 96,
                "dwordx4": 128, "b128": 128}


def metadata(hsaco: bytes, what: str = "hsaco") -> dict:
    """The decoded ``amdhsa`` metadata map of a code object."""
    import msgpack

    elf, vendor = elfmod.open_elf(hsaco, what)
    if vendor != "amd":
        raise ArtifactError(f"{what}: a cubin, expected an AMD code object")
    with elfmod.guarded(what):
        bodies = [s.data() for s in elf.iter_sections() if s["sh_type"] == "SHT_NOTE"]
    for body in bodies:
        for name, ntype, desc in elfmod.notes(body, what):
            if name == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
                try:
                    meta = msgpack.unpackb(desc, strict_map_key=False)
                except Exception as e:
                    raise ArtifactError(f"{what}: corrupt amdhsa metadata "
                                        f"({type(e).__name__})") from None
                if not isinstance(meta, dict) or not isinstance(
                        meta.get("amdhsa.kernels"), list):
                    raise ArtifactError(f"{what}: amdhsa metadata without amdhsa.kernels")
                return meta
    raise ArtifactError(f"{what}: no AMDGPU metadata note (not a code object v3+)")


def split_text(text: str, kernels) -> dict:
    """{kernel: Counter(mnemonic)} from amdgcn text; lines outside a kernel are skipped."""
    out, cur = {k: Counter() for k in kernels}, None
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            name = m.group(1)
            if name in out:
                cur = out[name]
            elif not name.startswith(".L"):
                cur = None
            continue
        if line.lstrip().startswith(".end_amdgpu_metadata") or ".Lfunc_end" in line:
            cur = None
            continue
        m = _MNEMONIC.match(line)
        if m and cur is not None:
            cur[m.group(1)] += 1
    return out


_ANY_LABEL = re.compile(r"^([A-Za-z_.][\w.$]*):")
_BRANCH_TO = re.compile(r"^\s+s_c?branch\w*\s+(\.L\w+)")


def loops(text: str, kernel: str) -> list:
    """The loops of ``kernel`` in amdgcn text: every branch back to an earlier label gives
    one body, the mnemonics from that label to the branch in program order (nested loops
    give nested bodies)."""
    ops, labels, bodies, inside = [], {}, [], False
    for line in text.splitlines():
        m = _ANY_LABEL.match(line)
        if m:
            name = m.group(1)
            if name == kernel:
                inside = True
            elif not name.startswith(".L"):
                inside = False
            elif inside:
                labels[name] = len(ops)
            continue
        if inside and (".Lfunc_end" in line
                       or line.lstrip().startswith(".end_amdgpu_metadata")):
            break
        m = _MNEMONIC.match(line) if inside else None
        if m:
            ops.append(m.group(1))
            to = _BRANCH_TO.match(line)
            if to and to.group(1) in labels:
                bodies.append(ops[labels[to.group(1)]:])
    return bodies


def mix_of(ops: Counter) -> tuple:
    """(mix, features): class counts (zeros included) plus ``ds_read.b<bits>`` /
    ``ds_write.b<bits>`` per-lane widths; features from :data:`FEATURES`."""
    mix = {c: 0 for c in CLASSES}
    widths = Counter()
    for op, n in ops.items():
        for c, prefixes in CLASSES.items():
            if op.startswith(prefixes):
                mix[c] += n
                break
        m = _DS_WIDTH.match(op)
        if m:
            kind = "ds_read" if op.startswith(("ds_read", "ds_load")) else "ds_write"
            bits = int(m.group(2)) * (2 if m.group(1) else 1)
            widths[f"{kind}.b{bits}"] += n
    mix.update(sorted(widths.items()))
    feats = [f for f, classes in FEATURES if any(mix.get(c) for c in classes)]
    return mix, feats


def global_widths(ops: Counter) -> dict:
    """``{"load.b<bits>": n, "store.b<bits>": n}``: a kernel's global and buffer accesses
    by the bits one lane moves (``_d16``, ``_d16_hi`` and ``_format_`` variants by their
    element; an access whose width the mnemonic does not name is left out)."""
    out = Counter()
    for op, n in ops.items():
        m = _GLOBAL_ACCESS.match(op)
        if not m:
            continue
        kind, rest = m.groups()
        width = next((w for w in rest.replace("d16_hi", "").replace("d16", "short").split("_")
                      if w in _GLOBAL_BITS), None)
        if width is not None:
            out[f"{kind}.b{_GLOBAL_BITS[width]}"] += n
    return by_width(out)


def _int(meta: dict, key: str, kernel: str, what: str, default=None):
    v = meta.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ArtifactError(f"{what}: kernel {kernel} has a non-integer {key}")
    return v


def read_hsaco(hsaco: bytes, what: str = "hsaco", text: "str | None" = None) -> list:
    """One dict per kernel of the code object: resources, and the mix when ``text``
    (the amdgcn assembly) is given."""
    meta = metadata(hsaco, what)
    target = str(meta.get("amdhsa.target", ""))
    arch = target.rsplit("--", 1)[-1].split(":")[0] or None
    kernels = [k for k in meta["amdhsa.kernels"] if isinstance(k, dict)]
    if not kernels:
        raise ArtifactError(f"{what}: a code object without kernels")
    names = [str(k.get(".name")) for k in kernels]
    ops_by_kernel = split_text(text, names) if text is not None else {}
    out = []
    for name, k in zip(names, kernels):
        ops = ops_by_kernel.get(name)
        vgpr_spills = _int(k, ".vgpr_spill_count", name, what)
        sgpr_spills = _int(k, ".sgpr_spill_count", name, what)
        if ops is not None:
            mix, feats = mix_of(ops)
        else:
            mix, feats = None, []
        if (vgpr_spills or sgpr_spills) and "spills" not in feats:
            feats.append("spills")
        out.append({
            "kernel": name, "arch": arch,
            "registers": _int(k, ".vgpr_count", name, what),
            "agprs": _int(k, ".agpr_count", name, what),
            "sgprs": _int(k, ".sgpr_count", name, what),
            "vgpr_spills": vgpr_spills, "sgpr_spills": sgpr_spills,
            "static_shared_bytes": _int(k, ".group_segment_fixed_size", name, what, 0),
            "local_bytes": _int(k, ".private_segment_fixed_size", name, what, 0),
            "wave_size": _int(k, ".wavefront_size", name, what),
            "max_threads": _int(k, ".max_flat_workgroup_size", name, what),
            "instructions": sum(ops.values()) if ops is not None else None,
            "mix": mix, "opcodes": dict(sorted(ops.items())) if ops is not None else None,
            "features": feats,
            "global_widths": global_widths(ops) if ops is not None else None,
        })
    return out
