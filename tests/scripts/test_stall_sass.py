"""The counter script's offline parts (scripts/gpu/stall_sass.py): the opcode mix of a
recorded ncu source page and the difference of two (no GPU)."""

import gzip
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path[:0] = [os.path.join(ROOT, "scripts", "gpu")]

from stall_sass import opcode_diff, opcode_mix, read_source  # noqa: E402

RUN206 = os.path.join(ROOT, "docs", "results", "h100-2026-11-25", "stalls_run206_n16k")
HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
          '"stall_wait"\n')


def _cli(*args):
    """The script run as a user would, on ``args``."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu", "stall_sass.py"),
                           *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})


def _page(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text('"Kernel Name","k",\n' + HEADER + "".join(
        f'"0x{i:x}","{src}","1","{n}","1"\n' for i, (src, n) in enumerate(rows)))
    return str(path)


def test_mix_strips_predicates_and_keeps_mufu_and_hgmma_whole(tmp_path):
    rows = read_source(_page(tmp_path, "a.csv", [
        ("@!P0 BRA 0x10", 3), ("FADD.FTZ R1, R2, R3", 5), ("FADD R1, R2, R3", 2),
        ("MUFU.EX2 R1, R1", 7), ("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24", 1)]))
    assert opcode_mix(rows) == [(7.0, "MUFU.EX2"), (7.0, "FADD"), (3.0, "BRA"),
                                (1.0, "HGMMA.64x64x16.F32.BF16")]


def test_diff_orders_by_the_largest_difference_either_way():
    a = [(10.0, "UIADD3"), (5.0, "FADD"), (1.0, "BAR")]
    b = [(4.0, "UIADD3"), (5.0, "FADD"), (9.0, "ULOP3")]
    assert opcode_diff(a, b) == [("ULOP3", 0.0, 9.0, -9.0), ("UIADD3", 10.0, 4.0, 6.0),
                                 ("BAR", 1.0, 0.0, 1.0), ("FADD", 5.0, 5.0, 0.0)]
    assert opcode_diff(a, b, n=1) == [("ULOP3", 0.0, 9.0, -9.0)]


def test_recorded_run_206_reads_the_entry_3_percent_above_fa4():
    """Run 206 (D = 64 non-causal 16k): the entry executes 1836.8 M warp instructions,
    FA4 1784.0 M; the uniform-datapath add is the largest difference."""
    e = opcode_mix(read_source(os.path.join(RUN206, "e_source.csv.gz")))
    f = opcode_mix(read_source(os.path.join(RUN206, "fa4_source.csv.gz")))
    assert round(sum(v for v, _ in e) / 1e6, 1) == 1836.8
    assert round(sum(v for v, _ in f) / 1e6, 1) == 1784.0
    top = opcode_diff(e, f)[0]
    assert top[0] == "UIADD3" and round(top[3] / 1e6, 1) == 27.0
    # the softmax is the same work in both: MUFU.EX2 within 1%
    me, mf = dict((k, v) for v, k in e)["MUFU.EX2"], dict((k, v) for v, k in f)["MUFU.EX2"]
    assert abs(me / mf - 1) < 0.01


def test_bad_pages_are_refused_by_name(tmp_path):
    trunc = tmp_path / "t.csv.gz"
    trunc.write_bytes(gzip.compress(b'"Address","Source"\n"0x0","FADD"\n')[:20])
    for path in (str(trunc), _page(tmp_path, "nox.csv", [])):
        with pytest.raises(SystemExit, match="--diff: .*" + os.path.basename(path)):
            read_source(path)
    out = _cli("--diff", str(trunc), str(trunc))
    assert out.returncode != 0 and "cannot read" in out.stderr


def test_a_count_that_is_not_a_number_is_named(tmp_path):
    bad = _page(tmp_path, "bad.csv", [("FADD R1, R2, R3", "12x")])
    out = _cli("--diff", bad, bad)
    assert out.returncode == 1 and "Instructions Executed" in out.stderr
    assert "Traceback" not in out.stderr and "'12x'" in out.stderr


def test_cli_requires_runs_or_diff():
    out = _cli()
    assert out.returncode == 2 and "--diff A B" in out.stderr
