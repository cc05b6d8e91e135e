"""scripts/loop_sass.py offline: the consumer loops it picks from SASS, and --diff."""

import json
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path[:0] = [os.path.join(ROOT, "scripts")]

import loop_sass  # noqa: E402

SASS = """
        .section	.text.k,"ax",@progbits
.L_x_0:
        /*0000*/                   IADD3 R1, R1, 0x1, RZ ;
.L_x_1:
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x2, 0x80 ;
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, gsb0 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0050*/                   UIADD3 UR4, UR4, 0x1, URZ ;
        /*0060*/               @P1 BRA `(.L_x_1) ;
        /*0070*/               @P2 BRA `(.L_x_0) ;
.L_x_2:
        /*0080*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, gsb0 ;
        /*0090*/               @P3 BRA `(.L_x_2) ;
        /*00a0*/                   EXIT ;
"""


def test_the_consumer_loop_is_the_innermost_with_a_score_wait():
    """The outer loop holds the inner one; the loop without the score wait is not one."""
    (loop,) = loop_sass.consumer_loops(SASS, "k")
    assert loop == {"BAR.SYNC 0x80": 1, "TRYWAIT": 1, "HGMMA": 1, "WARPGROUP": 1,
                    "UIADD3": 1, "BRA": 1}


def _doc(triton, instructions, bars):
    return {"triton": triton, "ptxas": "12.8", "entries": [
        {"entry": "D=64 full le16k", "config": "m", "loops": 3, "registers": 128,
         "spills": [0, 0], "instructions": instructions,
         "per_tile": {"BAR.SYNC 0x80": bars, "HGMMA": 12}}]}


def test_diff_shows_each_change_and_the_sum(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc("3.6.0", 403.5, 4)))
    b.write_text(json.dumps(_doc("3.9.0", 413, 2)))
    assert loop_sass.main(["--diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "Triton 3.6.0" in out and "Triton 3.9.0" in out and "403.5 -> 413" in out
    assert "4 -> 2" in out and "BAR.SYNC 0x80 -2" in out


def test_a_file_that_is_not_an_output_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit) as e:
        loop_sass.main(["--diff", str(bad), str(bad)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "bad.json" in err
