"""The tuner on a GPU (``pytest --device cuda``): CUDA-event bursts with the L2 flush, the
sm90 kernel against cuDNN, and cells spread over every visible GPU with the offline
compiles first."""

import pytest

from flashscope.tune.ab import Settings, run_ab
from flashscope.tune.batch import cell_specs, run_cells
from flashscope.tune.cells import parse_cell
from flashscope.tune.results import read_result, result_paths

pytestmark = pytest.mark.gpu


def _target():
    import torch

    from flashscope.launch import device_target

    return device_target(torch.device("cuda"))


def test_one_cell_against_cudnn_with_the_flush():
    res = run_ab(parse_cell("d64c1k"), {"d": "+", "p": "+PINGPONG=1", "n": "cudnn"},
                 Settings(rounds=3, reps=3))
    rows = {r["name"]: r for r in res["rows"]}
    assert rows["d"]["ratio"] == 1.0 and rows["d"]["tflops"] > 0
    assert set(rows) == {"d", "p", "n"}, res["dropped"]
    assert all(0 < r["max_rel_error"] < 1.6e-2 for n, r in rows.items() if n != "n")
    m = res["meta"]
    assert m["target"] == _target() and m["flush"] and m["gpu"] is not None
    assert all(len(t) == 3 and min(t) > 0 for t in res["times"].values())


def test_cells_over_every_visible_gpu(tmp_path):
    target = _target()
    cells = [parse_cell("d64n1k"), parse_cell("d128c1k")]
    plan = {c.name: (c, cell_specs(c, target, common={"b": "+BALANCE=0"}))
            for c in cells}
    summary = run_cells(plan, tmp_path, Settings(rounds=2, reps=2), target=target, jobs=4)
    assert [r["cell"] for r in summary["cells"]] == ["d64n1k", "d128c1k"]
    assert not any("error" in r for r in summary["cells"]), summary
    for p in result_paths(tmp_path):
        res = read_result(p)
        assert res.base.spec == "+" and res.meta["uuid"]
