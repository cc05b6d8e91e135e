"""The ncu command line and the run loop, with a stand-in ncu that prints a recorded CSV."""

import json
import sys
from pathlib import Path

from flashscope.cli import main
from flashscope.profile.metrics import METRICS
from flashscope.profile.runner import ncu_command

DATA = Path(__file__).parents[1] / "data" / "profile"


def test_ncu_command_line():
    cmd = ncu_command("flashscope", (4, 16, 4096, 128), "bf16", True, "BLOCK_M=64", "ncu",
                      "python3")
    assert cmd[:3] == ["ncu", "--clock-control", "none"]
    assert cmd[cmd.index("--metrics") + 1].split(",") == [m.ncu for m in METRICS]
    assert cmd[cmd.index("-k") + 1] == "regex:_attn_fwd"
    assert cmd[-6:] == ["flashscope.profile.child", "flashscope", "4,16,4096,128", "bf16", "1",
                        "BLOCK_M=64"]


def test_profile_runs_ncu_per_job_and_keeps_its_csv(tmp_path, capsys):
    fake = tmp_path / "ncu"
    log = tmp_path / "calls.txt"
    fake.write_text(f"#!{sys.executable}\nimport sys\n"
                    f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                    f"name = 'ncu_00_cudnn.csv' if 'cudnn' in sys.argv else 'ncu_03_flashscope.csv'\n"
                    f"sys.stdout.write(open({str(DATA)!r} + '/' + name).read())\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    rc = main(["profile", "--ncu", str(fake), "--providers", "flashscope,cudnn",
               "--configs", "BLOCK_M=64,num_warps=4;BLOCK_M=128", "--out", str(out), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    calls = log.read_text().splitlines()
    assert len(calls) == 3 and all("--clock-control none" in c for c in calls)
    assert [k["provider"] for k in res["kernels"]] == ["cudnn", "flashscope", "flashscope"]
    from flashscope.profile.session import config_key

    labels = ["", "triton-fwd 64x64 w4 s3", config_key("BLOCK_M=128")]
    assert [k["config_key"] for k in res["kernels"]] == labels
    assert len(list(out.glob("ncu_*.csv"))) == 3
    jobs = json.loads((out / "jobs.json").read_text())["jobs"]
    assert [(j["file"], j["config"]) for j in jobs] == [
        ("ncu_00_cudnn.csv", ""), ("ncu_01_flashscope.csv", "BLOCK_M=64,num_warps=4"),
        ("ncu_02_flashscope.csv", "BLOCK_M=128")]
    assert main(["profile", "--from-csv", str(out), "--json"]) == 0  # the recording replays
    again = json.loads(capsys.readouterr().out)
    assert [k["config_key"] for k in again["kernels"]] == labels


def test_missing_ncu_is_a_clear_error(capsys):
    assert main(["profile", "--ncu", "no-such-ncu-binary", "--providers", "cudnn"]) == 2
    assert "not found on PATH" in capsys.readouterr().err


def test_speed_from_a_sweep_file_replaces_ncu_durations(tmp_path, capsys):
    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\nimport sys\n"
                    f"sys.stdout.write(open({str(DATA / 'ncu_raw_h100.csv')!r}).read())\n")
    fake.chmod(0o755)
    sweep = tmp_path / "fwd_scan.json"
    sweep.write_text(json.dumps({"rows": [
        {"D": 128, "N": 4096, "causal": False, "provider": "flashscope",
         "config": "triton-fwd 64x64 w4 s3", "ms": 1.0},
        {"D": 128, "N": 4096, "causal": True, "provider": "flashscope",
         "config": "BLOCK_M=64,num_warps=4", "ms": 9.0},
        {"D": 64, "N": 4096, "causal": False, "provider": "flashscope",
         "config": "triton-fwd 64x64 w4 s3", "ms": 9.0},
        {"provider": "cudnn", "D": 128, "N": 4096, "causal": False, "ms": 0.8},
        {"provider": "flashscope", "config": "BLOCK_M=128", "error": "out of resources"}]}))
    assert main(["profile", "--ncu", str(fake), "--providers", "flashscope",
                 "--configs", "BLOCK_M=64,num_warps=4;BLOCK_M=128", "--speed", str(sweep),
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    k64, k128 = res["kernels"]
    assert k64["speed_tflops"] == 4 * 4 * 16 * 4096**2 * 128 / 1e-3 / 1e12
    assert k128["speed_tflops"] == k128["tflops"]  # not in the sweep: ncu's duration
    assert res["speed_source"] == "sweep file"


def test_bad_speed_file_exit_2(tmp_path, capsys):
    sweep = tmp_path / "s.json"
    sweep.write_text('[{"config": "m64n64w4s3q1", "ms": "fast"}]')
    assert main(["profile", "--ncu-csv", str(DATA / "ncu_raw_h100.csv"), "--speed",
                 str(sweep)]) == 2
    assert "row 0: ms is 'fast', expected a number" in capsys.readouterr().err
