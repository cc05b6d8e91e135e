"""Backward sweeps offline: the space as data, pruning, records, Pareto front, resume, and
the requests refused (GPU timing, evolve)."""

import json

import pytest

from flashscope.cli import main
from flashscope import TritonBwdConfig
from flashscope.errors import ConfigError
from flashscope.sweep.space import BWD_AXES, default_space, parse_space

#: Two dQ points at head dim 16 on sm90 (the dK/dV tiles collapse to their first value).
TINY_BWD = {"targets": ["sm90"], "dtypes": ["bfloat16"], "head_dims": [16],
            "causal": [False], "BLOCK_M1": [16, 32], "BLOCK_N1": [16], "BLOCK_M2": [16, 32],
            "BLOCK_N2": [16], "num_warps": [1], "num_stages": [1]}


def test_backward_space_points_and_pruning():
    sp = parse_space({**TINY_BWD, "head_dims": [256], "BLOCK_N2": [16, 256],
                      "num_stages": [3]}, kernel="bwd_dq")
    feasible, pruned = sp.points()
    assert all(isinstance(c, TritonBwdConfig) for _, c in feasible)
    assert {c.BLOCK_M1 for _, c in feasible + [(p, c) for p, c, _ in pruned]} == {16}
    assert [(c.BLOCK_M2, c.BLOCK_N2) for _, c in feasible] == [(16, 16), (32, 16)]
    assert len(pruned) == 2 and all("shared memory" in r and "BLOCK_N2=256" in r
                                    for _, _, r in pruned)
    dkdv = parse_space(TINY_BWD, kernel="bwd_dkdv").points()[0]
    assert [c.BLOCK_M1 for _, c in dkdv] == [16, 32] and {c.BLOCK_M2 for _, c in dkdv} == {16}
    assert set(sp.axes_for(sp.problems()[0])) == set(BWD_AXES)


@pytest.mark.parametrize("data, kernel, needle", [
    ({**TINY_BWD, "Q_IN_REGS": [True]}, "bwd_dq", "unknown key 'Q_IN_REGS'"),
    ({**TINY_BWD, "BLOCK_M2": [24]}, "bwd_dq", "BLOCK_M2: 24 is impossible"),
    (TINY_BWD, "fwd", "unknown key 'BLOCK_M1'"),
    (TINY_BWD, "bwd", "--kernel 'bwd'"),
])
def test_bad_backward_space(data, kernel, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_space(data, kernel=kernel)


def test_default_backward_space():
    sp = default_space(["sm90", "gfx942"], head_dims=[128], causal=[False], kernel="bwd_dkdv")
    feasible, pruned = sp.points()
    assert sp.kernel == "bwd_dkdv" and 8 <= len(feasible) <= 32
    assert all(c.maxnreg is None for p, c in feasible if p.target == "gfx942")


def _space(tmp_path, data):
    p = tmp_path / "space.json"
    p.write_text(json.dumps(data))
    return str(p)


def test_backward_sweep_end_to_end_then_resume(tmp_path):
    out = tmp_path / "o"
    argv = ["sweep", "--kernel", "bwd_dq", "--space", _space(tmp_path, TINY_BWD), "--out",
            str(out), "--jobs", "1", "--no-progress"]
    assert main(argv) == 0
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(r["status"] == "ok" and r["kernel"] == "bwd_dq"
                                  for r in recs)
    assert all(r["key"].startswith("offline|bwd_dq|sm90|bfloat16|16|full|") for r in recs)
    assert all(r["registers"] > 0 and 0 < r["occupancy"] <= 1 and r["shared_bytes"] > 0
               and r["spill_stores"] == 0 for r in recs)
    summary = json.loads((out / "summary.json").read_text())
    job = summary["jobs"][0]
    assert summary["kernel"] == "bwd_dq" and job["ok"] == 2 and job["kernel"] == "bwd_dq"
    front = job["fronts"]["offline"]
    best = min(recs, key=lambda r: (-r["occupancy"], r["registers"]))
    assert front and front[0]["config_key"] in {r["config_key"] for r in recs}
    assert best["config_key"] in {f["config_key"] for f in front}
    assert (out / "pareto.png").stat().st_size > 0
    assert main(argv + ["--resume"]) == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("extra, needle", [
    (["--gpu", "--shapes", "1,1,128,16"], "GPU sweeps time the forward kernels; read "
                                          "backward configs offline"),
    (["--search", "evolve", "--budget", "2"], "use --search exhaustive"),
])
def test_backward_requests_refused(tmp_path, capsys, extra, needle):
    assert main(["sweep", "--kernel", "bwd_dkdv", "--space", _space(tmp_path, TINY_BWD),
                 "--out", str(tmp_path / "o"), "--no-progress", *extra]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o" / "results.jsonl").exists()
