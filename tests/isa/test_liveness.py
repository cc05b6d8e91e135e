"""Liveness of the binary's own registers (flashscope.isa.dataflow with sass_flow and
amdgcn_flow): operand widths and control flow on hand-written instructions, and on real
builds the count equals ``nvdisasm --life-range-mode count`` at every instruction."""

import re

import pytest

from flashscope.errors import ArtifactError
from flashscope.isa import amdgcn_flow, nvidia, sass_flow
from flashscope.isa.dataflow import liveness

from .golden import CASES, case_id


def _regs(mask, cls="R"):
    first, n = sass_flow.CLASSES[cls]
    return sorted(b - first for b in range(first, first + n) if mask >> b & 1)


@pytest.mark.parametrize("line,defs,uses", [
    ("/*0000*/ HMMA.16816.F32.BF16 R4, R8, R12, R4 ;", [4, 5, 6, 7],
     [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]),
    ("/*0000*/ HMMA.16816.F16 R4, R8, R12, RZ ;", [4, 5], [8, 9, 10, 11, 12, 13]),
    ("/*0000*/ HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;", list(range(24, 88)),
     list(range(24, 88))),
    ("/*0000*/ HGMMA.64x64x16.F32.BF16 R88, R24, gdesc[UR16].tnspB, R88, gsb0 ;",
     list(range(88, 120)), list(range(24, 28)) + list(range(88, 120))),
    ("/*0000*/ LDG.E.128 R4, desc[UR8][R2.64] ;", [4, 5, 6, 7], [2, 3]),
    ("/*0000*/ STS.64 [R3+0x100], R6 ;", [], [3, 6, 7]),
    ("/*0000*/ IMAD.WIDE.U32 R2, R9, 0x2, R2 ;", [2, 3], [2, 3, 9]),
    ("/*0000*/ CS2R R28, SRZ ;", [28, 29], []),
    ("/*0000*/ LDSM.16.MT88.4 R124, [R12+0xa000] ;", [124, 125, 126, 127], [12]),
    ("/*0000*/ IADD3 R30, P3, R11, UR8, RZ ;", [30], [11]),
    ("/*0000*/ SHFL.BFLY PT, R21, R20, 0x2, 0x1f ;", [21], [20]),
    ("/*0000*/ BRX R6 -0x230 ;", [], [6, 7]),
])
def test_sass_operand_widths(line, defs, uses):
    ins = sass_flow.parse(line)
    assert _regs(ins.defs) == defs and _regs(ins.uses) == uses


def test_sass_predicates_and_uniform_registers():
    ins = sass_flow.parse("/*0010*/ @!P2 ISETP.GE.AND P0, PT, R6, UR23, PT ;")
    assert _regs(ins.defs, "P") == [0] and _regs(ins.uses, "P") == [2]
    assert _regs(ins.uses, "UR") == [23] and ins.kills == 0  # guarded: no certain write
    ins = sass_flow.parse("/*0020*/ HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12], RZ, !UPT ;")
    assert _regs(ins.uses, "UR") == [12, 13, 14, 15] and _regs(ins.uses) == []


def test_guarded_write_ends_a_life_for_the_span_before_only():
    """nvdisasm's rule: ``@P0 MOV R5`` whose ``@P0`` reader sits in a later span (after a
    branch target) ends R5's older life for the spans before it, though R5 stays live
    within its own span (the other lanes' value survives the guarded write there); a
    reader in the same span keeps the older value live before it."""
    text = """
        /*0000*/ MOV R5, 0x1 ;
        /*0010*/ STG.E desc[UR4][R2.64], R5 ;
        /*0020*/ @P1 BRA 0x40 ;
        /*0030*/ NOP ;
        /*0040*/ @P0 MOV R5, 0x2 ;
        /*0050*/ @P1 BRA 0x60 ;
        /*0060*/ @P0 STG.E desc[UR4][R2.64], R5 ;
        /*0070*/ EXIT ;"""
    instrs, steps = sass_flow.kernel_steps(text.strip().splitlines())
    live = [_regs(m | i.defs) for m, i in zip(liveness(steps), instrs)]
    assert 5 not in live[2] and 5 not in live[3]  # before the span at 0x40: dead
    assert 5 in live[4] and 5 in live[5] and 5 in live[6]
    same_span = text.replace("/*0050*/ @P1 BRA 0x60 ;", "/*0050*/ NOP ;")
    instrs, steps = sass_flow.kernel_steps(same_span.strip().splitlines())
    live = [_regs(m | i.defs) for m, i in zip(liveness(steps), instrs)]
    assert 5 in live[2] and 5 in live[3]


def test_loop_keeps_its_carried_value_live():
    text = """
        /*0000*/ MOV R4, RZ ;
        /*0010*/ FADD R4, R4, 1 ;
        /*0020*/ ISETP.LT.AND P0, PT, R4, 0x10, PT ;
        /*0030*/ @P0 BRA 0x10 ;
        /*0040*/ STG.E desc[UR4][R2.64], R4 ;
        /*0050*/ EXIT ;"""
    instrs, steps = sass_flow.kernel_steps(text.strip().splitlines())
    live = [_regs(m | i.defs) for m, i in zip(liveness(steps), instrs)]
    assert all(4 in lv and 2 in lv for lv in live[:5]) and live[5] == []


def test_amdgcn_operands_and_loop():
    text = """_k:
	v_mov_b32_e32 v1, 0
	s_mov_b32 s4, 0
.LBB0_1:
	v_mfma_f32_32x32x8_bf16 a[0:15], v[2:3], v[4:5], a[0:15]
	v_add_co_u32 v6, vcc, v6, v1
	s_add_i32 s4, s4, 1
	s_cmp_lt_i32 s4, 8
	s_cbranch_scc1 .LBB0_1
	ds_write_b64 v1, v[2:3]
	s_endpgm
.Lfunc_end0:"""
    (instrs,) = amdgcn_flow.parse_kernels(text, ["_k"]).values()
    steps = amdgcn_flow.kernel_steps(instrs)
    live = [m | i.defs for m, i in zip(liveness(steps), instrs)]
    mfma = live[2]
    assert amdgcn_flow.count(mfma, "a") == 16 and amdgcn_flow.count(mfma, "s") == 1
    assert amdgcn_flow.count(instrs[3].defs, "v") == 1  # v6; vcc is not counted
    assert steps[6].succ == (2, 7)  # the loop back to .LBB0_1
    assert amdgcn_flow.count(live[7], "v") == 3  # v1, v2, v3 for the store


def _ours(art):
    listing = nvidia.disassemble_many([art.binary])[0]
    lines = [ln for _, ln in nvidia.sass_lines(listing)[art.name]]
    start = int(re.match(r"^\s*/\*([0-9a-f]+)\*/", lines[0]).group(1), 16)
    instrs, steps = sass_flow.kernel_steps(lines, start, None,
                                           nvidia.indirect_branches(art.binary, art.name))
    return {i.addr: (sass_flow.count(m | i.defs), i.opcode)
            for i, m in zip(instrs, liveness(steps))}


def _reference(art):
    """nvdisasm's counts, or None where this Triton's nvdisasm cannot analyse the cubins
    its ptxas makes (Triton 3.9: nvdisasm 13.1 against sm_80 cubins of ptxas 12.9)."""
    try:
        return nvidia.live_counts(art.binary)[art.name]
    except ArtifactError as e:
        if "flow analysis is disabled" in str(e):
            return None
        raise


def test_equals_nvdisasm_on_every_instruction(artifacts, user_builds):
    """The same count as nvdisasm at every instruction of every kernel without CALL
    (Triton, tutorial-style and small kernels, sm80 and sm90). Where ptxas leaves a loop
    with ``CALL.REL.NOINC`` (a jump: nothing returns), nvdisasm treats the target as
    another function and drops what the code after the loop needs: there ours is never
    lower off the CALL itself, and higher across the loop."""
    arts = [artifacts[case_id(CASES[0])], artifacts[case_id(CASES[1])]] + [
        a for a in user_builds if a.vendor == "nvidia"]
    exact = exact_kernels = with_call = unread = 0
    for art in arts:
        ref = _reference(art)
        if ref is None:
            unread += 1
            continue
        ours = _ours(art)
        calls = {a for a, (_, op) in ours.items() if op.startswith("CALL")}
        if calls:
            assert all(ours[a][0] >= n for a, n in ref.items() if a not in calls), art.kernel
            assert sum(ours[a][0] > n for a, n in ref.items()) > 10, art.kernel
            with_call += 1
            continue
        bad = [(hex(a), n, ours.get(a)) for a, n in ref.items() if ours.get(a, (None,))[0] != n]
        assert not bad, (art.kernel, art.target, bad[:5])
        exact += len(ref)
        exact_kernels += 1
    if unread:  # a release whose nvdisasm reads only some of its own cubins
        assert exact_kernels + with_call + unread == len(arts) and exact_kernels >= 1
        return
    assert exact_kernels >= 4 and exact > 2500 and with_call >= 2


def test_255_registers_where_nvdisasm_refuses(spilling_255):
    with pytest.raises(ArtifactError, match="Invalid register count|flow analysis is disabled"):
        nvidia.live_counts(spilling_255.binary)
    counts = [n for n, _ in _ours(spilling_255).values()]
    assert max(counts) <= 255 and max(counts) > 200
