"""scripts/gpu/decode_scan.py on CPU tensors (Triton's interpreter, perf_counter timing):
each config is checked against the reference before it is timed, a dense default gives the
speed column its base, and bad arguments get one line and exit code 2."""

from pathlib import Path

import torch

from .test_help import _load

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "decode_scan.py"


def test_scan_checks_then_times_each_config():
    scan = _load(SCRIPT).scan
    rows = scan((2, 4, 1, 32, 40, 2), [0, 16], ["SPLITS=2"], device="cpu",
                dtype=torch.float16)
    assert [(r["page"], r["default"]) for r in rows] == [(0, True), (0, False), (16, True),
                                                         (16, False)]
    assert rows[0]["of_dense_default"] == 1.0 and rows[1]["knobs"] == {"SPLITS": 2}
    assert all("failed" not in r and r["us"] > 0 and r["gbps"] > 0 for r in rows)


def test_rounds_time_every_config_in_turn_and_keep_the_median():
    scan = _load(SCRIPT).scan
    rows = scan((2, 4, 1, 32, 40, 2), [0], ["SPLITS=2", "BLOCK_N=32"], device="cpu",
                dtype=torch.float16, rounds=3)
    assert len(rows) == 3 and all(len(r["us_rounds"]) == 3 for r in rows)
    assert all(r["us"] == sorted(r["us_rounds"])[1] for r in rows)


def test_bad_arguments_get_one_line(capsys, tmp_path):
    main = _load(SCRIPT).main
    assert main([str(tmp_path / "o"), "--shapes", "2,4,1", "--pages", "0"]) == 2
    assert main([str(tmp_path / "o"), "--shapes", "2,4,1,32,40,2", "--pages", "x"]) == 2
    assert main([str(tmp_path / "o"), "--shapes", "2,4,1,32,40,2", "--rounds", "0"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3 and "--shape" in out[0] and "--pages" in out[1]
    assert "--rounds '0'" in out[2]
    assert not (tmp_path / "o").exists()
