import json

import pytest

from flashscope.cli import main
from flashscope import TritonFwdConfig
from flashscope.families import Problem
from flashscope.sweep import evaluate as ev
from flashscope.sweep.plot import plot_pareto
from flashscope.sweep.run import SweepRequest, run_sweep
from flashscope.sweep.space import parse_space
from flashscope.sweep.store import read_records
from flashscope.sweep.tuned import write_tuned
from flashscope.tuned import lookup

from .conftest import TINY


def _space(tmp_path, data, name="space.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


@pytest.mark.parametrize("data,needle", [
    ({**TINY, "BLOCK_Q": [16]}, "unknown key 'BLOCK_Q'"),
    ({**TINY, "num_warps": [3]}, "num_warps: 3 is impossible"),
    ({**TINY, "maxnreg": [8]}, "maxnreg: 8 is impossible"),
])
def test_bad_space_file_fails_before_any_work(tmp_path, capsys, data, needle):
    out = tmp_path / "out"
    assert main(["sweep", "--space", _space(tmp_path, data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (out / "results.jsonl").exists()


@pytest.mark.parametrize("argv,needle", [
    (["--write-tuned"], "--write-tuned needs --gpu"),
    (["--gpu"], "--gpu needs --shapes"),
    (["--budget", "3"], "--budget applies to --search evolve"),
    (["--search", "evolve"], "evolve needs a positive number"),
    (["--shapes", "4,32,4096,64"], "--shapes applies to GPU sweeps"),
    (["--head-dims", "300"], "head_dims: 300"),
    (["--targets", "sm91"], "unknown target"),
    (["--dtypes", "fp8"], "--dtype 'fp8'"),
    (["--history", "nope.jsonl", "--search", "evolve", "--budget", "1"], "no such file"),
])
def test_bad_arguments(tmp_path, capsys, argv, needle):
    out = tmp_path / "out"
    code = main(["sweep", "--space", _space(tmp_path, TINY), "--out", str(out),
                 "--no-progress", *argv])
    assert code == 2
    assert needle in capsys.readouterr().err
    assert not (out / "results.jsonl").exists()


def test_offline_sweep_end_to_end_then_resume(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["sweep", "--space", _space(tmp_path, TINY), "--out", str(out), "--jobs", "1",
            "--no-progress"]
    assert main(argv) == 0
    recs = read_records(out / "results.jsonl")
    assert len(recs) == 2
    for r in recs:
        assert r["status"] == "ok" and r["kind"] == "offline"
        assert r["registers"] > 0 and r["shared_bytes"] > 0 and r["threads"] == 32
        assert 0 < r["occupancy"] <= 1 and r["limiter"] and r["active_warps"] > 0
        assert r["spill_stores"] == 0
    summary = json.loads((out / "summary.json").read_text())
    (job,) = summary["jobs"]
    assert job["ok"] == 2 and job["feasible"] == 2 and job["fronts"]["offline"]
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert main(argv) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(argv + ["--resume", "--json"]) == 0
    assert len(read_records(out / "results.jsonl")) == 2
    doc = json.loads(capsys.readouterr().out)  # --json prints summary.json's document
    assert doc == json.loads((out / "summary.json").read_text())
    assert doc["skipped_done"] == 2
    rows = (out / "summary.csv").read_text().splitlines()
    assert rows[0].startswith("job,target,dtype,head_dim") and len(rows) == 2


def test_evolve_offline_uses_history(tmp_path):
    hist = tmp_path / "hist"
    assert main(["sweep", "--space", _space(tmp_path, TINY), "--out", str(hist), "--jobs", "1",
                 "--no-progress", "--no-plot"]) == 0
    wider = {**TINY, "num_warps": [1, 2]}
    out = tmp_path / "evo"
    assert main(["sweep", "--space", _space(tmp_path, wider, "wide.json"), "--out", str(out),
                 "--search", "evolve", "--budget", "5", "--jobs", "1", "--no-progress",
                 "--no-plot", "--history", str(hist / "results.jsonl")]) == 0
    recs = read_records(out / "results.jsonl")
    assert sorted(r["config"]["num_warps"] for r in recs) == [2, 2]  # only the unknown ones
    assert all(r["search"] == "evolve" for r in recs)
    summary = json.loads((out / "summary.json").read_text())
    (evo,) = summary["evolve"].values()
    assert evo["known_before"] == 2 and evo["evaluated"] == 2


def fake_gpu(item):
    """Latency from the config (no GPU): smallest for BLOCK_M=32, num_warps=2."""
    rec = ev.base_record(item)
    c = item["config"]
    ms = 1.0 + (c["BLOCK_M"] != 32) * 0.5 + (c["num_warps"] != 2) * 0.25
    rec.update(status="ok", ms=ms, tflops=10 / ms, registers=c["BLOCK_M"],
               occupancy=1 / c["num_warps"], spill_stores=0, spill_loads=0, local_bytes=0)
    return rec


def test_gpu_sweep_records_tuned_files_and_plot(tmp_path):
    space = parse_space({**TINY, "head_dims": [64], "causal": [False, True],
                         "num_warps": [1, 2, 4]})
    out = tmp_path / "results.jsonl"
    summary = run_sweep(SweepRequest(space=space, out=out, gpu=True, jobs=1, progress=False,
                                     shapes=("2,8,1000,64",), evaluator=fake_gpu))
    recs = read_records(out)
    assert len(recs) == 12 and {r["shape"] for r in recs} == {"2,8,1000,64"}
    best = TritonFwdConfig(32, 16, 2, 1)
    assert all(r["best"]["config_key"] == best.key for r in summary["jobs"])
    assert all(r["best"]["label"] == "triton-fwd 32x16 w2 s1" for r in summary["jobs"])
    assert summary["jobs"][0]["fronts"]["gpu_registers"][0]["config_key"] == best.key
    paths = write_tuned(recs, tmp_path / "tuned")
    assert [p.name for p in paths] == ["sm90.json"]
    cfg, tuned, _ = lookup(Problem("sm90", "bfloat16", 64, True, 900, 900), "triton-fwd",
                           tmp_path / "tuned")
    assert tuned and cfg == TritonFwdConfig(32, 16, 2, 1)
    assert plot_pareto(recs, tmp_path / "p.png", "gpu").stat().st_size > 1000


def test_gpu_shape_must_match_a_head_dim(tmp_path):
    from flashscope.errors import FlashscopeError

    with pytest.raises(FlashscopeError, match="head dim 128 is not among"):
        run_sweep(SweepRequest(space=parse_space(TINY), out=tmp_path / "r.jsonl", gpu=True,
                               shapes=("1,2,256,128",), evaluator=fake_gpu, progress=False))
    assert not (tmp_path / "r.jsonl").exists()


def test_compare_command(tmp_path):
    space = parse_space({**TINY, "head_dims": [64], "num_warps": [1, 2, 4]})
    ex = tmp_path / "ex.jsonl"
    run_sweep(SweepRequest(space=space, out=ex, gpu=True, jobs=1, progress=False,
                           shapes=("2,8,1000,64",), evaluator=fake_gpu))
    evo = tmp_path / "evo.jsonl"
    run_sweep(SweepRequest(space=space, out=evo, gpu=True, jobs=1, progress=False,
                           shapes=("2,8,1000,64",), evaluator=fake_gpu, search="evolve",
                           budget=3))
    assert len(read_records(evo)) == 3
    assert main(["sweep", "--compare", str(ex), str(evo), "--out", str(tmp_path)]) == 0
    cmp = json.loads((tmp_path / "compare.json").read_text())
    (row,) = cmp["measured"]
    assert row["exhaustive_evaluations"] == 6 and row["evolve_evaluations"] == 3
    assert row["fraction_of_evaluations"] == 0.5
    assert cmp["replayed"][0]["budget"] == 3


@pytest.mark.interpreter
def test_gpu_evaluation_through_the_interpreter(tmp_path):
    """The real GPU path (offline read + bench harness validation and timing) on CPU
    tensors through Triton's interpreter: one tiny point, odd shapes included."""
    space = parse_space({**TINY, "BLOCK_M": [32], "BLOCK_N": [32], "num_warps": [2],
                         "causal": [True]})
    out = tmp_path / "results.jsonl"
    run_sweep(SweepRequest(space=space, out=out, gpu=True, jobs=1, progress=False,
                           shapes=("1,2,64,16",), device="cpu", precompile=False))
    (rec,) = read_records(out)
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["ms"] > 0 and rec["tflops"] > 0 and 0 < rec["max_rel_error"] < 0.02
    assert rec["registers"] > 0 and rec["occupancy"] > 0
    assert rec["validated_shapes"][-1] == "1,2,64,16" and len(rec["validated_shapes"]) == 5
