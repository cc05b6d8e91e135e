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


def test_a_windowed_cell_is_timed_under_its_mask_and_named_by_it(tmp_path):
    """A cell with a window and a cap: named by them, posed to the rule as a band, its
    TFLOP/s charged the pairs the window keeps (as the bench charges them), and its mask
    recorded and checked when the file is read back."""
    from flashscope.bench.suite import case_flops
    from flashscope.tune.cells import parse_cell, problem

    cell = shape_cell("1,2,64,16", True, window=(8, 0), softcap=2.0)
    assert cell.name == "1x2x64x16cw8_0s2" and parse_cell(cell.name).case == cell.case
    prob = problem(cell, "sm90")
    assert prob.window and prob.softcap and prob.band_keys == 8
    res = run_ab(cell, {"d": "+", "b": "+BLOCK_N=16"}, Settings(rounds=2, reps=1),
                 device="cpu")
    m = res["meta"]
    assert (m["window"], m["softcap"], "align" in m) == ([8, 0], 2.0, False)
    for r in res["rows"]:
        assert r["tflops"] == round(case_flops(cell.case) / (r["ms"] * 1e-3) / 1e12, 1)
        assert 0 <= r["max_rel_error"] < 1.6e-2
    assert case_flops(cell.case) < case_flops(shape_cell("1,2,64,16", True).case) / 3
    path = write_result(tmp_path / "w.json", res)
    assert read_result(path).cell == cell
    good = json.loads(path.read_text())
    for damage in (lambda d: d["meta"].__setitem__("window", [9, 0]),
                   lambda d: d["meta"].pop("softcap")):
        d = json.loads(json.dumps(good))
        damage(d)
        path.write_text(json.dumps(d))
        with pytest.raises(ArtifactError, match="1x2x64x16cw8_0s2's mask is"):
            read_result(path)


@pytest.mark.parametrize("name,msg", [
    ("1x2x64x16ns0", "softcap: expected a number > 0"),
    ("1x2x64x16x32cw5_0", "causal with Nq != Nk"),
    ("1x2x64x16cw5", "expected d<D>"),
    ("1x2x64x16nw-1_0", "expected d<D>"),
])
def test_bad_cell_masks_are_refused_by_name(name, msg):
    from flashscope.tune.cells import parse_cell

    with pytest.raises(FlashscopeError, match=f"cell '{name}': {msg}"):
        parse_cell(name)


def test_names_round_trip_every_mask():
    from flashscope.tune.cells import parse_cell

    for shape, causal, kw in [("2,16,32768,128", True, dict(window=(512, 0))),
                              ("4,32,2048,128,32768,8", True,
                               dict(window=(4096, 0), align="bottom_right")),
                              ("4,16,16384,128", False, dict(window=(None, 256))),
                              ("8,16,8192,128", False, dict(softcap=30.0)),
                              ("1,2,64,16", False, dict(window=(3, 3), softcap=2.5))]:
        cell = shape_cell(shape, causal, **kw)
        assert parse_cell(cell.name).case == cell.case, cell.name
    assert parse_cell("d64c1kw128_0").case.window == (128, 0)
