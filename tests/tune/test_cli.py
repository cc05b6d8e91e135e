"""``flashscope tune``: one-line errors with exit 2 and nothing written, the GPU subcommands
refusing at once without a GPU, convert, adopt and a whole cells run on CPU tensors."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from flashscope.cli import main
from flashscope.tuned import load_tuned, lookup, make_entry, write_entries
from flashscope.tune.cells import problem
from flashscope.tune.results import read_result

DATA = Path(__file__).parents[1] / "data" / "tune"
V1_GLUON = {"BLOCK_M": 192, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3,
            "Q_IN_REGS": False, "maxnreg": None, "waves_per_eu": None, "TMA": True,
            "WARP_SPEC": False, "EXP2_POLY": 0, "OVERLAP": 2, "GLUON": True,
            "PERSISTENT": True, "PINGPONG": True, "LAZY_RESCALE": False, "EARLY_Q": False,
            "K_EARLY": False, "MASKED_FIRST": True, "OUT_RCP": False, "BALANCE": False}
V1 = {"format": 1, "target": "sm90", "entries": [
    {"dtype": "bfloat16", "head_dim": 64, "causal": False, "seq_class": "le16k",
     "config": V1_GLUON, "ms": 4.0, "source": "an A/B"}]}


def _fails(capsys, argv, needle) -> str:
    """``argv`` exits 2 with one line on stderr naming ``needle``, and no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err
    return err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
@pytest.mark.parametrize("argv", [
    ["tune", "ab", "--shape", "4,16,4096,128", "--variants", "d=+;n=cudnn"],
    ["tune", "cells", "--cells", "d64c1k", "--out", "OUT"],
])
def test_gpu_subcommands_refuse_at_once_without_a_gpu(capsys, tmp_path, argv):
    argv = [str(tmp_path / a) if a == "OUT" else a for a in argv]
    _fails(capsys, argv, "no CUDA or ROCm GPU is visible here")
    assert not (tmp_path / "OUT").exists()


@pytest.mark.parametrize("argv,needle", [
    (["tune", "ab", "--shape", "4,16,4096", "--variants", "d=+"], "--shape '4,16,4096'"),
    (["tune", "ab", "--shape", "1,2,64,16", "--variants", "d=+;d=+"], "'d' names two"),
    (["tune", "ab", "--shape", "1,2,64,16", "--variants", "d=+", "--rounds", "0"],
     "argument --rounds: expected an integer >= 1, got 0"),
    (["tune", "ab", "--shape", "1,2,64,16", "--variants", "d=+", "--dtype", "fp8"],
     "--dtype 'fp8'"),
    (["tune", "ab", "--shape", "1,2,64,16", "--variants", "d=+", "--dtype", "bf16,fp16"],
     "this command takes one dtype"),
    (["tune", "ab", "--shape", "1,2,64,16", "--variants", "d=+", "--causal", "both"],
     "builds one mask"),
    (["tune", "ab", "--shape", "1,2,64,16", "--variants", "d=+", "--out", "{tmp}/a/b"],
     "does not exist"),
    (["tune", "cells", "--cells", "d64c1k,x", "--out", "o"], "cell 'x': expected"),
    (["tune", "cells", "--cells", "d64c1k"], "--out DIR is required"),
    (["tune", "cells", "--out", "o"], "give --cells or --suite"),
    (["tune", "cells", "--cells", "d64c1k", "--suite", "models", "--out", "o"],
     "give --cells or --suite"),
    (["tune", "cells", "--suite", "windows", "--out", "o"], "not a dense forward cell"),
    (["tune", "cells", "--suite", "decode", "--out", "o"], "--suite 'decode': expected"),
    (["tune", "cells", "--suite", "models", "--device", "cpu", "--out", "o"],
     "--suite needs a GPU"),
    (["tune", "cells", "--cells", "d64c1k", "--extra", "d64n1k:a=+", "--out", "o"],
     "CELL one of --cells"),
    (["tune", "cells", "--cells", "d64c1k", "--resume", "--force", "--out", "o"],
     "--resume and --force"),
    (["tune", "cells", "--cells", "d64c1k", "--jobs", "-1", "--out", "o"], "--jobs"),
    (["tune", "adopt", "missing-dir"], "missing-dir: not a folder of A/B results"),
    (["tune", "adopt", str(DATA / "balance-12"), "--q3-below", "1.02"], "two --confirm"),
    (["tune", "adopt", str(DATA / "balance-12"), "--pooled"], "--pooled needs --confirm"),
    (["tune", "adopt", str(DATA / "balance-12"), "--max-ratio", "nan"], "--max-ratio"),
    (["tune", "convert", "missing.json"], "missing.json: no such file"),
    (["tune", "compare-sass", "a.csv", "b.csv", "--top", "0"], "argument --top"),
])
def test_bad_arguments_are_one_line(capsys, tmp_path, argv, needle):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    _fails(capsys, argv, needle.replace("{tmp}", str(tmp_path)))
    assert not (tmp_path / "a").exists()


def test_convert_writes_format_2_and_overwrites_only_with_force(capsys, tmp_path):
    old = tmp_path / "sm90.json"
    old.write_text(json.dumps(V1))
    before = old.read_bytes()
    _fails(capsys, ["tune", "convert", str(old)], "pass --force to convert it in place")
    new = tmp_path / "new"
    assert main(["tune", "convert", str(old), "--out", str(new)]) == 0
    assert "1 entries, format 2" in " ".join(capsys.readouterr().out.split())
    [(key, (cfg, entry))] = load_tuned("sm90", new).items()
    assert key == ("sm90-fwd", "bfloat16", 64, False, "le16k")
    assert cfg.PINGPONG and cfg.BLOCK_M == 192 and entry["source"] == "an A/B"
    _fails(capsys, ["tune", "convert", str(old), "--out", str(new)],
           "sm90.json is already there")
    assert old.read_bytes() == before
    assert main(["tune", "convert", str(old), "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == 2
    assert json.loads(old.read_text())["format"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    _fails(capsys, ["tune", "convert", str(old), "--force"], "not a format-1 tuned file")


@pytest.mark.parametrize("change,needle", [
    ({"JOINT_KV": True}, "JOINT_KV=True is a switch no kernel has"),
    ({"BLOCK_M": 96}, "BLOCK_M=96"),
])
def test_convert_refuses_what_cannot_be_converted_and_writes_nothing(capsys, tmp_path,
                                                                     change, needle):
    old = tmp_path / "sm90.json"
    v1 = json.loads(json.dumps(V1))
    v1["entries"][0]["config"].update(change)
    old.write_text(json.dumps(v1))
    _fails(capsys, ["tune", "convert", str(old), "--out", str(tmp_path / "n")], needle)
    assert not (tmp_path / "n").exists()


def test_adopt_prints_and_writes_through_the_one_writer(capsys, tmp_path):
    tuned = tmp_path / "tuned"
    res = read_result(DATA / "balance-12" / "d64n16k.json")
    write_entries("sm90", [make_entry(res.base.config, "bfloat16", 64, False, "le16k")], tuned)
    ab = tmp_path / "ab"
    shutil.copytree(DATA / "balance-12", ab)
    assert main(["tune", "adopt", str(ab), "--tuned", str(tuned), "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "d64n16k: sm90-fwd" in out and "bl1 +BALANCE=1: 0.958" in out
    assert "dry run: no tuned file written" in out
    assert main(["tune", "adopt", str(ab), "--tuned", str(tuned), "--json",
                 "--out", str(tmp_path / "v")]) == 0
    [v] = json.loads(capsys.readouterr().out)["verdicts"]
    assert json.loads((tmp_path / "v" / "adopt.json").read_text())["verdicts"] == [v]
    assert v["action"] == "adopted" and v["entry"]["config"]["BALANCE"] is True
    cfg = lookup(problem(res.cell, "sm90"), "sm90-fwd", tuned)[0]
    assert cfg == res.base.config.replace(BALANCE=True)


@pytest.mark.interpreter
def test_ab_and_cells_on_cpu_tensors(capsys, tmp_path):
    argv = ["tune", "ab", "--shape", "1,2,64,16", "--variants", "d=+;m=sdpa-math",
            "--device", "cpu", "--rounds", "2", "--reps", "1", "--out", str(tmp_path / "ab")]
    assert main(argv + ["--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in res["rows"]] == ["d", "m"]
    assert read_result(tmp_path / "ab" / "1x2x64x16n.json").base.config.KERNEL == "triton-fwd"
    _fails(capsys, argv, "1x2x64x16n.json is already there")
    assert (tmp_path / "ab" / "1x2x64x16n.csv").exists()
    out = tmp_path / "cells"
    argv = ["tune", "cells", "--cells", "1x2x64x16n,1x2x32x16c", "--variants",
            "b=+BLOCK_M=32", "--peers", "none", "--device", "cpu", "--rounds", "2",
            "--reps", "1", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "1x2x64x16n" in text and "1x2x32x16c" in text and " b" in text
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "1x2x32x16c.json", "1x2x64x16n.json", "summary.csv", "summary.json"]
    _fails(capsys, argv, "holds A/B results")
    assert main(argv + ["--resume", "--json"]) == 0
    assert all(r["resumed"] for r in json.loads(capsys.readouterr().out)["cells"])
    # A/Bs timed on the interpreter are never adopted
    assert main(["tune", "adopt", str(out), "--dry-run"]) == 0
    assert "skipped (timed on Triton's interpreter" in capsys.readouterr().out


def test_ab_takes_the_rest_of_the_mask_and_adopt_leaves_it_to_the_rule(capsys, tmp_path):
    """``tune ab --window --softcap``: the cell is named by its mask, the table says it,
    and ``adopt`` skips the cell even as if timed on a GPU (tuned entries hold no
    windows), naming why."""
    out = tmp_path / "ab"
    argv = ["tune", "ab", "--shape", "1,2,64,16", "--causal", "--window", "8,0",
            "--softcap", "2", "--variants", "d=+", "--device", "cpu", "--rounds", "2",
            "--reps", "1", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "1x2x64x16cw8_0s2" in text and "window [8, 0] softcap 2.0" in text
    path = out / "1x2x64x16cw8_0s2.json"
    data = json.loads(path.read_text())
    data["meta"]["target"] = "sm90"
    path.write_text(json.dumps(data))
    assert read_result(path).cell.case.window == (8, 0)
    assert main(["tune", "adopt", str(out), "--dry-run"]) == 0
    assert "skipped (a window, bottom-right alignment or cap" in capsys.readouterr().out
    _fails(capsys, ["tune", "ab", "--shape", "1,2,64,16,32", "--causal", "--window", "8,0",
                    "--variants", "d=+", "--device", "cpu"], "causal with Nq != Nk")
