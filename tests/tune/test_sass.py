"""The SASS and stall comparison of two Nsight Compute source pages (flashscope.tune.sass,
``flashscope tune compare-sass``), on made-up pages and on a recorded H100 pair."""

import gzip
import json
from pathlib import Path

import pytest

from flashscope.cli import main
from flashscope.errors import ParseError
from flashscope.tune.sass import by_reason, compare, opcode_diff, opcode_mix, read_source, top

DATA = Path(__file__).parents[1] / "data" / "tune"
E, FA4 = DATA / "d64n16k_entry_source.csv.gz", DATA / "d64n16k_fa4_source.csv.gz"
HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
          '"stall_wait","stall_barrier"\n')


def _page(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text('"Kernel Name","k",\n' + HEADER + "".join(
        f'"0x{i:x}","{src}","{s}","{n}","{w}","{s - w}"\n'
        for i, (src, n, s, w) in enumerate(rows)))
    return path


def test_mix_strips_predicates_and_keeps_mufu_and_hgmma_whole(tmp_path):
    rows = read_source(_page(tmp_path, "a.csv", [
        ("@!P0 BRA 0x10", 3, 1, 1), ("FADD.FTZ R1, R2, R3", 5, 1, 1),
        ("FADD R1, R2, R3", 2, 1, 1), ("MUFU.EX2 R1, R1", 7, 1, 1),
        ("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24", 1, 1, 1)]))
    assert opcode_mix(rows) == [(7.0, "MUFU.EX2"), (7.0, "FADD"), (3.0, "BRA"),
                                (1.0, "HGMMA.64x64x16.F32.BF16")]


def test_stalls_by_reason_and_the_most_stalled_instructions(tmp_path):
    rows = read_source(_page(tmp_path, "a.csv", [
        ("BAR.SYNC 0x1", 1, 30, 0), ("FADD R1, R2, R3", 1, 10, 10)]))
    assert by_reason(rows) == [(0.75, "stall_barrier"), (0.25, "stall_wait")]
    assert top(rows, 1) == [(0.75, "0x0", "BAR.SYNC 0x1", [("stall_barrier", 30)])]


def test_diff_orders_by_the_largest_difference_either_way():
    a = [(10.0, "UIADD3"), (5.0, "FADD"), (1.0, "BAR")]
    b = [(4.0, "UIADD3"), (5.0, "FADD"), (9.0, "ULOP3")]
    assert opcode_diff(a, b) == [("ULOP3", 0.0, 9.0, -9.0), ("UIADD3", 10.0, 4.0, 6.0),
                                 ("BAR", 1.0, 0.0, 1.0), ("FADD", 5.0, 5.0, 0.0)]
    assert opcode_diff(a, b, n=1) == [("ULOP3", 0.0, 9.0, -9.0)]


def test_recorded_pages_read_the_entry_3_percent_above_fa4():
    """D = 64 non-causal 16k on an H100: the entry executes 1836.8 M warp instructions,
    FlashAttention-4 1784.0 M; the uniform-datapath add is the largest difference, and the
    softmax's exponentials are the same work in both (MUFU.EX2 within 1%)."""
    res = compare(E, FA4)
    assert round(res["a"]["instructions"] / 1e6, 1) == 1836.8
    assert round(res["b"]["instructions"] / 1e6, 1) == 1784.0
    first = res["opcode_diff"][0]
    assert first["opcode"] == "UIADD3" and round(first["a_minus_b"] / 1e6, 1) == 27.0
    ex2 = res["a"]["opcodes"]["MUFU.EX2"] / res["b"]["opcodes"]["MUFU.EX2"]
    assert abs(ex2 - 1) < 0.01
    assert max(res["a"]["stall_reasons"], key=res["a"]["stall_reasons"].get) == "stall_wait"
    assert round(res["stall_diff"]["stall_long_sb"], 3) == round(0.221 - 0.095, 3)


def test_bad_pages_are_refused_by_name(tmp_path):
    trunc = tmp_path / "t.csv.gz"
    trunc.write_bytes(gzip.compress(b'"Address","Source"\n"0x0","FADD"\n')[:20])
    empty = _page(tmp_path, "nox.csv", [])
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\x00\x01garbage")
    for path, msg in ((trunc, "cannot read"), (empty, "not an ncu source page"),
                      (binary, "binary data")):
        with pytest.raises(ParseError, match=f"{path.name}: .*{msg}"):
            read_source(path)


def test_cli_compares_and_refuses_with_one_line(tmp_path, capsys):
    assert main(["tune", "compare-sass", str(E), str(FA4), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "A 1836.8, B 1784.0 (+52.8)" in out and "UIADD3" in out and "stall_wait" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert main(["tune", "compare-sass", str(E), str(FA4), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["opcode_diff"]) == 16
    assert main(["tune", "compare-sass", str(E), str(FA4), "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "opcode,a,b,a_minus_b"
    bad = _page(tmp_path, "bad.csv", [("FADD R1, R2, R3", "12x", 1, 1)])
    assert main(["tune", "compare-sass", str(bad), str(E)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'Instructions Executed'" in err and "'12x'" in err
    assert main(["tune", "compare-sass", str(E), str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: cannot read" in capsys.readouterr().err
