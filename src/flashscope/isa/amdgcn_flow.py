"""AMDGCN instructions as liveness sees them (the amdgcn text Triton keeps next to a code
object): the VGPRs, AGPRs and SGPRs each one reads and writes, where control goes next,
and the source location (``.loc``) in effect.

Registers are bits of one integer: v0..v511 from bit 0, a0..a255 from bit 512, s0..s105
from bit 768. ``v[4:7]`` names v4..v7. VCC, EXEC, M0, SCC and the trap registers are not
counted: the code object reserves VCC (and on gfx9 FLAT_SCRATCH and XNACK_MASK) outside
the count of SGPRs the kernel addresses, which is what the checks compare against.

The first operand is the destination, except for stores (``ds_write``/``ds_store``,
``buffer_store``, ``global_store``, ``scratch_store``, ``flat_store``), waits, barriers,
branches and scalar compares. Carry-out instructions (``v_add_co_u32 v1, vcc, ..``,
``v_div_scale_f32``, ``v_mad_u64_u32``) write their second operand too; RDNA's dual
issue (``v_dual_a .. :: v_dual_b ..``) writes one destination per half. A write that keeps
part of the old value (``_d16`` loads, SDWA ``dst_unused:UNUSED_PRESERVE``) also reads it.
A VALU write counts as a full write whatever EXEC holds, as in LLVM's own liveness.

Control: ``s_branch`` goes to its label, ``s_cbranch_*`` to its label or on,
``s_endpgm`` and ``s_setpc_b64`` end a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .dataflow import Step
from .locations import LocTracker

#: register class -> (first bit, number of registers)
CLASSES = {"v": (0, 512), "a": (512, 256), "s": (768, 106)}

_REG = re.compile(r"(?<![\w.$])([vas])(?:(\d+)|\[(\d+):(\d+)\])(?![\w:])")
_LABEL = re.compile(r"^([A-Za-z_.$][\w.$]*):")
_MNEMONIC = re.compile(r"^\s+([a-z][a-z0-9_]*)\b(.*)$")
_NO_DEST = ("ds_write", "ds_store", "buffer_store", "global_store", "scratch_store",
            "flat_store", "s_waitcnt", "s_barrier", "s_branch", "s_cbranch", "s_endpgm",
            "s_nop", "s_cmp", "s_bitcmp", "s_setprio", "s_sleep", "s_delay_alu",
            "s_dcache", "s_setpc", "s_sendmsg", "s_trap", "s_icache", "buffer_wbl2",
            "buffer_inv", "s_clause", "s_set_inst_prefetch", "ds_gws", "s_waitcnt_")
_CARRY = ("_co_", "v_addc", "v_subb", "v_div_scale", "v_mad_u64_u32", "v_mad_i64_i32")


@dataclass
class AmdInstr:
    """One amdgcn instruction: its index in the kernel, mnemonic, text, liveness view and
    the source frames in effect (innermost first; empty where the text gives none)."""

    index: int
    opcode: str
    text: str
    uses: int = 0
    defs: int = 0
    frames: tuple = ()
    label_target: "str | None" = None
    ends: bool = False
    conditional: bool = False
    labels: list = field(default_factory=list)


def _mask(cls: str, lo: int, hi: int) -> int:
    first, n = CLASSES[cls]
    hi = min(hi, n - 1)
    if lo > hi:
        return 0
    return ((1 << (hi - lo + 1)) - 1) << (first + lo)


def _regs(op: str) -> int:
    m = 0
    for r in _REG.finditer(op):
        if r.group(2) is not None:
            n = int(r.group(2))
            m |= _mask(r.group(1), n, n)
        else:
            m |= _mask(r.group(1), int(r.group(3)), int(r.group(4)))
    return m


def _operands(rest: str) -> list:
    rest = rest.split(";", 1)[0]  # trailing comment
    return [o.strip() for o in rest.split(",") if o.strip()]


def _one(mnemonic: str, rest: str) -> tuple:
    """(uses, defs) of one instruction (one half of a dual issue)."""
    ops = _operands(rest)
    if not ops:
        return 0, 0
    if mnemonic.startswith(_NO_DEST) or mnemonic.startswith(("v_cmpx",)):
        return _regs(",".join(ops)), 0
    n_dest = 2 if any(c in mnemonic for c in _CARRY) and len(ops) > 2 else 1
    defs = 0
    for o in ops[:n_dest]:
        defs |= _regs(o.split()[0] if o.split() else o)
    uses = 0
    for o in ops[n_dest:]:
        uses |= _regs(o)
    if "_d16" in mnemonic or "UNUSED_PRESERVE" in rest:
        uses |= defs
    return uses, defs


def parse_kernels(text: str, kernels) -> dict:
    """{kernel: [AmdInstr]} for each named kernel's body in ``text``, with the ``.loc``
    frames in effect at each instruction."""
    out = {k: [] for k in kernels}
    locs = LocTracker()
    cur, pending = None, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith((".file", ".loc")):
            locs.feed(line)
            continue
        m = _LABEL.match(line)
        if m:
            name = m.group(1)
            if name in out:
                cur, pending = out[name], []
            elif cur is not None:
                pending.append(name)
            continue
        if stripped.startswith(".Lfunc_end") or stripped.startswith(".end_amdgpu_metadata"):
            cur = None
            continue
        if cur is None:
            continue
        m = _MNEMONIC.match(line)
        if not m or stripped.startswith("."):
            continue
        mnemonic, rest = m.group(1), m.group(2)
        ins = AmdInstr(len(cur), mnemonic, stripped.split(";", 1)[0].strip(),
                       frames=locs.frames, labels=pending)
        pending = []
        if "::" in rest and mnemonic.startswith("v_dual"):
            left, right = rest.split("::", 1)
            u1, d1 = _one(mnemonic, left)
            m2 = _MNEMONIC.match(" " + right.strip())
            u2, d2 = _one(m2.group(1), m2.group(2)) if m2 else (0, 0)
            ins.uses, ins.defs = u1 | u2, d1 | d2
        else:
            ins.uses, ins.defs = _one(mnemonic, rest)
        if mnemonic == "s_branch" or mnemonic.startswith("s_cbranch"):
            target = _operands(rest)
            ins.label_target = target[0] if target else None
            ins.conditional = mnemonic != "s_branch"
            ins.ends = not ins.conditional
        elif mnemonic in ("s_endpgm", "s_setpc_b64", "s_endpgm_saved"):
            ins.ends = True
        cur.append(ins)
    return out


def kernel_steps(instrs: list) -> list:
    """:class:`~flashscope.isa.dataflow.Step` per instruction (a write always ends a
    life: AMDGCN has no per-instruction guard)."""
    at_label = {}
    for k, ins in enumerate(instrs):
        for lab in ins.labels:
            at_label[lab] = k
    steps = []
    for k, ins in enumerate(instrs):
        succ = set()
        if not ins.ends and k + 1 < len(instrs):
            succ.add(k + 1)
        named = (at_label[ins.label_target],) if ins.label_target in at_label else ()
        succ.update(named)
        steps.append(Step(ins.uses, ins.defs, ins.defs, tuple(sorted(succ)), named))
    return steps


def count(mask: int, cls: str) -> int:
    first, n = CLASSES[cls]
    return ((mask >> first) & ((1 << n) - 1)).bit_count()


def highest(mask: int, cls: str) -> "int | None":
    first, n = CLASSES[cls]
    m = (mask >> first) & ((1 << n) - 1)
    return m.bit_length() - 1 if m else None
