"""NVIDIA cubins: resources from the ELF, instruction mix from SASS.

Resources (per kernel ``k``):
- registers per thread: EIATTR_REGCOUNT in ``.nv.info`` (symbol index, count);
- static shared: size of the NOBITS section ``.nv.shared.<k>`` minus the system-reserved
  window (below); Triton's dynamic shared (``metadata.shared``) is not in the ELF and is
  added by the caller;
- reserved shared: on sm_90 and later ptxas lays every kernel's shared window out as
  [0, 1 KB) reserved for the system (the driver's per-block reserve,
  cudaDevAttrReservedSharedMemoryPerBlock), then the kernel's own static variables, then
  dynamic shared (SASS: the dynamic base is ``0x400``), and counts the reserve in
  ``.nv.shared.<k>`` (cuobjdump's SHARED). Such cubins carry a ``.nv.shared.reserved.N``
  section and ``.nv.reservedSmem.*`` symbols; sm_80 cubins have neither and no reserve in
  the section. The driver (``launch__shared_mem_per_block_static``) counts static shared
  without the reserve, and reports the reserve as ``launch__shared_mem_per_block_driver``:
  so ``static_shared_bytes`` excludes it and ``reserved_shared_bytes`` holds it;
- local bytes per thread: EIATTR_FRAME_SIZE (the stack frame that holds spills and local
  arrays; cuobjdump's STACK);
- barriers: EIATTR_NUM_BARRIERS in ``.nv.info.<k>`` (CUDA 13 cubins, ELF ABI 8), else bits
  20..26 of the ``.text.<k>`` section flags (nvdisasm's SHF_BARRIERS; ptxas 12.x);
- arch: the SM number in ``e_flags``, bits 0..7 up to ELF ABI 7 and bits 8..15 from ABI 8.

``.nv.info`` is a list of attributes: u8 format, u8 attribute, then for format 4 (EIFMT_SVAL)
a u16 size and that many bytes, else a u16 value (formats 1..3).

SASS comes from the ``nvdisasm`` that Triton's wheel ships. Spill stores/loads are counted
as STL/LDL instructions (Triton's ``n_spills`` is local bytes / 4, not a count).

nvdisasm spends about 0.3 s starting up whatever it is given, so many cubins are read with
:func:`disassemble_many`: the ``.text`` sections of all cubins of one architecture are
concatenated and disassembled in one run as a raw instruction stream (``--binary SMxy``;
instructions are 16 bytes from sm_70 on, so a section never straddles a boundary) and the
listing is cut back at the section offsets. The opcodes equal those of the ELF-mode
listing; only labels and relocated symbol names differ, which the mix does not use.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections import Counter

from ..errors import ArtifactError
from . import elf as elfmod
from .record import by_width

EIFMT_SVAL = 4
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_MAX_STACK_SIZE = 0x23
EIATTR_REGCOUNT = 0x2F
EIATTR_MAXREG_COUNT = 0x1B
EIATTR_REQNTID = 0x10  # required block size (x, y, z), u32 each
EIATTR_NUM_BARRIERS = 0x4C  # CUDA 13 cubins (ELF ABI 8): named barriers, moved here from
#                             the .text section flags
EIATTR_INDIRECT_BRANCH_TARGETS = 0x34  # per BRX: its address and where it may go
#: Bytes at the start of the shared window that ptxas reserves for the system on cubins
#: with the reserved-shared layout (sm_90+; same 1 KB as the driver's per-block reserve).
SYSTEM_RESERVED_SHARED = 1024
_RESERVED_MARKERS = (".nv.shared.reserved.", ".nv.reservedSmem.")
_PER_SYMBOL = {EIATTR_REGCOUNT: "registers", EIATTR_FRAME_SIZE: "frame",
               EIATTR_MIN_STACK_SIZE: "min_stack", EIATTR_MAX_STACK_SIZE: "max_stack"}

#: Instruction classes over SASS base opcodes (``MUFU`` keeps its function: MUFU.EX2).
CLASSES = {
    "mma": ("HMMA", "HGMMA", "QGMMA", "IMMA", "IGMMA", "BGMMA", "DMMA", "UTCHMMA", "UTCQMMA",
            "UTCIMMA", "UTCOMMA"),
    "async_copy": ("LDGSTS", "LDGDEPBAR"),
    "tma": ("UTMALDG", "UTMASTG", "UBLKCP", "UTMAPF", "UTMAREDG", "UBLKRED"),
    "ldmatrix": ("LDSM", "STSM"),
    "shared": ("LDS", "STS", "ATOMS"),
    "global": ("LDG", "STG", "ATOMG", "RED"),
    "local": ("LDL", "STL"),
    "exp": ("MUFU.EX2",),
    "barrier": ("BAR", "SYNCS", "WARPSYNC", "MEMBAR", "DEPBAR", "WARPGROUP"),
}
_CLASS_OF = {op: c for c, ops in CLASSES.items() for op in ops}

#: Global memory accesses counted by width (:func:`global_widths`): loads (async copies
#: into shared memory among them) and stores.
GLOBAL_LOADS = ("LDG", "LDGSTS")
GLOBAL_STORES = ("STG",)
#: Bytes a global access moves, by its SASS width modifier (none: 32 bits).
_WIDTH_BITS = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "64": 64, "128": 128}

#: Hopper's warpgroup MMA opcodes (wgmma.mma_async in PTX).
WGMMA_OPS = ("HGMMA", "QGMMA", "IGMMA", "BGMMA")

#: Feature flag -> the classes/opcodes whose presence sets it.
FEATURES = (
    ("uses_wgmma", WGMMA_OPS),
    ("uses_tma", CLASSES["tma"]),
    ("uses_cp_async", ("LDGSTS",)),
    ("uses_ldmatrix", CLASSES["ldmatrix"]),
    ("spills", ("LDL", "STL")),
)

_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)"
                        r"((?:\.[A-Z0-9_]+)*)")
_TEXT_HEADER = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")


def tool(name: str) -> str:
    """Path of ``nvdisasm``/``cuobjdump`` from Triton's wheel (or PATH)."""
    try:
        import triton

        here = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        if os.path.exists(here):
            return here
    except ImportError:  # pragma: no cover
        pass
    found = shutil.which(name)
    if not found:
        raise ArtifactError(f"{name} not found (Triton's wheel ships it under "
                            "triton/backends/nvidia/bin)")
    return found


def _run_on_bytes(args, data: bytes, what: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data)
        f.flush()
        try:
            p = subprocess.run(args + [f.name], capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise ArtifactError(f"{what}: {os.path.basename(args[0])} did not finish in 120 s "
                                "(corrupt cubin?)") from None
    out = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        msg = (p.stderr.decode("utf-8", "replace") or out).strip().splitlines()
        raise ArtifactError(f"{what}: {os.path.basename(args[0])} could not read it"
                            f" ({msg[-1] if msg else 'exit ' + str(p.returncode)})")
    return out


def disassemble(cubin: bytes, what: str = "cubin") -> str:
    """SASS text of every kernel in ``cubin`` (nvdisasm)."""
    return _run_on_bytes([tool("nvdisasm"), "-c", "-ndf"], cubin, what)


#: nvdisasm ``--binary`` names by SM number; the ``a`` variants decode a superset (wgmma,
#: setmaxnreg, tcgen05) and are what Triton builds for sm_90 and later.
_RAW_ARCH = {80: "SM80", 86: "SM86", 87: "SM87", 89: "SM89", 90: "SM90a", 100: "SM100a",
             101: "SM101a", 120: "SM120a"}
_RAW_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*)$")


def _sm(elf, what: str) -> int:
    """The SM number in ``e_flags``: bits 0..7 up to ELF ABI 7 (ptxas 12.x, the one Triton's
    wheel ships), bits 8..15 from ABI 8 on (CUDA 13: 0x6005a04 for sm_90); 0 if unset."""
    with elfmod.guarded(what):
        flags = elf.header["e_flags"]
        abi = elf.header["e_ident"]["EI_ABIVERSION"]
    return (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF


def disassemble_texts(batches: list) -> list:
    """SASS text for each ``(sm, [(kernel, .text bytes)])`` of ``batches`` (None where it must
    be read alone), with one nvdisasm run per architecture. Each text has a
    ``.section .text.<k>`` line per kernel followed by its instructions, the shape
    :func:`split_sass` reads."""
    out = [None] * len(batches)
    by_arch = {}
    for i, (sm, texts) in enumerate(batches):
        if sm in _RAW_ARCH and texts and all(len(t) % 16 == 0 for _, t in texts):
            by_arch.setdefault(sm, []).append((i, texts))
    for sm, items in by_arch.items():
        blob, starts, owners = bytearray(), [], []
        for i, texts in items:
            for k, t in texts:
                starts.append(len(blob))
                owners.append((i, k))
                blob += t
        try:
            text = _run_on_bytes([tool("nvdisasm"), "--binary", _RAW_ARCH[sm]], bytes(blob),
                                 f"{len(items)} sm_{sm} cubins")
        except ArtifactError:
            continue
        lines = {i: [] for i, _ in items}
        seg, seen = -1, set()
        for line in text.splitlines():
            m = _RAW_LINE.match(line)
            if not m:
                continue
            addr = int(m.group(1), 16)
            while seg + 1 < len(starts) and addr >= starts[seg + 1]:
                seg += 1
            i, k = owners[seg]
            if (i, k) not in seen:
                seen.add((i, k))
                lines[i].append(f"\t.section\t.text.{k},\"ax\",@progbits")
            lines[i].append(f"        /*{addr:04x}*/ {m.group(2)}")
        for i, ls in lines.items():
            out[i] = "\n".join(ls) + "\n"
    return out


def disassemble_many(cubins: list) -> list:
    """:func:`disassemble_texts` over whole cubins (None for one that does not parse: it
    is read alone, where the error names the file)."""
    batches = []
    for c in cubins:
        try:
            _, sm, texts = cubin_parts(c, "cubin")
        except ArtifactError:
            sm, texts = None, []
        batches.append((sm, texts))
    return disassemble_texts(batches)


_COUNT_ROW = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/.*//\s*\|\s*(\d*)\s*\|")


def live_counts(cubin: bytes, what: str = "cubin") -> dict:
    """{kernel: {address: live general registers}} as ``nvdisasm --life-range-mode count``
    prints them: the reference :mod:`flashscope.isa.lines` is checked against. nvdisasm
    refuses kernels of 255 registers ("Invalid register count"), which raises."""
    text = _run_on_bytes([tool("nvdisasm"), "-c", "--life-range-mode", "count"], cubin, what)
    out, cur = {}, None
    for line in text.splitlines():
        m = _TEXT_HEADER.match(line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        m = _COUNT_ROW.match(line)
        if m and cur is not None:
            cur[int(m.group(1), 16)] = int(m.group(2) or 0)
    return out


def resource_usage(cubin: bytes, what: str = "cubin") -> dict:
    """cuobjdump --dump-resource-usage, as {kernel: {"REG": n, "STACK": n, "SHARED": n,
    "LOCAL": n, ...}}: an independent reading to cross-check :func:`read_cubin` against."""
    text = _run_on_bytes([tool("cuobjdump"), "--dump-resource-usage"], cubin, what)
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = m.group(1)
            continue
        if name and "REG:" in line:
            out[name] = {k: int(v) for k, v in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line)}
            name = None
    return out


def parse_nv_info(data: bytes, what: str) -> list:
    """[(attribute, value)] of an ``.nv.info`` body; SVAL values stay bytes."""
    out, off = [], 0
    while off + 4 <= len(data):
        fmt, attr, word = struct.unpack_from("<BBH", data, off)
        off += 4
        if fmt == EIFMT_SVAL:
            if off + word > len(data):
                raise ArtifactError(f"{what}: truncated .nv.info attribute 0x{attr:x}")
            out.append((attr, bytes(data[off:off + word])))
            off += word
        elif 1 <= fmt <= 3:
            out.append((attr, word))
        else:
            raise ArtifactError(f"{what}: bad .nv.info attribute format {fmt}")
    return out


def _per_symbol(entries, syms, what) -> dict:
    """{kernel: {"registers": n, "frame": n, ...}} from the symbol-indexed attributes."""
    out = {}
    for attr, val in entries:
        key = _PER_SYMBOL.get(attr)
        if key is None or not isinstance(val, bytes) or len(val) != 8:
            continue
        sym, n = struct.unpack("<II", val)
        if sym >= len(syms):
            raise ArtifactError(f"{what}: .nv.info names symbol {sym}, the table has "
                                f"{len(syms)}")
        out.setdefault(syms[sym], {})[key] = n
    return out


def _opcode(line: str) -> "str | None":
    """The base mnemonic of a SASS instruction line (MUFU keeps its function: MUFU.EX2),
    or None for any other line."""
    m = _SASS_LINE.match(line)
    if not m:
        return None
    op, mods = m.group(1), m.group(2)
    return op + "." + mods[1:].split(".")[0] if op == "MUFU" and mods else op


def _kernels(sass: str) -> dict:
    """{kernel: ([(opcode, line), ...], {label: index of the instruction it names})}."""
    out, cur = {}, None
    for line in sass.splitlines():
        m = _TEXT_HEADER.match(line)
        if m:
            cur = out.setdefault(m.group(1), ([], {}))
            continue
        if cur is None:
            continue
        m = _LABEL.match(line)
        if m:
            cur[1][m.group(1)] = len(cur[0])
            continue
        op = _opcode(line)
        if op is not None:
            cur[0].append((op, line))
    return out


def sass_lines(sass: str) -> dict:
    """{kernel: [(opcode, line), ...]}: each kernel's instruction lines in program order,
    with the base mnemonic of each (MUFU keeps its function: MUFU.EX2)."""
    return {k: lines for k, (lines, _) in _kernels(sass).items()}


_LABEL = re.compile(r"^\s*(\.L_\w+):")
_BRANCH_TO = re.compile(r"\bBRA\s+`\((\.L_\w+)\)")


def loops(sass: str) -> dict:
    """{kernel: [body, ...]}: each kernel's loops, every branch back to an earlier label
    giving one body, the ``(opcode, line)`` list from that label to the branch, in program
    order (nested loops give nested bodies). Branches past the kernel's last EXIT are
    left out: they end ptxas's out-of-line blocks (a failed mbarrier try-wait retried
    there), which jump back into the code they left."""
    out = {}
    for kernel, (lines, labels) in _kernels(sass).items():
        end = max((i for i, (op, _) in enumerate(lines) if op == "EXIT"), default=len(lines))
        bodies = []
        for i, (op, line) in enumerate(lines[:end]):
            to = _BRANCH_TO.search(line) if op == "BRA" else None
            if to and labels.get(to.group(1), i + 1) <= i:
                bodies.append(lines[labels[to.group(1)]:i + 1])
        out[kernel] = bodies
    return out


def split_sass(sass: str) -> dict:
    """{kernel: [opcode, ...]} in program order; opcode = base mnemonic (MUFU.<fn>)."""
    return {k: [op for op, _ in lines] for k, lines in sass_lines(sass).items()}


_WGMMA_SHAPE = re.compile(r"GMMA((?:\.[A-Za-z0-9_]+)+)\s+R(\d+),(.*);")
_WGMMA_WAIT_ALL = re.compile(r"\bWARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b")
_DEST_REG = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?[A-Z][A-Z0-9_.]*\s+R(\d+)\b")


def _acc_regs(mods: str) -> int:
    """Registers per thread of a wgmma accumulator: 64 x N values over 128 threads, one
    register each (F32/S32) or two a register (F16)."""
    parts = mods.split(".")[1:]  # 64xNxK, the accumulator's type, the inputs' type
    n = int(parts[0].split("x")[1])
    return n // 4 if len(parts) > 1 and parts[1] == "F16" else n // 2


def _serialized(lines: list) -> int:
    """Serialized wgmma among one kernel's ``(opcode, line)`` (:func:`serialized_wgmma`)."""
    count, prev, gap = 0, None, []
    for op, line in lines:
        w = _WGMMA_SHAPE.search(line) if op in WGMMA_OPS else None
        if w is None:
            gap.append(line)
            continue
        mods, dest, rest = w.group(1), int(w.group(2)), w.group(3)
        ops = [o.strip() for o in rest.split(",")]
        desc = next((i for i, o in enumerate(ops) if o.startswith("gdesc[")), None)
        acc = desc is not None and desc + 1 < len(ops) and ops[desc + 1] == f"R{dest}"
        if acc and prev is not None and prev[0] == dest and prev[1] \
                and any(_WGMMA_WAIT_ALL.search(g) for g in gap):
            top = dest + _acc_regs(mods)
            written = (_DEST_REG.match(g) for g in gap)
            if not any(d and dest <= int(d.group(1)) < top for d in written):
                count += 1
        prev, gap = (dest, "gsb0" in ops), []
    return count


def serialized_wgmma(sass: str) -> dict:
    """{kernel: wgmma instructions ptxas serialized}, read from the SASS alone.

    A wgmma that accumulates (C operand = its destination) into the registers its
    predecessor wrote, where that predecessor closed its own group (``gsb0``), a
    ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` sits between the two and nothing in between writes
    the accumulator: the k-steps of one product run one at a time instead of streaming
    through the tensor cores. It is what ptxas reports as C7512 ("wgmma.mma_async
    instructions are serialized due to ...", e.g. too few registers for the pipeline),
    which Triton does not show. A chain that waits on purpose between two products, to
    rescale the accumulator, writes it in between and is not counted."""
    return {k: _serialized(lines) for k, lines in sass_lines(sass).items()}


def global_widths(lines: list) -> dict:
    """``{"load.b<bits>": n, "store.b<bits>": n}`` over a kernel's SASS lines
    (:func:`sass_lines`): its global loads (``LDG``, ``LDGSTS``) and stores (``STG``) by
    the bits one thread moves, from the width modifier (``LDG.E.128``: 128, ``LDG.E.U16``:
    16, none: 32; cache hints such as ``LTC128B`` are not widths)."""
    out = Counter()
    for op, line in lines:
        kind = "load" if op in GLOBAL_LOADS else "store" if op in GLOBAL_STORES else None
        if kind is None:
            continue
        m = _SASS_LINE.match(line)
        mods = m.group(2).split(".")[1:] if m else []
        bits = next((_WIDTH_BITS[x] for x in mods if x in _WIDTH_BITS), 32)
        out[f"{kind}.b{bits}"] += 1
    return by_width(out)


def mix_of(opcodes: Counter) -> tuple:
    """(class -> count, features) from opcode counts; every class present, zeros included."""
    mix = {c: 0 for c in CLASSES}
    for op, n in opcodes.items():
        c = _CLASS_OF.get(op)
        if c:
            mix[c] += n
    feats = [f for f, ops in FEATURES if any(opcodes.get(o) for o in ops)]
    return mix, feats


def _split_shared(size: int, reserved_layout: bool, what: str) -> tuple:
    """``.nv.shared.<k>`` size -> (static bytes as the driver counts them, reserved bytes)."""
    if not reserved_layout:
        return size, 0
    if size < SYSTEM_RESERVED_SHARED:
        raise ArtifactError(f"{what}: .nv.shared section of {size} bytes in a cubin with the "
                            f"reserved-shared layout (expected >= {SYSTEM_RESERVED_SHARED})")
    return size - SYSTEM_RESERVED_SHARED, SYSTEM_RESERVED_SHARED


def cubin_parts(cubin: bytes, what: str = "cubin") -> tuple:
    """Everything of a cubin but its SASS, from one ELF parse: (rows, SM number,
    [(kernel, .text bytes)]). Rows are :func:`read_cubin`'s dicts less the SASS keys,
    which :func:`with_mix` adds."""
    elf, vendor = elfmod.open_elf(cubin, what)
    if vendor != "nvidia":
        raise ArtifactError(f"{what}: an AMD code object, expected a cubin")
    secs = elfmod.sections(elf, what)
    syms = elfmod.symbols(elf, what)
    info = _per_symbol(parse_nv_info(elfmod.section_data(elf, ".nv.info", what) or b"", what),
                       syms, what)
    kernels = [n[len(".text."):] for n, _ in secs if n.startswith(".text.")]
    if not kernels:
        raise ArtifactError(f"{what}: a cubin without kernels (no .text.* section)")
    hdr = {n: h for n, h in secs}
    reserved_layout = any(n.startswith(_RESERVED_MARKERS) for n in list(hdr) + syms)
    sm = _sm(elf, what)
    arch = f"sm{sm}" if sm else None
    rows, texts = [], []
    for k in kernels:
        per = dict(info.get(k, {}))
        for attr, val in parse_nv_info(elfmod.section_data(elf, f".nv.info.{k}", what) or b"",
                                       what):
            if attr == EIATTR_MAXREG_COUNT and isinstance(val, int):
                per["max_reg_cap"] = val
            elif attr == EIATTR_NUM_BARRIERS and isinstance(val, int):
                per["barriers"] = val
            elif attr == EIATTR_REQNTID and isinstance(val, bytes) and len(val) == 12:
                x, y, z = struct.unpack("<III", val)
                per["threads"] = x * y * z
        if "registers" not in per:
            raise ArtifactError(f"{what}: no EIATTR_REGCOUNT for kernel {k}")
        shared = hdr.get(f".nv.shared.{k}")
        # A kernel without shared memory has no .nv.shared.<k>, and no window either
        # (cuobjdump: SHARED:0), even in a cubin with the reserved-shared markers.
        static, reserved = _split_shared(int(shared["sh_size"]) if shared else 0,
                                         reserved_layout and shared is not None,
                                         f"{what}: kernel {k}")
        rows.append({
            "kernel": k, "arch": arch, "registers": per["registers"],
            "local_bytes": per.get("frame", 0),
            "static_shared_bytes": static, "reserved_shared_bytes": reserved,
            "barriers": per.get("barriers", (int(hdr[f".text.{k}"]["sh_flags"]) >> 20) & 0x7F),
            "max_reg_cap": per.get("max_reg_cap"), "threads": per.get("threads"),
        })
        texts.append((k, elfmod.section_data(elf, f".text.{k}", what) or b""))
    return rows, sm, texts


def indirect_branches(cubin: bytes, kernel: str, what: str = "cubin") -> dict:
    """{address of a BRX: (target addresses)} of one kernel (section-relative), from
    EIATTR_INDIRECT_BRANCH_TARGETS in ``.nv.info.<kernel>``: per branch a u32 address,
    two u16 fields, a u32 count and that many u32 targets (what nvdisasm prints as
    ``BRANCH_TARGETS``)."""
    elf, _ = elfmod.open_elf(cubin, what)
    out = {}
    for attr, val in parse_nv_info(elfmod.section_data(elf, f".nv.info.{kernel}", what) or b"",
                                   what):
        if attr != EIATTR_INDIRECT_BRANCH_TARGETS or not isinstance(val, bytes):
            continue
        off = 0
        while off + 12 <= len(val):
            addr, _, _, n = struct.unpack_from("<IHHI", val, off)
            off += 12
            if off + 4 * n > len(val):
                raise ArtifactError(f"{what}: truncated branch-target list for 0x{addr:x}")
            out[addr] = struct.unpack_from(f"<{n}I", val, off)
            off += 4 * n
    return out


def with_mix(rows: list, sass: str) -> list:
    """``rows`` of :func:`cubin_parts` completed from the SASS text: spill stores/loads
    (STL/LDL), instruction count, mix, opcodes, features, serialized wgmma, global
    accesses by width."""
    by_kernel = sass_lines(sass)
    for r in rows:
        lines = by_kernel.get(r["kernel"], [])
        ops = Counter(op for op, _ in lines)
        mix, feats = mix_of(ops)
        n_serial = _serialized(lines)
        if n_serial:
            feats.append("wgmma_serialized")
        r.update(spill_stores=ops.get("STL", 0), spill_loads=ops.get("LDL", 0),
                 instructions=sum(ops.values()), mix=mix, opcodes=dict(sorted(ops.items())),
                 features=feats, wgmma_serialized=n_serial,
                 global_widths=global_widths(lines))
    return rows


def read_cubin(cubin: bytes, what: str = "cubin", sass: "str | None" = None) -> list:
    """One dict of resources + mix per kernel (``.text.<k>`` section) in ``cubin``.

    Keys: kernel, registers, local_bytes, static_shared_bytes, reserved_shared_bytes,
    barriers, max_reg_cap, threads (EIATTR_REQNTID, None when absent), spill_stores,
    spill_loads, instructions, mix, opcodes, features, arch. ``sass``: the cubin's SASS
    when it was disassembled already."""
    rows, _, _ = cubin_parts(cubin, what)
    return with_mix(rows, disassemble(cubin, what) if sass is None else sass)
