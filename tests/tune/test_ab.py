"""One A/B on CPU tensors through Triton's interpreter (flashscope.tune.ab): validation
before timing, peers that cannot run dropped with the reason, a variant that does less work
once timed caught, and the result file's round trip and refusals (flashscope.tune.results)."""

import json

import pytest
import torch

from flashscope.bench.providers import REGISTRY, Provider
from flashscope.errors import ArtifactError, FlashscopeError
from flashscope.tune.ab import Settings, run_ab
from flashscope.tune.cells import shape_cell
from flashscope.tune.results import read_result, write_result

pytestmark = pytest.mark.interpreter

CELL = shape_cell("1,2,64,16", False)


@pytest.fixture(scope="module")
def result():
    return run_ab(CELL, {"d": "+", "b": "+BLOCK_M=32", "m": "sdpa-math", "n": "cudnn"},
                  Settings(rounds=3, reps=1), device="cpu")


def test_every_variant_is_checked_then_timed_round_by_round(result):
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["d", "b", "m"]
    assert rows["d"]["kernel"] == "triton-fwd" and rows["d"]["label"].startswith("triton-fwd")
    assert rows["b"]["config"]["BLOCK_M"] == 32
    assert rows["d"]["ratio"] == rows["d"]["ratio_q1"] == rows["d"]["ratio_q3"] == 1.0
    assert all(0 <= r["max_rel_error"] < 1.6e-2 for r in rows.values())
    assert {n: len(t) for n, t in result["times"].items()} == {"d": 3, "b": 3, "m": 3}
    assert result["dropped"] == {"n": "needs a CUDA GPU"}
    m = result["meta"]
    assert (m["cell"], m["target"], m["rounds"], m["reps"], m["flush"]) == \
        ("1x2x64x16n", None, 3, 1, True)
    assert m["variants"] == "d=+;b=+BLOCK_M=32;m=sdpa-math;n=cudnn"


def test_results_round_trip_and_damage_is_named(result, tmp_path):
    path = write_result(tmp_path / "r.json", result)
    back = read_result(path)
    assert back.base.name == "d" and back.cell == CELL and back.target is None
    assert back.reading().ids == {"b": back.variants[1].identity}  # peers are not candidates
    good = json.loads(path.read_text())
    cases = [
        (lambda d: d["times"]["b"].__setitem__(1, float("nan")),
         "times.b: expected 3 positive"),
        (lambda d: d["times"]["b"].pop(), "times.b: expected 3"),
        (lambda d: d["rows"][1].__setitem__("kernel", "bogus"), "rows\\[1\\].kernel: 'bogus'"),
        (lambda d: d["rows"][1]["config"].__setitem__("BLOCK_Q", 1), "rows\\[1\\].config: "),
        (lambda d: d["meta"].__setitem__("rounds", True), "meta.rounds: expected an integer, got True"),
        (lambda d: d["meta"].__setitem__("shape", "1,2,65,16"), "meta: cell 1x2x64x16n is not"),
        (lambda d: d.pop("kind"), "not a flashscope tune A/B result"),
        (lambda d: d["meta"].__setitem__("target", "sm99"), "meta: .*sm99"),
        (lambda d: d.__setitem__("rows", []), "rows: empty"),
        (lambda d: d["rows"].append(dict(d["rows"][0])), "a second row named 'd'"),
    ]
    for damage, msg in cases:
        d = json.loads(json.dumps(good))
        damage(d)
        path.write_text(json.dumps(d))
        with pytest.raises(ArtifactError, match=msg):
            read_result(path)


def _cheat(case, options):
    """Right for the two validation calls, zeros once timed."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def fn(q, k, v):
        calls.append(1)
        out = sdpa(q.float(), k.float(), v.float(), is_causal=case.causal).to(q.dtype)
        return out if len(calls) <= 2 else torch.zeros_like(out)
    return fn


def test_a_variant_that_does_less_work_once_timed_is_dropped(monkeypatch):
    monkeypatch.setitem(REGISTRY, "cheat", Provider("cheat", "test", _cheat))
    res = run_ab(CELL, {"m": "sdpa-math", "c": "cheat"}, Settings(rounds=2, reps=1),
                 device="cpu")
    assert [r["name"] for r in res["rows"]] == ["m"] and set(res["times"]) == {"m"}
    assert "last timed call: out: all zeros" in res["dropped"]["c"]


def test_the_base_must_run():
    with pytest.raises(FlashscopeError, match="the first variant, n=cudnn, is the base of "
                                              "every ratio and cannot run: needs a CUDA GPU"):
        run_ab(CELL, {"n": "cudnn", "m": "sdpa-math"}, Settings(rounds=1, reps=1),
               device="cpu")


def test_a_bad_spec_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setitem(REGISTRY, "boom", Provider("boom", "test", lambda c, o: 1 / 0))
    with pytest.raises(FlashscopeError, match="variant b=\\+BLOCK_M=48"):
        run_ab(CELL, {"x": "boom", "b": "+BLOCK_M=48"}, Settings(rounds=1, reps=1),
               device="cpu")


@pytest.mark.parametrize("kw,msg", [(dict(rounds=0), "--rounds 0"),
                                    (dict(reps=True), "--reps True")])
def test_settings_are_checked(kw, msg):
    with pytest.raises(FlashscopeError, match=msg):
        Settings(**kw)
