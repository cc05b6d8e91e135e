"""SASS instructions as liveness sees them: the registers each one reads and writes, with
their widths, and where control goes next.

Registers are bits of one integer (:data:`CLASSES`): R0..R254 (RZ is not a register),
P0..P6 (PT), UR0..UR62 (URZ) and UP0..UP6 (UPT). An operand names its first register;
how many follow is the instruction's business:

- an explicit width on the operand: ``R6.64`` (an address pair);
- a width on the opcode: ``LDG.E.128 R4`` writes R4..R7, ``STS.64 [..], R6`` reads R6..R7,
  ``LDC.64``, ``ULDC.64``, ``UIADD3.64`` (every register operand 64-bit), ``CS2R`` (two
  registers unless ``.32``), ``IMAD.WIDE`` (the result and the addend are 64-bit);
- matrix instructions by shape: ``HMMA.16816.F32.BF16 D, A, B, C`` holds M x N
  accumulators, M x K and K x N inputs over 32 lanes (4, 4, 2, 4 registers);
  ``HGMMA.64xNxK.F32.BF16`` N / 2 accumulator registers over 128 threads and 4 for an A
  operand in registers;
- descriptors: ``desc[URa]`` is a 64-bit global-memory descriptor (URa, URa+1),
  ``gdesc[URa]`` the pair of 64-bit wgmma shared-memory descriptors (URa..URa+3);
- FP64: ``D*`` arithmetic and conversions with ``.F64``/``.S64``/``.U64`` types.

Destinations come first: the first operand, and the predicates written beside it (carry
outs ``IADD3 R1, P0, ...``, the second result of ``ISETP P0, PT, ...``). Instructions
whose first operand is memory (stores, ``LDGSTS``, TMA, reductions) write no register.
A write under a guard predicate (``@P0``) does not end the old value's life.

Control: ``BRA`` (fall-through too when guarded), ``EXIT``/``RET`` end a path, ``BRX`` goes
to the targets the cubin lists for it (EIATTR_INDIRECT_BRANCH_TARGETS) and ``CALL`` to its
target and back. The operand model was checked against ``nvdisasm --life-range-mode
narrow`` (the registers each instruction reads, writes and keeps live) on Triton, Gluon
and tutorial kernels for sm80 and sm90 (tests/isa/test_liveness.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .dataflow import Step

#: register class -> (first bit, number of registers); the zero/true register of each
#: class (RZ = R255, PT = P7, URZ = UR63, UPT = UP7) is not counted.
CLASSES = {"R": (0, 255), "P": (256, 7), "UR": (264, 63), "UP": (328, 7)}

_REG = re.compile(r"(?<![A-Za-z0-9_])(!?)(UR|UP|R|P)(\d+|Z|T)((?:\.64|\.128)?)(?![0-9])")
_MEM = re.compile(r"(g?desc)\[(UR\d+)\]")
_HEAD = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*)$")
_GUARD = re.compile(r"^@(!?)(U?P)(\d|T)\s+")
_COMMENT = re.compile(r"\(\*.*?\*\)")
_TARGET = re.compile(r"^(?:`\()?(\.L_x_\d+|0x[0-9a-f]+)\)?")
_SHAPE = re.compile(r"^(?:(\d+)x(\d+)x(\d+)|(16|8)(8)(\d+))$")

_BRANCHES = ("BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BPT")
#: first operand a register that is read, not written
_NO_DEST = _BRANCHES + ("BAR", "WARPSYNC", "NANOSLEEP", "BSSY", "BSYNC", "BREAK", "BMOV",
                        "DEPBAR", "YIELD", "KILL", "ERRBAR", "CCTL", "MEMBAR", "FENCE")
#: predicate-led instructions whose second operand (a register) is a result too
_P_THEN_R = ("SHFL", "LOP3", "ULOP3", "ELECT", "ATOM", "ATOMG", "ATOMS", "VOTE", "VOTEU",
             "PLOP3", "UPLOP3", "IADD3", "UIADD3")
_LOADS = ("LDG", "LDS", "LDL", "LD", "LDC", "ULDC", "ATOM", "ATOMG", "ATOMS", "LDGSTS",
          "ULDS")
_STORES = ("STG", "STS", "STL", "ST", "RED", "REDG", "STSM", "ATOMS", "UST", "USTS")
_TYPE_BITS = {"F64": 64, "S64": 64, "U64": 64, "F32": 32, "S32": 32, "U32": 32, "TF32": 32,
              "F16": 16, "BF16": 16, "S16": 16, "U16": 16, "E4M3": 8, "E5M2": 8, "S8": 8,
              "U8": 8, "S4": 4, "U4": 4, "E2M1": 4, "E3M2": 8, "E2M3": 8}


@dataclass
class Instr:
    """One SASS instruction: section-relative address, opcode with modifiers, its text
    after the address, the liveness view (:class:`~flashscope.isa.dataflow.Step` fields)
    and the branch targets it names (section-relative addresses)."""

    addr: int
    opcode: str
    text: str
    uses: int = 0  # every register read, the guard predicate included
    defs: int = 0
    kills: int = 0  # the writes not under a guard
    ends: bool = False  # control does not fall through (EXIT, RET, unguarded BRA/BRX)
    targets: tuple = ()
    call: bool = False


def _bit(cls: str, num: str):
    if num in ("Z", "T"):
        return None
    first, count = CLASSES[cls]
    n = int(num)
    return first + n if n < count else None


def _mask(cls: str, num: str, width: int) -> int:
    first = _bit(cls, num)
    if first is None:
        return 0
    top = CLASSES[cls][0] + CLASSES[cls][1]
    return ((1 << (min(first + width, top) - first)) - 1) << first


def _split(ops: str) -> list:
    out, depth, cur = [], 0, []
    for ch in ops:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    last = "".join(cur).strip()
    if last:
        out.append(last)
    return out


def _mma_widths(base: str, mods: list) -> "tuple | None":
    """(D, A, B) registers per thread of a matrix instruction, from its shape and types."""
    shape = next((m for m in mods if _SHAPE.match(m)), None)
    if shape is None:
        return None
    s = _SHAPE.match(shape)
    if s.group(1):
        m, n, k = int(s.group(1)), int(s.group(2)), int(s.group(3))
    else:
        m, n, k = int(s.group(4)), int(s.group(5)), int(s.group(6))
    types = [_TYPE_BITS[t] for t in mods if t in _TYPE_BITS]
    acc = types[0] if types else 32
    inp = types[1] if len(types) > 1 else (64 if base == "DMMA" else 16)
    lanes = 128 if "GMMA" in base else 32
    return (max(1, m * n * acc // lanes // 32), max(1, m * k * inp // lanes // 32),
            max(1, k * n * inp // lanes // 32))


def _data_width(mods: list) -> int:
    if "128" in mods:
        return 4
    if "64" in mods:
        return 2
    return 1


def parse(line: str, start: int = 0) -> "Instr | None":
    """The :class:`Instr` of one listing line (``/*addr*/ [@P] OPCODE operands ;``), its
    address made relative to ``start``; None for a line that is not an instruction."""
    m = _HEAD.match(line)
    if not m:
        return None
    addr = int(m.group(1), 16) - start
    body = _COMMENT.sub("", m.group(2)).strip().rstrip(";").strip()
    text = body
    uses = 0
    guarded = False
    g = _GUARD.match(body)
    if g:
        guarded = g.group(3) != "T" or g.group(1) == "!"
        uses |= _mask(g.group(2), g.group(3), 1)
        body = body[g.end():]
    parts = body.split(None, 1)
    if not parts or not parts[0][:1].isalpha():
        return None
    opcode = parts[0]
    ops = _split(parts[1]) if len(parts) > 1 else []
    base, *mods = opcode.split(".")
    ins = Instr(addr, opcode, text)
    defs = 0
    mma = _mma_widths(base, mods) if base.endswith("MMA") else None
    wide64 = base in ("DADD", "DMUL", "DFMA", "DMNMX", "DSETP", "DMMA") or \
        (base in ("UIADD3", "IADD", "IADD3", "UMOV", "MOV") and "64" in mods)
    conv = [_TYPE_BITS.get(t) for t in mods if t in _TYPE_BITS] if base in (
        "F2F", "I2F", "F2I", "I2I", "F2IP", "I2FP") else []
    first_is_mem = bool(ops) and ("[" in ops[0].split("]")[0] and
                                  not _REG.match(ops[0]))
    n_dest = 0
    if ops and base not in _NO_DEST and not first_is_mem:
        r0 = _REG.fullmatch(ops[0].strip("-|~ "))
        if r0 and not r0.group(1):
            n_dest = 1
            if r0.group(2) in ("P", "UP"):
                if len(ops) > 1 and base not in ("VOTE", "VOTEU") or len(ops) > 2:
                    r1 = _REG.fullmatch(ops[1])
                    if r1 and not r1.group(1) and (r1.group(2) in ("P", "UP")
                                                    or base in _P_THEN_R):
                        n_dest = 2
            else:
                while n_dest < len(ops):
                    r = _REG.fullmatch(ops[n_dest])
                    if not (r and not r.group(1) and r.group(2) in ("P", "UP")):
                        break
                    n_dest += 1
        elif ops[0] == "PR" and base == "R2P":
            sel = int(ops[2], 16) if len(ops) > 2 and ops[2].startswith("0x") else 0x7F
            defs |= sum(1 << (256 + b) for b in range(7) if sel >> b & 1)
    store_data = base in _STORES
    gdesc = next((k for k, op in enumerate(ops) if "gdesc[" in op), None)
    for idx, op in enumerate(ops):
        is_dest = idx < n_dest
        for d in _MEM.finditer(op):  # descriptors: 2 (desc) or 4 (gdesc) uniform registers
            uses |= _mask("UR", d.group(2)[2:], 4 if d.group(1) == "gdesc" else 2)
        op = _MEM.sub("", op)
        if op == "PR" and base == "P2R":
            sel = int(ops[3], 16) if len(ops) > 3 and ops[3].startswith("0x") else 0x7F
            uses |= sum(1 << (256 + b) for b in range(7) if sel >> b & 1)
            continue
        in_mem = "[" in op
        for r in _REG.finditer(op):
            cls, num, suffix = r.group(2), r.group(3), r.group(4)
            width = 1
            if suffix:
                width = 2 if suffix == ".64" else 4
            elif cls in ("R", "UR") and not in_mem:
                if base in ("BRX", "JMX", "RET"):
                    width = 2  # a 64-bit code address
                elif mma:
                    width = _mma_operand(mma, idx, n_dest, gdesc)
                else:
                    width = _width(base, mods, idx, n_dest, len(ops), wide64, conv,
                                   store_data, is_dest)
            m = _mask(cls, num, width)
            if is_dest and not in_mem:
                defs |= m
            else:
                uses |= m
    ins.uses, ins.defs, ins.kills = uses, defs, 0 if guarded else defs
    if base in _BRANCHES:
        tgt = _TARGET.match(ops[0]) if ops and base in ("BRA", "CALL", "JMP") else None
        if tgt and tgt.group(1).startswith("0x"):
            ins.targets = (int(tgt.group(1), 16) - start,)
        elif tgt:
            ins.targets = (tgt.group(1),)  # a label, resolved by the caller
        ins.call = base == "CALL"
        ins.ends = not guarded and base in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET")
    return ins


def _mma_operand(mma: tuple, idx: int, n_dest: int, gdesc: "int | None") -> int:
    """Registers of operand ``idx`` of a matrix instruction: D and C hold the accumulator;
    HMMA-style ``D, A, B, C`` by position, wgmma ``D, [A,] gdesc, C`` around the
    descriptor operand."""
    d, a, b = mma
    if idx < n_dest:
        return d
    if gdesc is not None:
        return a if idx < gdesc else d
    return (a, b, d, d)[min(idx - n_dest, 3)]


def _width(base, mods, idx, n_dest, n_ops, wide64, conv, store_data, is_dest) -> int:
    """Registers an R/UR operand at position ``idx`` spans (the rules in the module
    docstring)."""
    if wide64:
        return 2
    if conv:
        bits = conv[0] if is_dest else conv[-1]
        return 2 if bits == 64 else 1
    if base in ("IMAD", "UIMAD") and "WIDE" in mods:
        return 2 if is_dest or idx == n_ops - 1 else 1
    if base == "CS2R":
        return 1 if "32" in mods else 2
    if base in ("LDSM",) and is_dest or base == "STSM" and not is_dest:
        last = mods[-1] if mods else ""
        return int(last) if last in ("1", "2", "4") else 1
    if is_dest and base in _LOADS:
        return _data_width(mods)
    if store_data and not is_dest and idx == n_ops - 1:
        return _data_width(mods)
    if base == "SYNCS" and "EXCH" in mods and idx == n_ops - 1:
        return _data_width(mods)
    return 1


def kernel_steps(lines: list, start: int = 0, labels: "dict | None" = None,
                 brx: "dict | None" = None) -> tuple:
    """([Instr], [Step]) of one kernel's listing lines (``/*addr*/ ...``, program order).

    ``start``: the listing address of the kernel's first instruction (raw listings of many
    cubins number instructions across the whole stream); ``labels``: {label: address} for
    ELF-mode listings that name branch targets ``.L_x_N``; ``brx``: {address of a BRX:
    (target addresses)} from the cubin's EIATTR_INDIRECT_BRANCH_TARGETS (section-relative).
    A BRX without a list goes to every place a branch names or that follows a path's end,
    which over-counts liveness but never under-counts it."""
    instrs = [i for i in (parse(ln, start) for ln in lines) if i is not None]
    at = {ins.addr: k for k, ins in enumerate(instrs)}
    labels = labels or {}
    brx = brx or {}
    known = sorted({at[t] for ins in instrs for t in _resolved(ins.targets, labels, at)} |
                   {k + 1 for k, ins in enumerate(instrs) if ins.ends and k + 1 < len(instrs)})
    returns = tuple(k + 1 for k, ins in enumerate(instrs) if ins.call and k + 1 < len(instrs))
    # R1 is the stack pointer of the ABI: once set it stays live to every exit.
    sp = _mask("R", "1", 1) if any(ins.defs & _mask("R", "1", 1) for ins in instrs) else 0
    steps = []
    for k, ins in enumerate(instrs):
        succ = set()
        if not ins.ends and k + 1 < len(instrs):
            succ.add(k + 1)
        base = ins.opcode.split(".")[0]
        named = ()
        if base == "BRX":
            targets = brx.get(ins.addr)
            named = tuple(at[t] for t in targets if t in at) if targets else tuple(known)
        elif base == "RET":
            succ.update(returns)
        else:
            named = tuple(at[t] for t in _resolved(ins.targets, labels, at))
        succ.update(named)
        end = sp if succ <= {k} else 0  # a path's end, or the closing self-loop
        steps.append(Step(ins.uses | end, ins.defs, ins.kills, tuple(sorted(succ)), named))
    return instrs, steps


def _resolved(targets, labels, at):
    for t in targets:
        t = labels.get(t, t) if isinstance(t, str) else t
        if isinstance(t, int) and t in at:
            yield t


def count(mask: int, cls: str = "R") -> int:
    """Registers of class ``cls`` in ``mask``."""
    first, n = CLASSES[cls]
    return ((mask >> first) & ((1 << n) - 1)).bit_count()


def highest(mask: int, cls: str = "R") -> "int | None":
    """The highest register number of class ``cls`` in ``mask`` (None if none)."""
    first, n = CLASSES[cls]
    m = (mask >> first) & ((1 << n) - 1)
    return m.bit_length() - 1 if m else None
