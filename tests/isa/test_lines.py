"""The per-line view (flashscope.isa.lines) on real builds for sm80, sm90, gfx942 and
gfx1100: checks that tie it to what the binary declares, attribution of inlined helpers,
spills per line, and the binaries without PTX, line tables or text."""

import json

import pytest

from flashscope import cli
from flashscope.errors import ArtifactError
from flashscope.isa import dwarf_lines, elf, lines
from flashscope.isa.read import record_for

from .golden import CASES, case_id


def _view(art):
    (view,) = [v for v in lines.lines_for_binary(art.binary, "t", art.asm, target=art.target)
               if v.kernel == art.name]
    return view


def _every_kernel(artifacts, user_builds):
    return list(artifacts.values()) + list(user_builds)


def test_checks_hold_on_every_kernel_and_target(artifacts, user_builds, spilling_255):
    """highest register + 1 + reserved = the allocation the binary declares; live peak at
    most the allocation; rows add up; the PTX chain agrees with .debug_line."""
    seen = set()
    for art in _every_kernel(artifacts, user_builds) + [spilling_255]:
        v = _view(art)
        assert v.checks and all(c["ok"] for c in v.checks), (art.kernel, art.target, v.checks)
        assert v.line_table and v.call_sites and v.live_peak <= v.registers
        assert v.gap == v.registers - v.live_peak
        rec = record_for(art)
        assert v.registers == rec.registers
        if v.vendor == "nvidia":
            assert v.highest_register["R"] + 3 == rec.registers
        seen.add(art.target)
    assert seen == {"sm80", "sm90", "gfx942", "gfx1100"}
    v = _view(spilling_255)
    assert v.highest_register["R"] == 252 and v.registers == 255


def test_json_rows_and_inlined_helpers(user_builds):
    """Each row names its file, line and text; an instruction of an inlined helper counts
    on its own line and under ``inlined`` at each call site up to the kernel."""
    art = next(a for a in user_builds if a.kernel == "attention" and a.target == "sm90")
    v = _view(art)
    d = json.loads(json.dumps(v.as_dict()))
    for r in d["rows"]:
        for key in ("file", "line", "source", "instructions", "live_registers_max",
                    "spill_stores", "spill_loads"):
            assert key in r
    if not any("@[" in ln and "tutorial_attention.py:18:" in ln for ln in art.asm.splitlines()):
        pytest.skip("this Triton's PTX gives the helper's lines no call site (3.9 keeps "
                    "almost none)")
    rows = {(r.file.rsplit("/", 1)[-1], r.line): r for r in v.rows}
    dot = next(r for k, r in rows.items() if r.source and "tl.dot(q, k)" in r.source)
    assert dot.helper and dot.count > 0 and dot.instructions.get("mma", 0) > 0
    # the call of _fold_tiles (Triton places it on the call's last line)
    call = max((r for r in v.rows if r.inlined and not r.helper),
               key=lambda r: r.inlined["count"])
    assert 40 <= call.line <= 42 and call.inlined["count"] >= dot.count
    assert call.inlined["instructions"]["mma"] >= dot.instructions["mma"]
    tl_max = [r for r in v.rows if "/triton/language/" in r.file]
    assert tl_max and all(r.helper for r in tl_max)
    assert sum(r.count for r in v.rows) + v.unattributed == v.instructions


def test_spills_per_line_add_up_to_the_binary(artifacts):
    art = artifacts[case_id(CASES[2])]  # sm80 with maxnreg=32: spills
    v, rec = _view(art), record_for(art)
    assert rec.spill_stores > 0
    assert sum(r.spill_stores for r in v.rows) == rec.spill_stores
    assert sum(r.spill_loads for r in v.rows) == rec.spill_loads
    assert any(r.spill_stores for r in v.rows if not r.helper or r.inlined)


def test_loops_by_structure(artifacts):
    """Each build's key-tile loop is found at its ``for`` line with the products in it;
    a loop's sums are those of its instructions (spills included: the sm80 build capped
    at 32 registers spills inside its loop), and loops nest by address."""
    for art in artifacts.values():
        v, rec = _view(art), record_for(art)
        keyed = [d for d in v.loops if d["source"] and "for start_n in" in d["source"]]
        assert keyed, (art.target, [d["source"] for d in v.loops])
        for d in keyed:
            mix = d["instructions"]
            assert mix.get("mma", 0) + mix.get("mfma", 0) + mix.get("wmma", 0) > 0
            assert d["count"] <= v.instructions and d["first"] <= d["last"]
            if rec.spill_stores is not None:  # NVIDIA: STL, counted in the binary too
                assert d["spill_stores"] <= rec.spill_stores
        for d in v.loops:
            around = [e for e in v.loops if e is not d and e["first"] <= d["first"]
                      and d["last"] <= e["last"]]
            assert d["depth"] == len(around)
    capped = _view(artifacts[case_id(CASES[2])])
    assert any(d["spill_stores"] and d["depth"] == 0 for d in capped.loops)


def test_loops_of_a_warp_specialized_kernel():
    """The Hopper backward (three partitions): the consumer's two query-tile loops (the
    masked diagonal and the whole tiles), 32 wgmma each, inside its loop over the GQA
    group; the retry blocks ptxas puts past the last EXIT (failed mbarrier waits jumping
    back) close no loop."""
    from flashscope.compile import build
    from flashscope.families.sm90_bwd import Sm90BwdConfig

    art = build(Sm90BwdConfig(), "sm90", kernel="sm90-bwd", head_dim=128, causal=True)
    v = _view(art)
    inner = [d for d in v.loops if d["instructions"].get("mma")
             and "for start_m in range(" in (d["source"] or "")]
    assert [d["instructions"]["mma"] for d in inner] == [32, 32]
    (group,) = [d for d in v.loops if d["instructions"].get("mma", 0) == 64]
    assert "for g in range" in group["source"]
    assert all(group["first"] <= d["first"] and d["last"] <= group["last"]
               and d["depth"] == group["depth"] + 1 for d in inner)
    (_, instrs, *_), = [x for k, x in lines.nvidia_instructions(art.binary, "t").items()
                        if k == art.name]
    last_exit = max(i.address for i in instrs if i.opcode == "EXIT")
    assert all(d["last"] < last_exit for d in v.loops)


def test_bare_cubin_gives_own_lines_and_says_the_call_sites_are_unknown(artifacts):
    art = artifacts[case_id(CASES[0])]
    full = _view(art)
    (bare,) = lines.lines_for_binary(art.binary, "bare.cubin")
    assert not bare.call_sites and "call sites unknown" in bare.note
    own = {(r.file, r.line): r.count for r in full.rows if r.count}
    assert {(r.file, r.line): r.count for r in bare.rows if r.count} == own


def test_ptx_of_another_build_is_not_used(artifacts):
    a, b = artifacts[case_id(CASES[0])], artifacts[case_id(CASES[1])]
    (v,) = lines.lines_for_binary(a.binary, "a.cubin", b.asm)
    check = next(c for c in v.checks if c["name"] == "PTX matches the cubin")
    assert not check["ok"] and not v.call_sites


def test_corrupt_line_table_is_one_error(artifacts):
    art = artifacts[case_id(CASES[0])]
    e, _ = elf.open_elf(art.binary)
    data = elf.section_data(e, ".debug_line", "t")
    with pytest.raises(ArtifactError, match="line table"):
        dwarf_lines.programs(data[:40], "t")
    with pytest.raises(ArtifactError, match="version 7"):
        dwarf_lines.programs(data[:4] + b"\x07\x00" + data[6:], "t")


def test_code_object_alone_has_no_lines(artifacts):
    art = artifacts[case_id(CASES[3])]
    with pytest.raises(ArtifactError, match="amdgcn text"):
        lines.lines_for_binary(art.binary, "k.hsaco")


def test_kernel_without_shared_memory_on_sm90(user_builds):
    """No .nv.shared.<k> section at all: static and reserved shared memory are 0 (the
    reader refused such cubins before)."""
    art = next(a for a in user_builds if a.kernel == "add" and a.target == "sm90")
    rec = record_for(art)
    assert rec.static_shared_bytes == 0 and rec.reserved_shared_bytes == 0


def _run(capsys, *argv):
    code = cli.main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_lines_json_and_csv(capsys, artifacts):
    code, out, err = _run(capsys, "--target", "sm80", "--config",
                          "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2", "--head-dim",
                          "64", "--causal", "--lines", "--json")
    assert code == 0, err
    (k,) = json.loads(out)["kernels"]
    from flashscope.isa import record_for

    from .golden import CASES, case_id

    assert CASES[1] == ("sm80", "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2", 64, True)
    regs = record_for(artifacts[case_id(CASES[1])]).registers
    assert k["registers"] == regs and k["lines"]["registers"] == regs
    assert all(c["ok"] for c in k["lines"]["checks"]) and k["cliffs"]
    code, out, _ = _run(capsys, "--target", "sm80", "--config",
                        "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2", "--head-dim", "64",
                        "--causal", "--lines", "--csv")
    head = out.splitlines()[0].split(",")
    assert code == 0 and {"file", "line", "live_registers_max", "spill_stores"} <= set(head)
    code, out, _ = _run(capsys, "--target", "sm80", "--config",
                        "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2", "--head-dim", "64",
                        "--causal", "--lines", "--top", "5")
    assert code == 0 and "checks 4/4 ok" in out and "at the peak" in out


def test_inspect_lines_on_files_without_lines(capsys, tmp_path, artifacts):
    """A code object without its amdgcn text and a cubin stripped of its line table: the
    totals are printed, then one line says what is missing, exit 2."""
    hsaco = tmp_path / "k.hsaco"
    hsaco.write_bytes(artifacts[case_id(CASES[3])].binary)
    code, out, err = _run(capsys, str(hsaco), "--lines")
    assert code == 2 and "gfx942" in out and "amdgcn text" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    data = bytearray(artifacts[case_id(CASES[0])].binary)
    e, _ = elf.open_elf(bytes(data))
    for name in (".debug_line", ".nv_debug_line_sass"):  # rename: no line table left
        off = data.find(name.encode() + b"\0")
        data[off + 1] = ord("X")
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(bytes(data))
    code, out, err = _run(capsys, str(cubin), "--lines")
    assert code == 2 and "115" in out and "no line table" in err
    code, out, err = _run(capsys, "--diff", str(cubin), str(cubin), "--lines")
    assert code == 2 and "registers" in out and "no line table" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_diff_by_loop_and_line(capsys, artifacts, tmp_path):
    """Two sm80 builds (the second capped at 32 registers): loops matched by statement,
    depth and rank, their counts as each view has them; the changed lines ranked by the
    size of the change; the same through ``inspect --diff A B --lines``."""
    a, b = (artifacts[case_id(CASES[i])] for i in (1, 2))
    va, vb = _view(a), _view(b)
    d = lines.diff_lines(va, vb, top=5)
    assert d["instructions"] == {"a": va.instructions, "b": vb.instructions,
                                 "delta": vb.instructions - va.instructions}
    by_key = {}
    for lp in va.loops:
        by_key.setdefault((lp["file"], lp["line"], lp["depth"]), []).append(lp["count"])
    for e in d["loops"]:
        if e["a"] is not None:
            assert e["a"]["count"] == by_key[(e["file"], e["line"], e["depth"])][e["rank"]]
        if e["a"] is not None and e["b"] is not None:
            assert e["delta"] == e["b"]["count"] - e["a"]["count"]
    assert len(d["loops"]) >= max(len(va.loops), len(vb.loops))
    assert 0 < len(d["lines"]) <= 5
    ca = {(r.file, r.line): r.count for r in va.rows if r.count}
    cb = {(r.file, r.line): r.count for r in vb.rows if r.count}
    change = {k: abs(cb.get(k, 0) - ca.get(k, 0)) for k in set(ca) | set(cb)}
    kept = {(e["file"], e["line"]) for e in d["lines"]}
    assert min(change[k] for k in kept) >= max(
        (change[k] for k in change if k not in kept), default=0)
    pa, pb = tmp_path / "a.cubin", tmp_path / "b.cubin"
    pa.write_bytes(a.binary)
    pb.write_bytes(b.binary)
    code, out, err = _run(capsys, "--diff", str(pa), str(pb), "--lines", "--json")
    got = json.loads(out)
    assert code == 0, err
    assert got["by_line"]["instructions"]["delta"] == d["instructions"]["delta"]
    assert len(got["by_line"]["lines"]) == min(20, len(got["by_line"]["lines"]))
    code, out, _ = _run(capsys, "--diff", str(pa), str(pb), "--lines", "--top", "3")
    assert code == 0 and "B - A by loops" in out and "changed most" in out
    code, out, _ = _run(capsys, "--diff", str(pa), str(pb), "--lines", "--csv")
    assert code == 0 and "loop " in out and "line " in out
    # config operands build (or find) their kernels the way --config does
    code, out, err = _run(capsys, "--target", "sm80", "--head-dim", "64", "--diff",
                          "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2",
                          "BLOCK_M=128,BLOCK_N=64,num_warps=4,num_stages=2,maxnreg=32",
                          "--lines", "--json")
    got = json.loads(out)
    assert code == 0, err
    assert got["fields"]["registers"]["b"] == 32 and got["by_line"]["loops"]


def test_diff_lines_on_made_up_views():
    """A loop or line on one side only: None on the other and no delta; loops at one
    statement matched by rank; B's extra loop listed after A's."""
    def view(loops, rows):
        return lines.KernelLines(kernel="k", target="sm90", vendor="nvidia", rows=rows,
                                 instructions=sum(r.count for r in rows), unattributed=0,
                                 line_table=True, call_sites=True, registers=None,
                                 highest_register={}, reserved_registers=None,
                                 live_peak=None, live_mean=None, gap=None, peak=None,
                                 checks=[], loops=loops)

    def loop(line, count, depth=0):
        return {"file": "f.py", "line": line, "depth": depth, "source": None,
                "count": count, "instructions": {}, "live_registers_max": 1,
                "spill_stores": 0, "spill_loads": 0}

    row = lines.LineRow
    a = view([loop(10, 100), loop(10, 90), loop(20, 5)],
             [row("f.py", 10, count=7), row("f.py", 11, count=3)])
    b = view([loop(10, 110), loop(10, 80), loop(30, 4)],
             [row("f.py", 10, count=9), row("f.py", 12, count=1)])
    d = lines.diff_lines(a, b, top=0)
    assert [(e["line"], e["rank"], e["delta"]) for e in d["loops"]] == [
        (10, 0, 10), (10, 1, -10), (20, 0, None), (30, 0, None)]
    assert d["loops"][2]["b"] is None and d["loops"][3]["a"] is None
    assert [(e["line"], e["delta"]) for e in d["lines"]] == [(10, 2), (11, None), (12, None)]
    assert [e["line"] for e in lines.diff_lines(a, b, top=1)["lines"]] == [11]


def test_a_build_naming_a_removed_checkout_reads_the_installed_files(artifacts):
    """A cached build of flashscope's kernels whose line tables name a checkout since
    removed (Triton's cache and flashscope's key a kernel on its text) gets its texts
    from the installed package, the rows and the peak's lines alike."""
    art = artifacts[case_id(CASES[0])]
    view = lines.lines_for_artifact(art)
    moved = lines.KernelLines.from_dict(json.loads(json.dumps(view.as_dict())))

    def gone(path):  # .../flashscope/kernels/x.py -> /gone/checkout/flashscope/kernels/x.py
        return "/gone/checkout/" + "/".join(path.split("/")[-3:])

    for r in moved.rows:
        r.file, r.source = gone(r.file), None
    for d in moved.peak["by_line"]:
        if d["file"]:
            d["file"], d["source"] = gone(d["file"]), None
    assert all(r.source for r in view.rows if "/flashscope/kernels/" in r.file)
    lines._package_texts(moved)
    assert [r.source for r in moved.rows] == [r.source for r in view.rows]
    assert [d["source"] for d in moved.peak["by_line"]] == \
        [d["source"] for d in view.peak["by_line"]]


def test_a_build_naming_another_checkouts_changed_file_reads_the_installed_one(artifacts,
                                                                               tmp_path):
    """The same where the named checkout still exists but its file has changed since (a
    second clone sharing Triton's cache with a checkout being edited): for a build of the
    packages' own kernels the installed text, which the build was keyed on, wins over the
    named copy's; a binary from elsewhere reads the copy as named."""
    art = artifacts[case_id(CASES[0])]
    view = lines.lines_for_artifact(art)
    named = sorted({r.file for r in view.rows if "/flashscope/kernels/" in r.file})
    assert named
    for path in named:
        copy = tmp_path.joinpath("clone", *path.split("/")[-3:])
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text("# edited since\n" * 5000)
        assert lines.source_lines(str(copy))[0] == "# edited since"
        assert lines.source_lines(str(copy), packages=True) == lines.source_lines(path)
    sources = lines._Sources(packages=True)
    for r in view.rows:
        if r.file in named:
            copy = str(tmp_path.joinpath("clone", *r.file.split("/")[-3:]))
            assert sources.text(copy, r.line) == r.source