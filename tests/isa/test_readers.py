"""Readers on real artifacts: golden values, feature flags, cross-checks, files on disk,
and fuzzing (truncated, bit-flipped and random inputs raise only ArtifactError)."""

import dataclasses
import json
import random
import shutil
import sys

import pytest

from flashscope.errors import ArtifactError
from flashscope.isa import amd, diff, nvidia, read_binary, read_path, record_for

from .golden import CASES, FIELDS, case_id, golden_path, ptxas_version


@pytest.fixture(scope="module")
def records(artifacts):
    return {k: record_for(a) for k, a in artifacts.items()}


def test_golden_values(records):
    """The running Triton's golden values (tests/data/isa/golden/triton-<version>.json;
    tests/isa/golden.py writes them). An NVIDIA case is compared only where this Triton
    runs the ptxas its values came from: a GPU image may point Triton at its CUDA's."""
    import triton

    path = golden_path(triton.__version__)
    if not path.exists():
        have = sorted(p.stem.removeprefix("triton-") for p in path.parent.glob("triton-*.json"))
        pytest.skip(f"no golden values for Triton {triton.__version__} (there are for "
                    f"{', '.join(have)}): write them with `python tests/isa/golden.py --write`")
    golden = json.loads(path.read_text())
    assert golden["triton"] == triton.__version__
    assert set(golden["cases"]) == {case_id(c) for c in CASES}
    other = []
    for case in CASES:
        want = golden["cases"][case_id(case)]
        ptxas = ptxas_version(case[0])
        if ptxas != want["ptxas"]:
            other.append(f"{case[0]}: ptxas {ptxas}, values for {want['ptxas']}")
            continue
        got = records[case_id(case)].as_dict()
        assert {k: got[k] for k in FIELDS} == {k: want[k] for k in FIELDS}, case_id(case)
    if other:
        pytest.skip(f"NVIDIA cases left out ({'; '.join(other)}); the others checked")


def test_feature_flags(records):
    sm90, sm80, spill, gfx = (records[case_id(c)] for c in CASES)
    assert sm90.opcodes.get("HGMMA", 0) > 0 and "uses_wgmma" in sm90.features
    assert sm80.opcodes.get("HMMA", 0) > 0 and sm80.opcodes.get("LDSM", 0) > 0
    assert "uses_wgmma" not in sm80.features and "uses_ldmatrix" in sm80.features
    assert spill.opcodes["STL"] > 0 and spill.opcodes["LDL"] > 0 and spill.local_bytes > 0
    assert spill.registers == 32 and "spills" in spill.features
    assert (spill.spill_stores, spill.spill_loads) == (spill.opcodes["STL"], spill.opcodes["LDL"])
    assert gfx.mix["mfma"] > 0 and "uses_mfma" in gfx.features
    assert gfx.spill_stores is None and gfx.sgprs > 0 and gfx.agprs is not None
    for r in (sm90, sm80, spill):
        assert r.agprs is None and r.sgprs is None and r.vgpr_spills is None
        assert r.shared_bytes == r.static_shared_bytes + r.dynamic_shared_bytes


def test_cubin_agrees_with_cuobjdump(artifacts, records):
    for case in CASES[:3]:
        art, rec = artifacts[case_id(case)], records[case_id(case)]
        ru = nvidia.resource_usage(art.binary)[art.name]
        # cuobjdump's SHARED is the whole .nv.shared section: the sm_90 system window too
        assert (ru["REG"], ru["SHARED"], ru["STACK"]) == (
            rec.registers, rec.static_shared_bytes + rec.reserved_shared_bytes,
            rec.local_bytes), case_id(case)
        assert rec.dynamic_shared_bytes == art.metadata["shared"]
        assert rec.reserved_shared_bytes == (1024 if case[0] == "sm90" else 0), case_id(case)
        assert rec.static_shared_bytes == 0  # Triton's kernels use dynamic shared only
        assert rec.shared_bytes == rec.dynamic_shared_bytes


def test_amd_counts_are_the_code_objects(hsaco, records):
    meta = amd.metadata(hsaco.binary)["amdhsa.kernels"][0]
    rec = records[case_id(CASES[3])]
    assert rec.registers == meta[".vgpr_count"]  # unified count; AGPRs not added again
    assert rec.agprs == meta[".agpr_count"] and rec.sgprs == meta[".sgpr_count"]
    assert rec.local_bytes == meta[".private_segment_fixed_size"]
    assert rec.shared_bytes == meta[".group_segment_fixed_size"] + hsaco.metadata["shared"]
    assert rec.wave_size == 64 and rec.threads == 64 * hsaco.metadata["num_warps"]


def test_lds_widths():
    from collections import Counter

    mix, feats = amd.mix_of(Counter({"ds_read_b128": 2, "ds_read2_b64": 3, "ds_read_u16": 1,
                                     "ds_write_b64": 4, "v_mfma_f32_32x32x8_bf16": 5,
                                     "scratch_store_dword": 1}))
    assert mix["ds_read.b128"] == 5 and mix["ds_read.b16"] == 1 and mix["ds_write.b64"] == 4
    assert mix["ds_read"] == 6 and mix["mfma"] == 5 and feats == ["uses_mfma", "spills"]


def test_sass_parsing_keeps_mufu_function():
    sass = """
        .section	.text.k,"ax",@progbits
        /*0000*/                   MUFU.EX2 R1, R2 ;
        /*0010*/              @!P0 MUFU.RCP R1, R2 ;
        /*0020*/                   STL.64 [R1], R2 ;
        /*0030*/              @P1  LDL R3, [R1] ;
    """
    assert nvidia.split_sass(sass) == {"k": ["MUFU.EX2", "MUFU.RCP", "STL", "LDL"]}


def test_loops_are_the_branches_back_before_the_last_exit():
    """An outer loop holding an inner one gives both bodies; a forward branch gives none;
    the try-wait retry past EXIT, which jumps back into the inner loop, is not a loop."""
    sass = """
        .section	.text.k,"ax",@progbits
        /*0000*/                   MOV R1, RZ ;
.L_x_0:
        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;
.L_x_1:
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0030*/              @!P0 BRA `(.L_x_3) ;
.L_x_2:
        /*0040*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ ;
        /*0050*/               @P1 BRA `(.L_x_1) ;
        /*0060*/               @P2 BRA `(.L_x_0) ;
        /*0070*/               @P3 BRA `(.L_x_4) ;
.L_x_4:
        /*0080*/                   EXIT ;
.L_x_3:
        /*0090*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*00a0*/              @!P0 BRA `(.L_x_3) ;
        /*00b0*/                   BRA `(.L_x_2) ;
    """
    inner, outer = nvidia.loops(sass)["k"]
    assert [op for op, _ in inner] == ["SYNCS", "BRA", "HGMMA", "BRA"]
    assert [op for op, _ in outer] == ["IADD3", "SYNCS", "BRA", "HGMMA", "BRA", "BRA"]
    (only,) = nvidia.loops(sass.replace("@P1 BRA `(.L_x_1)", "@P1 BRA `(.L_x_4)"))["k"]
    assert [op for op, _ in only] == [op for op, _ in outer]


_CHAIN = """
        .section	.text.k,"ax",@progbits
        /*0000*/                   WARPGROUP.ARRIVE ;
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, R96, gdesc[UR8], RZ, !UPT, gsb0 ;
        /*0020*/                   UIADD3 UR10, UP1, UR10, 0x2, URZ ;
        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0040*/                   WARPGROUP.ARRIVE ;
        /*0050*/                   HGMMA.64x128x16.F32.BF16 R24, R92, gdesc[UR8], R24, gsb0 ;
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0070*/                   {between}
        /*0080*/                   WARPGROUP.ARRIVE ;
        /*0090*/                   HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR20], R24, gsb0 ;
        /*00a0*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR4], RZ, !UPT ;
        /*00b0*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR6], R88 ;
        /*00c0*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR8], R88, gsb0 ;
        /*00d0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*00e0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
"""


@pytest.mark.parametrize("between,count", [
    ("IADD3 R2, R3, 0x1, RZ ;", 2),  # a register outside the accumulator
    ("FMUL R30, R30, R3 ;", 1),  # the accumulator (R24..R87) rescaled in between
    ("FMUL R87, R87, R3 ;", 1),  # its last register
    ("FMUL R88, R88, R3 ;", 2)])  # the register after it
def test_serialized_wgmma_chains(between, count):
    """The k-steps of the 64 x 128 product wait for each other (each closes its group and
    a wait-all follows): the second and third count, unless the accumulator is written in
    between (then the third is a new product on purpose). The streaming 64 x 64 chain
    (no gsb0 until its last step) counts nothing, nor does a wgmma into another
    accumulator after a wait."""
    sass = _CHAIN.replace("{between}", between)
    assert nvidia.serialized_wgmma(sass) == {"k": count}


def test_serialized_wgmma_in_a_build():
    """Q_IN_REGS at D = 64 with three 192 x 128 consumers needs more registers than 160:
    ptxas serializes every wgmma after the first of each product (C7512), all 72 but
    one a group; the tuned entry without it streams them."""
    from flashscope import compile as fcompile

    cfg = ("sm90-fwd:BLOCK_M=192,num_stages=3,PINGPONG=1,LAZY_RESCALE=0,EARLY_Q=0,K_EARLY=0,"
           "MASKED_FIRST=0,OUT_RCP=0,Q_IN_REGS={}")
    recs = {q: record_for(fcompile.build(cfg.format(q), "sm90", head_dim=64,
                                         return_lse=True)) for q in (0, 1)}
    assert recs[0].wgmma_serialized == 0 and "wgmma_serialized" not in recs[0].features
    hgmma = recs[1].opcodes["HGMMA"]
    assert recs[1].wgmma_serialized == hgmma - 12 > 0, (recs[1].wgmma_serialized, hgmma)
    assert "wgmma_serialized" in recs[1].features


def test_triton_cache_dir_and_bare_files(tmp_path, artifacts):
    """A Triton-style cache: <hash>/<name>.json + binary (+ .amdgcn)."""
    for i, art in enumerate(artifacts.values()):
        d = tmp_path / "cache" / f"h{i}"
        d.mkdir(parents=True)
        (d / f"{art.name}.{art.binary_ext}").write_bytes(art.binary)
        (d / f"{art.name}.json").write_text(json.dumps(art.metadata))
        if art.vendor == "amd":
            (d / f"{art.name}.amdgcn").write_text(art.asm)
    recs = read_path(tmp_path / "cache")
    assert len(recs) == len(artifacts)
    by_src = {r.source.split("/")[-2]: r for r in recs}
    for i, art in enumerate(artifacts.values()):
        r, want = by_src[f"h{i}"], record_for(art)
        assert (r.registers, r.shared_bytes, r.threads, r.mix) == (
            want.registers, want.shared_bytes, want.threads, want.mix)
    # a bare cubin: no Triton metadata, so no dynamic shared; threads from REQNTID
    art = artifacts[case_id(CASES[0])]
    bare = tmp_path / "k.cubin"
    bare.write_bytes(art.binary)
    (r,) = read_path(bare)
    assert r.dynamic_shared_bytes is None and r.threads == 256 and r.target == "sm90"


def test_flashscope_cache_entry_keeps_constants(artifacts):
    art = artifacts[case_id(CASES[1])]
    (r,) = read_path(art.path)
    from flashscope import TritonFwdConfig

    assert r.constants == art.constants
    assert r.config["key"] == TritonFwdConfig(64, 64, 4, 2).key
    assert r.config["label"] == "triton-fwd 64x64 w4 s2"


def test_diff(records):
    a, b = records[case_id(CASES[1])], records[case_id(CASES[2])]
    d = diff(a, b)
    assert d["fields"]["registers"]["delta"] == b.registers - a.registers
    assert d["fields"]["agprs"]["delta"] is None
    assert d["mix"]["local"]["delta"] == b.mix["local"] - a.mix["local"] > 0


@pytest.mark.parametrize("data, match", [
    (b"", "not an ELF"),
    (b"hello world" * 10, "not an ELF"),
    (b"\x7fELF" + b"\0" * 10, "not an ELF"),
])
def test_not_elf(data, match):
    with pytest.raises(ArtifactError, match=match):
        read_binary(data, "x")


def test_elf_of_another_kind():
    with open(sys.executable, "rb") as f:
        data = f.read(1 << 20)
    exe = open(shutil.which("ls") or sys.executable, "rb").read()
    with pytest.raises(ArtifactError, match="not a GPU binary|corrupt"):
        read_binary(exe, "ls")
    with pytest.raises(ArtifactError):
        read_binary(data, "python (first MB)")


def _mutations(data: bytes, rng: random.Random, n: int):
    for _ in range(n):
        kind = rng.randrange(3)
        if kind == 0:
            yield data[:rng.randrange(len(data))]
        elif kind == 1:
            b = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                # Bias flips toward the headers and tables where parsing decisions live.
                pos = rng.randrange(min(len(b), 4096) if rng.random() < 0.7 else len(b))
                b[pos] ^= 1 << rng.randrange(8)
            yield bytes(b)
        else:
            yield b"\x7fELF" + bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 512)))


def test_fuzz_readers(cubin, hsaco):
    """1,200 mutated inputs: each is read or raises ArtifactError, nothing else. SASS is
    stubbed (one nvdisasm call per case would dominate the run; the subprocess path is
    covered below)."""
    rng = random.Random(1234)
    ok = 0
    for data in _mutations(cubin, rng, 600):
        try:
            nvidia.read_cubin(data, "fuzz", sass="")
            ok += 1
        except ArtifactError:
            pass
    for data in _mutations(hsaco.binary, rng, 600):
        try:
            amd.read_hsaco(data, "fuzz", text=hsaco.asm)
            ok += 1
        except ArtifactError:
            pass
    assert 0 < ok < 1200


def test_fuzz_through_nvdisasm(cubin):
    rng = random.Random(7)
    for data in _mutations(cubin, rng, 12):
        try:
            read_binary(data, "fuzz")
        except ArtifactError:
            pass


def test_cuda13_cubin_layout():
    """ptxas 13 (ELF ABI 8) moved the SM number to e_flags bits 8..15 and the barrier count
    into .nv.info; the GPU image's Triton uses it. tests/data/isa/cuda13_sm90.cubin is
    `nvcc -cubin -arch=sm_90 barrier_kernel.cu` with CUDA 13.0 (one __syncthreads)."""
    from pathlib import Path

    from flashscope.isa import nvidia

    data = (Path(__file__).parents[1] / "data/isa/cuda13_sm90.cubin").read_bytes()
    (rec,) = nvidia.read_cubin(data, "cuda13_sm90.cubin")
    assert (rec["arch"], rec["barriers"], rec["static_shared_bytes"]) == ("sm90", 1, 256)
    assert rec["registers"] > 0 and rec["mix"]["barrier"] >= 1


def test_batched_disassembly_equals_one_by_one(artifacts):
    """disassemble_many (one raw-stream nvdisasm run per architecture) gives every kernel
    the opcodes that the ELF-mode listing of its own cubin gives, in the same order, across
    archs and with a corrupt cubin in the batch (that one is left to be read alone)."""
    from pathlib import Path

    cubins = [artifacts[case_id(c)].binary for c in CASES[:3]]
    cuda13 = (Path(__file__).parents[1] / "data/isa/cuda13_sm90.cubin").read_bytes()
    batch = [cubins[0], cubins[1], b"\x7fELF-not-really", cubins[2], cuda13, cubins[0]]
    got = nvidia.disassemble_many(batch)
    assert got[2] is None
    for data, sass in zip(batch, got):
        if data.startswith(b"\x7fELF-"):
            continue
        want = nvidia.split_sass(nvidia.disassemble(data))
        assert nvidia.split_sass(sass) == want
        assert all(want.values())


def test_batched_records_equal_single_records(artifacts, records):
    from flashscope.isa.read import records_for

    fresh = [dataclasses.replace(artifacts[case_id(c)], path=None) for c in CASES]  # unstored
    for case, rec in zip(CASES, records_for(fresh)):
        assert rec.as_dict() == records[case_id(case)].as_dict() | {"source": None}


def test_global_widths_from_sass_and_amdgcn():
    """Global loads and stores by the bits a thread (lane) moves: SASS width modifiers (a
    cache hint such as LTC128B is not a width; none means 32 bits; LDGSTS counts as a
    load, shared and local accesses not at all), amdgcn mnemonics of both naming schemes
    (a format access, whose width the mnemonic does not name, left out)."""
    from collections import Counter

    from flashscope.isa import amd, nvidia

    sass = "\n".join(f"        /*{i * 16:04x}*/                   {ins} ;" for i, ins in enumerate((
        "LDG.E.128 R4, desc[UR4][R2.64]", "@P0 LDG.E.U16 R8, desc[UR4][R6.64]",
        "LDG.E.LTC128B.128 R12, desc[UR4][R10.64]", "LDG.E R9, desc[UR4][R2.64]",
        "LDGSTS.E.BYPASS.128 [R3], desc[UR6][R4.64]", "STG.E.64 desc[UR4][R2.64], R4",
        "STG.E.U16 desc[UR4][R2.64], R7", "LDS.128 R4, [R2]", "STL [R1], R4")))
    lines = [(op, line) for line in sass.splitlines()
             for op in [nvidia._opcode(line)] if op]
    assert nvidia.global_widths(lines) == {"load.b16": 1, "load.b32": 1, "load.b128": 3,
                                           "store.b16": 1, "store.b64": 1}
    ops = Counter({"global_load_dwordx4": 3, "global_load_ushort": 2, "global_load_b128": 1,
                   "buffer_store_short_d16_hi": 1, "global_store_b16": 4,
                   "buffer_load_format_x": 2, "global_load_lds_dwordx4": 1, "ds_read_b128": 7})
    assert amd.global_widths(ops) == {"load.b16": 2, "load.b128": 5, "store.b16": 5}
    from flashscope.isa.record import KernelRecord

    rec = KernelRecord("k", "sm90", "nvidia", global_widths={"load.b16": 30, "load.b128": 90,
                                                             "store.b16": 50})
    assert rec.narrow_loads == (30, 120)
