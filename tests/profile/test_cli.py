"""``flashscope profile`` offline (--csv): tables, JSON, files, and exit 2 on bad input."""

import json
from pathlib import Path

import pytest

from flashscope.cli import main

DATA = Path(__file__).parents[1] / "data" / "profile"


def test_profile_from_csv_json(capsys, tmp_path):
    rc = main(["profile", "--csv", str(DATA / "ncu_details_h100.csv"), "--json",
               "--gate", "eligible_warps>=0.5", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert [k["provider"] for k in res["kernels"]] == ["cudnn", "flash", "efficient"]
    assert "eligible_warps>=0.5" in res["gates"] and "eligible_warps>=2" not in res["gates"]
    cudnn = res["kernels"][0]
    assert cudnn["tflops"] == pytest.approx(4 * 4 * 16 * 4096**2 * 128 / 0.830112e-3 / 1e12)
    corr = {c["predictor"]: c for c in res["correlation"]}
    assert corr["achieved_occupancy"]["n"] == 3 and corr["achieved_occupancy"]["rho"] == -0.5
    assert (tmp_path / "profile.json").exists() and (tmp_path / "profile.csv").exists()


def test_profile_table(capsys):
    assert main(["profile", "--csv", str(DATA / "ncu_raw_h100.csv")]) == 0
    out = capsys.readouterr().out
    assert "fail 4/4" in out and "Spearman" in out


@pytest.mark.parametrize("args, msg", [
    (["--shape", "4,16,4096"], "--shape"),
    (["--gate", "occupancy>=2"], "unknown metric"),
    (["--providers", "cudnn,xformers"], "unknown provider"),
    (["--configs", "BLOCK_Q=64"], "unknown key"),
])
def test_profile_bad_arguments_exit_2(capsys, args, msg):
    assert main(["profile", "--csv", str(DATA / "ncu_raw_h100.csv"), *args]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


@pytest.mark.parametrize("data", [b"", b"\x00\x01\x02binary", b"not,a,profile\n1,2,3\n",
                                  b'"ID","Kernel Name","Metric Name","Metric Unit",'
                                  b'"Metric Value"\n"0","k","gpu__time_duration.sum","ns","x"\n'])
def test_profile_malformed_csv_exit_2(capsys, tmp_path, data):
    f = tmp_path / "bad.csv"
    f.write_bytes(data)
    assert main(["profile", "--csv", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashscope profile: error:") and "Traceback" not in err
