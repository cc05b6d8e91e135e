"""A sweep killed with SIGKILL leaves no worker behind; Ctrl-C ends a sweep with one line
and no worker tracebacks; a second sweep on a store being written is refused. Linux only
(the workers' death signal is a Linux prctl; the checks read /proc)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashscope.cli import main

from .conftest import TINY

HERE = Path(__file__).parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG and /proc are Linux's")


def _env():
    """The command as a user runs it: the test session's interpreter switch left out (with
    it, each worker would compile in a pool of its own)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    return env


def _children(pid: int) -> list:
    """Process ids whose parent is ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_lines(path: Path, n: int, proc, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended early ({proc.returncode})")
        time.sleep(0.02)
    pytest.fail(f"the sweep wrote fewer than {n} records in {timeout} s")


def test_sigkill_of_a_pooled_sweep_leaves_no_worker(tmp_path):
    out = tmp_path / "results.jsonl"
    proc = subprocess.Popen([sys.executable, str(HERE / "slow_sweep.py"), str(out), "2"],
                            env=_env())
    try:
        _wait_lines(out, 3, proc)
        workers = _children(proc.pid)
        assert len(workers) >= 2, workers  # the pool (and its resource tracker, if any)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.05)
    left = [w for w in workers if _alive(w)]
    for w in left:  # never leave them to the next test
        os.kill(w, signal.SIGKILL)
    assert left == [], f"workers outlived their killed parent: {left}"


def test_ctrl_c_ends_a_pooled_sweep_with_one_line(tmp_path):
    """Ctrl-C while the pool compiles: one line, exit 130, no worker left, every record
    whole. The compile caches are the test's own, empty: with warm ones (other tests
    build these configs) the sweep can end before the signal comes, its records reaching
    the store in order, in one burst."""
    space = tmp_path / "space.json"
    space.write_text(json.dumps({**TINY, "BLOCK_M": [16, 32, 64], "BLOCK_N": [16, 32],
                                 "num_warps": [1, 2], "num_stages": [1, 2]}))
    out = tmp_path / "out"
    env = dict(_env(), FLASHSCOPE_CACHE=str(tmp_path / "cache"),
               TRITON_CACHE_DIR=str(tmp_path / "triton"))
    # SIGINT as a terminal leaves it: a test run started in the background of a shell
    # without job control ignores it, and its children inherit that
    proc = subprocess.Popen([sys.executable, "-m", "flashscope.cli", "sweep", "--space",
                             str(space), "--out", str(out), "--jobs", "2", "--no-plot"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_lines(out / "results.jsonl", 1, proc, timeout=180)
        workers = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "flashscope sweep: interrupted", err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    time.sleep(0.5)
    assert not [w for w in workers if _alive(w)]
    lines = (out / "results.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(x)["status"] for x in lines[:-1])


def test_a_second_sweep_on_a_store_being_written_is_refused(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    sys.path.insert(0, str(HERE))
    import slow_sweep

    space = tmp_path / "space.json"
    space.write_text(json.dumps(slow_sweep.SPACE))
    proc = subprocess.Popen([sys.executable, str(HERE / "slow_sweep.py"), str(out)],
                            env=_env())
    try:
        _wait_lines(out, 1, proc)
        code = main(["sweep", "--space", str(space), "--out", str(tmp_path), "--resume",
                     "--no-progress", "--no-plot"])
        err = capsys.readouterr().err
    finally:
        proc.wait(timeout=60)
    assert code == 2 and "is being written by another sweep" in err, err
    assert proc.returncode == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 24 and len({r["key"] for r in recs}) == 24  # no record doubled
