"""``flashscope profile`` offline (--ncu-csv): tables, JSON, files, and exit 2 on bad
input."""

import json
from pathlib import Path

import pytest

from flashscope.cli import main

DATA = Path(__file__).parents[1] / "data" / "profile"


FLOPS = 4 * 4 * 16 * 4096**2 * 128  # B=4, H=16, N=4096, D=128, non-causal


def test_profile_from_csv_json(capsys, tmp_path):
    rc = main(["profile", "--ncu-csv", str(DATA / "ncu_00_cudnn.csv"), "--ncu-csv",
               str(DATA / "ncu_01_flash.csv"), "--ncu-csv", str(DATA / "ncu_02_efficient.csv"),
               "--json", "--gate", "eligible_warps>=0.5", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert [k["provider"] for k in res["kernels"]] == ["cudnn", "flash", "efficient"]
    assert "eligible_warps>=0.5" in res["gates"] and "eligible_warps>=2" not in res["gates"]
    cudnn = res["kernels"][0]
    # 831,968 ns on the H100: 660.8 TFLOP/s (a unit slip once gave 0.00066)
    assert cudnn["duration"] == 0.831968
    assert cudnn["tflops"] == pytest.approx(FLOPS / 0.831968e-3 / 1e12, rel=1e-12)
    assert 660 < cudnn["tflops"] < 661
    corr = {c["predictor"]: c for c in res["correlation"]}
    # speeds 661 > 358 > 176 vs achieved 14.06, 12.25, 24.69: ranks (2,1,3) vs (3,2,1)
    assert corr["achieved_occupancy"]["n"] == 3 and corr["achieved_occupancy"]["rho"] == -0.5
    assert (tmp_path / "profile.json").exists() and (tmp_path / "profile.csv").exists()


def test_profile_from_recording_dir_regenerates_the_h100_answer(capsys):
    """--from-csv on the real H100 recording (8 kernels, configs from jobs.json)."""
    assert main(["profile", "--from-csv", str(DATA), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    ks = res["kernels"]
    assert [k["provider"] for k in ks] == ["cudnn", "flash", "efficient"] + ["flashscope"] * 5
    assert [k["config_key"] for k in ks[3:]] == [
        "triton-fwd 128x64 w8 s3", "triton-fwd 128x128 w8 s2", "triton-fwd 64x64 w4 s3",
        "triton-fwd 128x32 w4 s3", "triton-fwd 64x128 w4 s2"]
    speed = [round(k["speed_tflops"]) for k in ks]
    assert speed == [661, 358, 176, 503, 455, 511, 466, 353]
    assert [k["gates"]["all"] for k in ks] == [False] * 8
    corr = {c["predictor"]: (None if c["rho"] is None else round(c["rho"], 4), c["n"])
            for c in res["correlation"]}
    assert corr["theoretical_occupancy"] == (0.1091, 8)
    assert corr["achieved_occupancy"] == (0.119, 8)
    assert corr["eligible_warps"] == (-0.1905, 8)
    assert corr["issue_active"] == (-0.1667, 8)
    assert corr["tensor_pipe"] == (0.8333, 8)
    assert corr["gate achieved_occupancy>=20"] == (-0.5774, 8)  # only 'efficient' passes
    assert corr["gate issue_active>=60"] == (None, 8)  # all fail: constant, undefined


@pytest.mark.parametrize("setup, msg", [
    (lambda d: None, "no ncu_<i>_<provider>.csv"),
    (lambda d: (d / "ncu_00_flash.csv").write_bytes((DATA / "ncu_00_cudnn.csv").read_bytes()),
     "is not a flash kernel"),
    (lambda d: ((d / "ncu_00_cudnn.csv").write_bytes((DATA / "ncu_00_cudnn.csv").read_bytes()),
                (d / "jobs.json").write_text("[1]")), "expected an object with a 'jobs'"),
])
def test_from_csv_bad_directory_exit_2(capsys, tmp_path, setup, msg):
    setup(tmp_path)
    assert main(["profile", "--from-csv", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_profile_table(capsys):
    assert main(["profile", "--ncu-csv", str(DATA / "ncu_raw_h100.csv")]) == 0
    out = capsys.readouterr().out
    assert "4 of 4" in out and "3 of 4" in out and "Spearman" in out
    # the gates are said on screen, with what they are and what they are not
    assert "occupancy plan's thresholds" in out and "fails all four" in out
    assert "achieved_occupancy>=20" in out and "fail 4/4" not in out


@pytest.mark.parametrize("args, msg", [
    (["--shape", "4,16,4096"], "--shape"),
    (["--gate", "occupancy>=2"], "unknown metric"),
    (["--providers", "cudnn,xformers"], "unknown provider"),
    (["--configs", "BLOCK_Q=64"], "unknown key"),
])
def test_profile_bad_arguments_exit_2(capsys, args, msg):
    assert main(["profile", "--ncu-csv", str(DATA / "ncu_raw_h100.csv"), *args]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


@pytest.mark.parametrize("data", [b"", b"\x00\x01\x02binary", b"not,a,profile\n1,2,3\n",
                                  b'"ID","Kernel Name","Metric Name","Metric Unit",'
                                  b'"Metric Value"\n"0","k","gpu__time_duration.sum","ns","x"\n'])
def test_profile_malformed_csv_exit_2(capsys, tmp_path, data):
    f = tmp_path / "bad.csv"
    f.write_bytes(data)
    assert main(["profile", "--ncu-csv", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashscope profile: error:") and "Traceback" not in err
