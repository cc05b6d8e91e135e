"""``flashscope bench`` end to end on CPU: discovery, bad input, stamped result files, and
the real flashscope provider validated and timed through the interpreter."""

import csv
import json

import pytest

from flashscope.cli import main


def test_help_states_the_formulas(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    assert "4*B*H*Nq*Nk*D" in text and "x2.5" in text and "x3.5" in text
    assert "x0.5 when causal" in text


def test_list_baselines_gives_reasons(capsys):
    assert main(["bench", "--list-baselines", "--device", "cpu", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert not rows["sdpa-cudnn"]["available"] and "fa4" in rows
    assert "needs a CUDA GPU" in rows["sdpa-cudnn"]["why_not"]
    assert main(["bench", "--list-baselines", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "sdpa-cudnn" in out and "fa4" in out and "CUDA GPU" in out


@pytest.mark.parametrize("argv,needle", [
    (["--shape", "1,2,3"], "--shape '1,2,3'"),
    (["--shape", "1,3,64,32,64,2"], "Hkv = 2 must divide H = 3"),
    (["--shape", "1,2,64,32", "--only", "sdpa-mathh"], "did you mean 'sdpa-math'"),
    (["--shape", "1,2,64,32", "--metrics", "tflop"], "--metrics 'tflop'"),
    (["--shape", "1,2,64,32", "--dtype", "fp8"], "--dtype 'fp8'"),
    (["--shape", "1,2,64,32", "--mode", "back"], "--mode 'back'"),
    (["--shape", "1,2,64,32", "--only", "sdpa-math", "--baseline", "fa4"], "--baseline 'fa4'"),
    (["--shape", "1,2,64,32", "--rounds", "0"], "argument --rounds: expected an integer >= 1"),
    (["--shape", "1,2,64,32", "--warmup-ms", "-1"], "argument --warmup-ms: expected a finite"),
    (["--shape", "1,2,64,32", "--rep-ms", "nan"], "argument --rep-ms: expected a finite"),
    (["--suite"], "--suite needs a GPU"),
    ([], "give --suite"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, needle):
    assert main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


@pytest.mark.interpreter
def test_results_files_are_stamped(tmp_path, capsys):
    argv = ["bench", "--device", "cpu", "--shape", "1,2,40,16", "--causal", "yes",
            "--dtype", "fp16", "--only", "sdpa-math,flashscope", "--rounds", "2",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    meta = data["meta"]
    assert meta["command"].startswith("flashscope bench") and meta["date"] and meta["device"]
    assert meta["versions"]["torch"] and meta["versions"]["triton"]
    assert meta["timer"]["rounds"] == 2
    assert meta["timer"]["hide_host"] is False  # on only for --suite decode or when asked
    rows = {r["provider"]: r for r in data["results"]}
    assert rows["flashscope"]["status"] == "ok", rows["flashscope"]["reason"]
    assert rows["flashscope"]["max_rel_error"] <= 2e-3
    assert rows["sdpa-math"]["speedup"] == pytest.approx(1.0)
    assert len(rows["flashscope"]["ms_rounds"]) == 2
    # the CSV starts with its header (the stamp is its sidecar, bench.meta.json)
    with open(tmp_path / "bench.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert {r["provider"] for r in table} == {"sdpa-math", "flashscope"}
    assert json.loads((tmp_path / "bench.meta.json").read_text()) == meta
    assert (tmp_path / "bench.png").stat().st_size > 1000
    md = (tmp_path / "bench.md").read_text()
    assert "| fwd | fp16 | 1,2,40,16 | yes |" in md and "Command: `flashscope bench" in md
    assert not (tmp_path / "bench.partial.jsonl").exists()


@pytest.mark.interpreter
def test_a_stopped_run_keeps_its_finished_results(tmp_path, monkeypatch):
    """Under --out each result is on disk as soon as it is timed: a run stopped on its
    second result leaves the first in bench.partial.jsonl (a finished run removes it)."""
    from flashscope.bench import harness

    real, calls = harness._Runner.one, []

    def one(self, p, case):
        calls.append(p.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, p, case)

    monkeypatch.setattr(harness._Runner, "one", one)
    argv = ["bench", "--device", "cpu", "--shape", "1,2,40,16", "--causal", "no",
            "--dtype", "fp16", "--only", "sdpa-math,flashscope", "--out", str(tmp_path)]
    assert main(argv) == 130  # "interrupted", as Ctrl-C
    lines = (tmp_path / "bench.partial.jsonl").read_text().splitlines()
    assert [json.loads(x)["provider"] for x in lines] == [calls[0]]
    assert json.loads(lines[0])["status"] == "ok" and json.loads(lines[0])["ms"] > 0
    assert not (tmp_path / "bench.json").exists()
