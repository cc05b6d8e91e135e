import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashscope.errors import ArtifactError, FlashscopeError
from flashscope.sweep import evaluate as ev
from flashscope.sweep.run import run_sweep
from flashscope.sweep.store import ResultStore, read_records

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import slow_sweep  # noqa: E402


def rec(key, **kw) -> dict:
    """The smallest record a sweep writes (an offline point that failed)."""
    return {"key": key, "kind": "offline", "status": "failed", "target": "sm90",
            "dtype": "bfloat16", "head_dim": 64, "causal": False,
            "config": {"BLOCK_M": 64}, "config_key": "m64", **kw}


def line(key, **kw) -> bytes:
    return (json.dumps(rec(key, **kw), sort_keys=True) + "\n").encode()


def test_append_and_read(tmp_path):
    p = tmp_path / "r.jsonl"
    with ResultStore(p) as s:
        s.append(rec("a", x=1))
        s.append(rec("b", x=[1, 2]))
    assert read_records(p) == [rec("a", x=1), rec("b", x=[1, 2])]
    assert p.read_text().count("\n") == 2


def test_existing_results_need_resume(tmp_path):
    p = tmp_path / "r.jsonl"
    with ResultStore(p) as s:
        s.append(rec("a"))
    with pytest.raises(FlashscopeError, match="already holds results; pass --resume"):
        ResultStore(p)
    with ResultStore(p, resume=True) as s:
        assert s.done == {"a"}


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    p = tmp_path / "r.jsonl"
    with ResultStore(p) as s:
        s.append(rec("a"))
        with pytest.raises(FlashscopeError, match="being written by another sweep"):
            ResultStore(p, resume=True)
        s.append(rec("b"))
    with ResultStore(p, resume=True) as s:  # the lock went with the first writer
        assert s.done == {"a", "b"}


def test_torn_last_line_is_ignored_then_cut_on_resume(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(line("a") + line("b")[:-9])
    assert read_records(p) == [rec("a")]
    with ResultStore(p, resume=True) as s:
        assert s.done == {"a"}
        s.append(rec("c"))
    assert p.read_bytes() == line("a") + line("c")


def test_damage_in_the_middle_is_an_error(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(line("a") + b'{"key": \n' + line("c"))
    with pytest.raises(ArtifactError, match="line 2 is not a JSON object"):
        read_records(p)
    p.write_bytes(b'[1, 2]\n')
    with pytest.raises(ArtifactError, match="line 1"):
        read_records(p)


def test_sigkill_loses_no_finished_record_and_resume_skips_them(tmp_path):
    out = tmp_path / "results.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(HERE / "slow_sweep.py"), str(out)], env=env)
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            if out.exists() and out.read_bytes().count(b"\n") >= 5:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the sweep wrote no records in 60 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    first = read_records(out)
    assert 5 <= len(first) < 24, "killed too late to test anything"
    keys = [r["key"] for r in first]
    assert len(set(keys)) == len(keys)
    assert all(r["status"] == "ok" for r in first)

    seen = []

    def counting(item):
        seen.append(item["key"])
        return _fast(item)

    summary = run_sweep(slow_sweep.request(out, resume=True, evaluator=counting))
    assert set(seen).isdisjoint(keys)
    final = read_records(out)
    final_keys = [r["key"] for r in final]
    assert len(final) == 24 and len(set(final_keys)) == 24
    assert final[:len(first)] == first
    assert summary["skipped_done"] == len(first) and summary["new_records"] == 24 - len(first)
    # a second resume has nothing left to do
    seen.clear()
    again = run_sweep(slow_sweep.request(out, resume=True, evaluator=counting))
    assert seen == [] and again["new_records"] == 0 and len(read_records(out)) == 24


def _fast(item):
    rec = ev.base_record(item)
    rec.update(status="ok", registers=1, occupancy=1.0)
    return rec


def test_records_are_single_json_lines(tmp_path):
    p = tmp_path / "r.jsonl"
    with ResultStore(p) as s:
        s.append(rec("k", reason="line one\nline two"))
    lines = p.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["reason"] == "line one\nline two"
