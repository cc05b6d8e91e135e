"""Many cells (flashscope.tune.batch): one pinned worker process per GPU each timing whole
cells, results written as each cell ends, a SIGKILL losing no finished cell and leaving no
worker, --resume, and the folder lock. The workers time SDPA's math backend on CPU
tensors, so no GPU is needed; the pinning is the CUDA_VISIBLE_DEVICES the workers get."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashscope.errors import FlashscopeError
from flashscope.sweep.executors import GpuExecutor, SerialExecutor
from flashscope.tune.batch import FolderLock, run_cells
from flashscope.tune.results import read_result, result_paths

from ..sweep.test_durability import _alive, _children
from . import slow_cells

HERE = Path(__file__).parent
QUICK = slow_cells.Settings(rounds=2, reps=1)


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Torch on one thread here and in the workers: the timed calls take a fraction of a
    millisecond, and on a shared two-core machine two spinning threads make each 50 ms."""
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.slow
def test_each_cell_is_timed_whole_on_one_pinned_worker(tmp_path):
    plan = slow_cells.plan(2)
    ex = GpuExecutor(["3", "5"])
    try:
        summary = run_cells(plan, tmp_path, QUICK, executor=ex, device="cpu")
    finally:
        ex.close()
    files = result_paths(tmp_path)
    assert [p.stem for p in files] == sorted(plan)
    gpus = {read_result(p).meta["gpu"] for p in files}
    assert gpus == {"3", "5"}  # two cells start on the two free workers at once
    assert [r["cell"] for r in summary["cells"]] == list(plan)
    assert all(r["ratios"]["d"] == 1.0 and r["gpu"] in ("3", "5") for r in summary["cells"])


def test_a_folder_with_results_needs_resume_or_force(tmp_path):
    plan = slow_cells.plan(2)
    run_cells(plan, tmp_path, QUICK, executor=SerialExecutor(), device="cpu")
    before = {p.name: p.read_bytes() for p in result_paths(tmp_path)}
    with pytest.raises(FlashscopeError, match="holds A/B results .* --resume .* --force"):
        run_cells(plan, tmp_path, QUICK, executor=SerialExecutor(), device="cpu")
    summary = run_cells(plan, tmp_path, QUICK, executor=SerialExecutor(), device="cpu",
                        resume=True)
    assert all(r.get("resumed") for r in summary["cells"])
    assert {p.name: p.read_bytes() for p in result_paths(tmp_path)} == before
    other = {n: (c, {"d": "sdpa-math"}) for n, (c, _) in plan.items()}
    with pytest.raises(FlashscopeError, match="--resume: .* timed other variants or settings"):
        run_cells(other, tmp_path, QUICK, executor=SerialExecutor(), device="cpu",
                  resume=True)


def test_a_second_run_on_the_folder_is_refused_while_one_runs(tmp_path):
    with FolderLock(tmp_path):
        with pytest.raises(FlashscopeError, match="another flashscope tune run is writing"):
            run_cells(slow_cells.plan(1), tmp_path, QUICK, executor=SerialExecutor(),
                      device="cpu")
    run_cells(slow_cells.plan(1), tmp_path, QUICK, executor=SerialExecutor(), device="cpu")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_keeps_every_finished_cell_leaves_no_worker_and_resumes(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parents[1] / "src"), str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(HERE / "slow_cells.py"), str(tmp_path)],
                            env=env)
    workers = []
    deadline = time.time() + 180
    try:
        while time.time() < deadline:
            workers += [w for w in _children(proc.pid) if w not in workers]
            if len(result_paths(tmp_path)) >= 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("no cell finished in 180 s")
        workers += [w for w in _children(proc.pid) if w not in workers]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    first = {p.name: p.read_bytes() for p in result_paths(tmp_path)}
    assert 2 <= len(first) < 8, "killed too late to test anything"
    assert {read_result(p).meta["gpu"] for p in result_paths(tmp_path)} <= {"0", "1"}
    for p in result_paths(tmp_path):
        read_result(p)  # every file written is whole
    time.sleep(1.0)
    alive = [w for w in workers if _alive(w)]
    assert workers and not alive, f"workers left behind: {alive}"
    summary = run_cells(slow_cells.plan(), tmp_path, slow_cells.SETTINGS,
                        executor=SerialExecutor(), device="cpu", resume=True)
    assert len(result_paths(tmp_path)) == 8 and len(summary["cells"]) == 8
    assert {n: b for n, b in ((p.name, p.read_bytes()) for p in result_paths(tmp_path))
            if n in first} == first


def test_suite_cells_are_the_suites_dense_shapes_named_by_model():
    from flashscope.bench.suite import standard_suite, table_suite
    from flashscope.tune.cells import parse_cell, suite_cells

    models = suite_cells("models", "float16")
    rows = table_suite("models", dtypes=("float16",))
    assert [c.case for c in models] == rows  # every row, model name and dtype kept
    assert len({c.name for c in models}) == len(models)
    for c in models:  # a name stands for its shape, so a result file re-reads as its cell
        assert parse_cell(c.name, "float16").case == c.case.__class__(
            **{**c.case.__dict__, "name": ""})
    std = suite_cells("standard")
    assert [(c.case.B, c.case.H, c.case.Nq, c.case.D, c.case.causal) for c in std] == [
        (c.B, c.H, c.Nq, c.D, c.causal) for c in standard_suite()]
    assert "d64c1k" in {c.name for c in std}


def test_best_config_leaves_peers_out_and_states_the_regret():
    from flashscope.tune.batch import best_config

    rows = [{"name": "d", "ratio": 1.0, "config": {}, "label": "sm90-fwd 128x128"},
            {"name": "a", "ratio": 0.8, "config": {}, "label": "sm90-fwd 192x128"},
            {"name": "n", "ratio": 0.5}]  # a peer: faster, never the best config
    b = best_config(rows)
    assert (b["best"], b["best_label"], b["regret"], b["configs"]) == (
        "a", "sm90-fwd 192x128", 1.25, ["d", "a"])
    assert best_config(rows[:1])["regret"] == 1.0
    assert best_config(rows[2:])["best"] is None


def test_cells_go_to_the_workers_longest_first(tmp_path):
    """The executor receives the cells by work, largest first (a long cell that starts last
    keeps one GPU busy after the others are done); the summary keeps the plan's order."""
    class Recording(SerialExecutor):
        def imap(self, fn, items):
            self.seen = [i["cell"] for i in items]
            return super().imap(fn, items)

    plan = slow_cells.plan(3)  # 32, 40, 48 rows
    ex = Recording()
    summary = run_cells(plan, tmp_path, QUICK, executor=ex, device="cpu")
    assert ex.seen == list(plan)[::-1]
    assert [r["cell"] for r in summary["cells"]] == list(plan)
