"""``flashscope profile --lines`` replayed: a source page recorded on the H100 (ncu's
SASS rows with warp-stall samples and executed instructions) joined to the per-line view
of the binary it came from."""

import csv
import gzip
import io
import json
from pathlib import Path

import pytest

from flashscope import cli
from flashscope.errors import ParseError
from flashscope.profile import source_page

DATA = Path(__file__).resolve().parents[1] / "data" / "profile" / "source_page"
PAGE = DATA / "gluon_n16k_source.csv.gz"


def _unpacked(tmp_path_factory, kernel: str):
    """A recorded kernel's cubin and PTX, as a Triton cache folder holds them."""
    d = tmp_path_factory.mktemp(kernel)
    for name in (f"{kernel}.cubin", f"{kernel}.ptx"):
        (d / name).write_bytes(gzip.decompress((DATA / f"{name}.gz").read_bytes()))
    return d


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    """The recorded forward config's binary."""
    return _unpacked(tmp_path_factory, "_attn_fwd_sm90")


def _run(capsys, *argv):
    code = cli.main(["profile", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _replayed(capsys, page_path, binary, kernel: str, instructions: int):
    """(the page, the replay's JSON) of a recorded page joined to its binary."""
    page = source_page.pick(source_page.load(page_path))
    assert page.kernel == kernel and len(page.addresses) == instructions
    code, out, err = _run(capsys, "--lines", "--source-page", str(page_path), "--binary",
                          str(binary), "--json")
    assert code == 0, err
    return page, json.loads(out)


def test_replay_joins_every_instruction(capsys, binary):
    page, d = _replayed(capsys, PAGE, binary, "_attn_fwd_sm90", 4296)
    rows = d["lines"]["rows"]
    for key in ("instructions_executed", "stall_samples"):
        total = sum(c.get(key, 0) for c in page.counters)
        assert total > 0
        assert sum((r["counters"] or {}).get(key, 0) for r in rows) == pytest.approx(total)
    # warp-stall reasons over the whole launch, as ncu attributes them per instruction
    samples = sum(c.get("stall_samples", 0) for c in page.counters)
    reasons = d["stalls_by_reason"]
    assert reasons["wait"] / samples == pytest.approx(0.234, abs=0.001)
    assert reasons["long_sb"] / samples == pytest.approx(0.221, abs=0.001)
    top = max(rows, key=lambda r: (r["counters"] or {}).get("stall_samples", 0))
    assert (Path(top["file"]).name, top["line"]) == ("sm90_softmax.py", 69)
    assert top["live_registers_max"] > 100
    # the text of a line is read from the file the build named, where it is readable
    built_from = Path(top["file"])
    assert top["source"] == (built_from.read_text().splitlines()[68].rstrip()
                             if built_from.is_file() else None)
    assert all(c["ok"] for c in d["lines"]["checks"])


def test_replay_table(capsys, binary, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # a terminal wide enough for every cell
    out_dir = tmp_path / "out"
    code, out, err = _run(capsys, "--lines", "--source-page", str(PAGE), "--binary",
                          str(binary), "--top", "5", "--out", str(out_dir))
    assert code == 0, err
    flat = " ".join(out.split())
    assert "stalls by reason: wait 23.4%" in flat and "sm90_softmax.py:69" in flat
    assert "_attn_fwd_sm90: stalls by loop" in flat
    d = json.loads((out_dir / "profile.json").read_text())
    assert d["kernel"] == "_attn_fwd_sm90"
    # by loop: the samples of the loops' instructions, an inner loop's within its outer's
    total = sum((r["counters"] or {}).get("stall_samples", 0) for r in d["lines"]["rows"])
    loops = [x for x in d["lines"]["loops"] if x["count"] >= 16]
    outer = [x for x in loops if x["depth"] == 0]
    assert outer and sum(x["counters"]["stall_samples"] for x in outer) <= total
    for x in loops:
        around = [y for y in loops if y["depth"] < x["depth"] and y["first"] <= x["first"]
                  and x["last"] <= y["last"]]
        assert all(y["counters"]["stall_samples"] >= x["counters"]["stall_samples"]
                   for y in around)
    # the key-tile loops of the three partitions hold most of the launch's stalls
    assert sum(x["counters"]["stall_samples"] for x in outer) > 0.5 * total


def test_page_of_another_build_is_refused(capsys, binary, tmp_path):
    """One instruction that differs (another build of the kernel) stops the join at its
    address instead of adding counters to the wrong lines."""
    text = gzip.decompress(PAGE.read_bytes()).decode()
    row = next(ln for ln in text.splitlines() if '"      FMNMX ' in ln)
    altered = tmp_path / "other.csv"
    altered.write_text(text.replace(row, row.replace("FMNMX", "FMUL", 1), 1))
    code, out, err = _run(capsys, "--lines", "--source-page", str(altered), "--binary",
                          str(binary))
    assert code == 2 and "not this build's page" in err and "FMUL" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text,match", [
    ("", "file is empty"),
    ('"Address","Source","Instructions Executed"\n"0x10","NOP","x"\n', "expected a number"),
    ('"Kernel Name","k",\n"Address","Source"\n"0x10","NOP","1"\n', "3 fields"),
    ('"Kernel Name","k",\n"Address","Source"\n"zz","NOP"\n', "not hexadecimal"),
    ("hello\n", "source page"),
])
def test_malformed_pages(tmp_path, capsys, binary, text, match):
    p = tmp_path / "page.csv"
    p.write_text(text)
    with pytest.raises(ParseError, match=match):
        source_page.load(p)
    code, _, err = _run(capsys, "--lines", "--source-page", str(p), "--binary", str(binary))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_page_among_what_ncu_and_the_program_printed(tmp_path):
    """A page exported to stdout during live profiling (ncu --page source --csv > FILE)
    reads as the clean page: the program's own output before it and ncu's messages
    anywhere are passed over; a stray line inside the page is still refused."""
    clean = gzip.decompress(PAGE.read_bytes()).decode()
    lines = clean.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith('"Address"')) + 3
    noisy = "\n".join(["==WARNING== Note: Running with unmodified GPU clocks.",
                        "==PROF== Connected to process 732 (/usr/bin/python3.12)",
                        "step 1 done, loss 0.25", "==PROF== Disconnected from process 732",
                        *lines[:at], "==PROF== Report: /tmp/x.ncu-rep", *lines[at:]]) + "\n"
    p = tmp_path / "noisy.csv"
    p.write_text(noisy)
    want, got = source_page.load(PAGE)[0], source_page.load(p)[0]
    assert (got.kernel, got.addresses, got.sass, got.counters) == (
        want.kernel, want.addresses, want.sass, want.counters)
    p.write_text("\n".join([*lines[:at], "step 2 done", *lines[at:]]) + "\n")
    with pytest.raises(ParseError, match=f":{at + 1}: 1 fields"):
        source_page.load(p)


def test_page_alone_sums_the_page(capsys, tmp_path):
    """--page-alone: a page read without its binary (another library's kernel) gives the
    launch's samples by reason and by opcode, and its top instructions, each summing what
    the page holds."""
    page = source_page.pick(source_page.load(PAGE))
    samples = [c.get("stall_samples", 0) for c in page.counters]
    code, out, err = _run(capsys, "--page-alone", "--source-page", str(PAGE), "--top", "5",
                          "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["kernel"] == "_attn_fwd_sm90" and d["instructions"] == len(page.sass) == 4296
    assert d["stall_samples"] == pytest.approx(sum(samples)) and sum(samples) > 0
    ops = d["by_opcode"]
    assert sum(o["instructions"] for o in ops) == 4296
    assert sum(o["stall_samples"] for o in ops) == pytest.approx(sum(samples))
    assert sum(o["instructions_executed"] for o in ops) == pytest.approx(
        sum(c.get("instructions_executed", 0) for c in page.counters))
    assert [o["stall_samples"] for o in ops] == sorted((o["stall_samples"] for o in ops),
                                                        reverse=True)
    top = [t["counters"]["stall_samples"] for t in d["top"]]
    assert len(top) == 5 and top == sorted(samples, reverse=True)[:5]
    first = d["top"][0]
    i = page.addresses.index(page.addresses[0] + first["offset"])
    assert first["sass"] == page.sass[i].strip()
    assert sum(d["stalls_by_reason"].values()) == pytest.approx(sum(
        v for c in page.counters for k, v in c.items() if k.startswith("stall.")))
    code, out, err = _run(capsys, "--page-alone", "--source-page", str(PAGE), "--csv")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("kind,opcode,offset,sass")
    assert sum(ln.startswith("instruction,") for ln in lines) == 20
    code, out, err = _run(capsys, "--page-alone", "--source-page", str(PAGE), "--top", "3")
    flat = " ".join(out.split())
    assert code == 0 and "stalls by opcode" in flat and "instructions by stall samples" in flat


@pytest.mark.parametrize("sass,op", [("@!P2  BRA 0x7f1f597bd9d0", "BRA"), ("NOP", "NOP"),
                                     ("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ", "HGMMA"),
                                     ("@UP0 UIADD3 UR4, UR4, 0x1, URZ", "UIADD3"), ("", "")])
def test_opcode_of_a_sass_line(sass, op):
    assert source_page.opcode(sass) == op


def test_pages_side_by_side(capsys, tmp_path):
    """--page-alone with two pages: each opcode's and reason's share of each page's
    samples; a page against itself reads the same twice, and a page whose MUFU rows hold
    twice the samples shows MUFU's share grown by what the rest lost."""
    text = gzip.decompress(PAGE.read_bytes()).decode()
    page = source_page.pick(source_page.load(PAGE))
    col = next(i for i, c in enumerate(next(csv.reader([
        next(ln for ln in text.splitlines() if ln.startswith('"Address"'))])))
        if c == "Warp Stall Sampling (All Samples)")
    out_lines = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) > col and "MUFU" in row[1]:
            row[col] = str(2 * float(row[col].replace(",", "")))
        out_lines.append(row)
    doubled = tmp_path / "doubled.csv"
    with open(doubled, "w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(out_lines)
    code, out, err = _run(capsys, "--page-alone", "--source-page", str(PAGE),
                          "--source-page", str(PAGE), "--source-page", str(doubled), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert [p["kernel"] for p in d["pages"]] == ["_attn_fwd_sm90"] * 3
    ops = {r["opcode"]: r for r in d["by_opcode"]}
    total = sum(c.get("stall_samples", 0) for c in page.counters)
    mufu = sum(c.get("stall_samples", 0) for sass, c in zip(page.sass, page.counters)
               if "MUFU" in sass)
    assert mufu > 0
    assert ops["MUFU"]["share"][0] == ops["MUFU"]["share"][1] == pytest.approx(mufu / total)
    assert ops["MUFU"]["share"][2] == pytest.approx(2 * mufu / (total + mufu))
    assert all(r["share"][0] == r["share"][1] for r in d["by_opcode"] + d["by_reason"])
    assert sum(r["share"][0] for r in d["by_opcode"]) == pytest.approx(1.0)
    assert ops["MUFU"]["instructions_executed"][0] == ops["MUFU"]["instructions_executed"][2]
    shares = [max(r["share"]) for r in d["by_opcode"]]
    assert shares == sorted(shares, reverse=True)
    code, out, err = _run(capsys, "--page-alone", "--source-page", str(PAGE),
                          "--source-page", str(doubled), "--csv")
    assert code == 0 and out.splitlines()[0].startswith("kind,name,page 1 share")
    code, out, err = _run(capsys, "--page-alone", "--source-page", str(PAGE),
                          "--source-page", str(doubled))
    assert code == 0 and "stall samples by opcode" in " ".join(out.split())


def test_lines_joins_one_page(capsys, binary):
    code, out, err = _run(capsys, "--lines", "--source-page", str(PAGE), "--source-page",
                          str(PAGE), "--binary", str(binary))
    assert code == 2 and "give one" in err and len(err.strip().splitlines()) == 1


def test_page_alone_refusals(capsys, tmp_path, binary):
    bad = tmp_path / "bad.csv"
    bad.write_text('"Kernel Name","k",\n"Address","Source"\n"zz","NOP"\n')
    for argv, match in [(["--page-alone"], "give --source-page"),
                        (["--page-alone", "--source-page", str(PAGE), "--binary",
                          str(binary)], "drop --binary"),
                        (["--page-alone", "--source-page", str(bad)], "not hexadecimal"),
                        (["--page-alone", "--source-page", str(tmp_path / "none.csv")],
                         "--source-page")]:
        code, out, err = _run(capsys, *argv)
        assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err


def test_record_command_is_what_the_docs_say():
    from flashscope.profile.lines import record_command

    cmd = record_command((4, 16, 4096, 128), "bf16", False, "BLOCK_M=128", "OUT/lines")
    assert cmd[:7] == ["ncu", "--clock-control", "none", "--section", "SourceCounters",
                       "--section", "WarpStateStats"]
    assert cmd[-5:] == ["flashscope", "4,16,4096,128", "bf16", "0", "BLOCK_M=128"]


BWD_PAGE = DATA / "sm90_bwd_4k_source.csv.gz"


@pytest.fixture(scope="module")
def bwd_binary(tmp_path_factory):
    """The Hopper backward's binary as recorded (see the data folder's README)."""
    return _unpacked(tmp_path_factory, "_attn_bwd_sm90")


def test_replay_of_the_hopper_backward(capsys, bwd_binary):
    """A warp-specialized backward's page (producer, reducer and the consumer's two
    warpgroups in one launch) joins instruction by instruction; the consumer's loop over
    query tiles holds 63% of the samples, and its top stall is the shared-memory read of
    the log-sum-exp just after the first products' issue (short scoreboard), which the
    kernel now reads after them."""
    page, d = _replayed(capsys, BWD_PAGE, bwd_binary, "_attn_bwd_sm90", 1400)
    total = sum((r["counters"] or {}).get("stall_samples", 0) for r in d["lines"]["rows"])
    assert total == pytest.approx(sum(c.get("stall_samples", 0) for c in page.counters))
    loops = {lp["line"]: lp for lp in d["lines"]["loops"] if lp["count"] > 400}
    assert loops[303]["counters"]["stall_samples"] / total == pytest.approx(0.629, abs=0.001)
    consumer = [r for r in d["lines"]["rows"] if r["counters"] and 150 < r["line"] < 240]
    top = max(consumer, key=lambda r: r["counters"]["stall_samples"])
    assert top["line"] == 186
    assert max((v, k) for k, v in top["counters"].items() if k.startswith("stall."))[1] \
        == "stall.short_sb"
    assert all(c["ok"] for c in d["lines"]["checks"])


def test_loops_table_gives_each_loops_own_shares(capsys, bwd_binary, monkeypatch):
    """By loop, beside its share of the launch, the share of the loop's own samples that
    found a warp issuing and what the rest waited on: the one-warp producer's loop is
    95% long_sb whatever its share, the consumer's loop over query tiles issues 11.0%."""
    monkeypatch.setenv("COLUMNS", "240")
    code, out, err = _run(capsys, "--lines", "--source-page", str(BWD_PAGE), "--binary",
                          str(bwd_binary), "--top", "3")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "issued waits (of the loop's samples)" in flat
    assert ("attention_bwd_sm90.py:303 431 451,772,416 166,953 62.9% 11.0% wait 15.1%, "
            "mio 14.9%, long_sb 12.6%") in flat
    assert "attention_bwd_sm90.py:114 82 10,723,328 20,476 7.7% 2.1% long_sb 94.9%" in flat


def test_record_command_of_a_backward_kernel():
    """--kernel names what ncu records (its function, exactly) and makes the child run
    that kernel's family's backward; the forward alias keeps the old command; decoding
    kernels and unknown names are refused before ncu runs."""
    from flashscope.errors import FlashscopeError
    from flashscope.profile.lines import record_command, recorded_kernel

    cmd = record_command((4, 16, 4096, 128), "bf16", True, "", "OUT/lines", kernel="sm90-bwd")
    assert cmd[cmd.index("-k") + 1] == "regex:^_attn_bwd_sm90$"
    assert cmd[-6:] == ["flashscope", "4,16,4096,128", "bf16", "1", "", "sm90-bwd"]
    assert recorded_kernel("bwd_dkdv") == ("^_attn_bwd_dkdv$", "triton-bwd")
    assert recorded_kernel("sm90-fwd") == ("^_attn_fwd_sm90$", "")
    assert record_command((1, 2, 64, 64), "bf16", False, "", "R") == record_command(
        (1, 2, 64, 64), "bf16", False, "", "R", kernel="fwd")
    with pytest.raises(FlashscopeError, match="runs in decoding"):
        recorded_kernel("decode_paged")
    with pytest.raises(Exception, match="--kernel"):
        recorded_kernel("nope")


def test_lines_refuses_a_decoding_kernel_before_any_work(capsys, tmp_path):
    code, out, err = _run(capsys, "--lines", "--kernel", "triton-decode", "--out",
                          str(tmp_path / "o"))
    assert code == 2 and "runs in decoding" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
