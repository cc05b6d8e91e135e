"""The ``varlen`` and ``windows`` suites, what each provider is said to support for them, the
FLOPs they are charged, and the validation of packed and windowed cases on CPU tensors."""

import json

import pytest

from flashscope.bench import providers
from flashscope.bench.harness import _unsupported, run_bench
from flashscope.bench.suite import (Case, case_flops, draw_seqlens, odd_cases, table_suite,
                                    validation_key)
from flashscope.bench.timing import Timer
from flashscope.errors import FlashscopeError
from flashscope.masks import Mask, visible_pairs


def test_varlen_suite_is_its_draw_and_64k_tokens():
    cases = table_suite("varlen", dtypes=("bfloat16", "float16"), modes=("fwd", "bwd"))
    mixed = draw_seqlens(0, 65536, 128, 8192)
    assert all(128 <= n <= 8192 for n in mixed) and sum(mixed) == 65536
    packed = [c for c in cases if c.varlen]
    assert {c.seqlens for c in packed} == {mixed, (4096,) * 16}
    assert all(sum(c.seqlens) == 65536 and c.Nq == max(c.seqlens) for c in packed)
    assert {(c.D, c.causal) for c in cases} == {(64, False), (64, True), (128, False),
                                                (128, True)}
    twins = [c for c in cases if not c.varlen]
    for twin in twins:  # each dense twin beside its equal-length packed batch
        same = twin.with_(seqlens=(twin.Nq,) * twin.B, name=twin.name.replace(
            "dense twin of equal", "equal") + ", 64k tokens")
        assert same in cases and case_flops(same) == case_flops(twin)


def test_windows_suite_spans_the_widths_lengths_and_caps():
    cases = table_suite("windows")
    widths = {c.window[0] for c in cases if c.window}
    assert min(widths) == 128 and max(widths) == 4096
    assert {c.Nk for c in cases} >= {8192, 32768, 131072}
    assert any(c.softcap and c.window for c in cases)  # Gemma 2's local layers
    assert any(c.softcap and not c.window for c in cases)
    assert any(c.align == "bottom_right" and c.Nq < c.Nk for c in cases)
    assert any(not c.causal and c.window for c in cases)


def test_a_table_suite_runs_the_rows_of_the_head_dims_asked_for():
    every = table_suite("models")
    some = table_suite("models", head_dims=[64, 96])
    assert {c.D for c in some} == {64, 96}
    assert some == [c for c in every if c.D in (64, 96)]
    with pytest.raises(FlashscopeError, match="--head-dim 72: the windows suite has rows "
                                              "of head dims 64, 128, 256"):
        table_suite("windows", head_dims=[72])


@pytest.mark.parametrize("extra,row,msg", [
    (["window"], [[3, -1]], "rows\\[0\\] window \\[3, -1\\]: expected \\[left, right\\]"),
    (["softcap"], [0], "softcap 0: expected a number > 0"),
    (["seqlens"], [[5, 9]], "seqlens: expected B = 2 lengths whose longest is Nq = Nk"),
    (["stride"], [1], "expected columns"),
])
def test_malformed_suite_rows_are_refused_with_their_place(tmp_path, extra, row, msg):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({
        "columns": ["model", "B", "H", "Hkv", "Nq", "Nk", "D", "causal", *extra],
        "rows": [["m", 2, 4, 4, 8, 8, 64, True, *row]]}))
    with pytest.raises(FlashscopeError, match=msg):
        table_suite("bad", path=path)


def test_flops_charge_a_window_its_pairs_and_a_packed_batch_its_sequences():
    plain = Case(2, 4, 100, 100, 64, 4, True)
    assert case_flops(plain) == pytest.approx(4 * 2 * 4 * 100 * 100 * 64 * 0.5)
    packed = plain.with_(seqlens=(30, 100), B=2)
    assert case_flops(packed) == pytest.approx(4 * 4 * 64 * 0.5 * (30 ** 2 + 100 ** 2))
    band = plain.with_(window=(10, 0))
    pairs = sum(min(i, 10) + 1 for i in range(100))  # row i sees keys max(0, i-10)..i
    assert visible_pairs(Mask.of(True, (10, 0)), 100, 100) == pairs
    assert case_flops(band) == pytest.approx(4 * 4 * 64 * 2 * pairs)
    assert case_flops(band.with_(mode="bwd")) == pytest.approx(2.5 * case_flops(band))


def test_providers_say_what_they_cannot_run():
    reg = providers.REGISTRY
    windowed = Case(1, 4, 256, 256, 128, 4, True, window=(64, 0))
    packed = Case(3, 4, 90, 90, 128, 4, False, seqlens=(10, 90, 33))
    capped = Case(1, 4, 256, 256, 128, 4, False, softcap=30.0)
    shifted = Case(1, 4, 64, 256, 128, 4, True, window=(64, 0), align="bottom_right")
    for case, need in ((windowed, "window"), (packed, "packed"), (capped, "softcap")):
        assert need in _unsupported(reg["sdpa-math"], case)
        assert need in _unsupported(reg["flex"], case)
        for name in ("flashscope", "fa4", "fa2"):
            assert _unsupported(reg[name], case) is None, (name, case.label)
    # the flash-attn packages align bottom-right: like with like, or not at all
    assert _unsupported(reg["fa4"], shifted) is None
    assert "aligns bottom-right" in _unsupported(reg["fa4"], shifted.with_(align="top_left"))
    assert "aligns top-left" in _unsupported(reg["sdpa-math"],
                                             shifted.with_(window=None))
    assert _unsupported(reg["flashscope"], shifted.with_(align="top_left")) is None


@pytest.mark.parametrize("case", [
    Case(2, 4, 64, 64, 32, 4, True, align="bottom_right"),  # Nq == Nk: plain causal
    Case(2, 4, 48, 64, 32, 2, True, align="bottom_right"),  # the offset moves the band
    Case(1, 4, 256, 256, 64, 4, True, window=(128, 0)),
    Case(1, 4, 96, 96, 32, 4, False, window=(16, 8), softcap=30.0),
    Case(1, 4, 96, 96, 32, 4, True, seqlens=(40, 56), window=(8, 0)),
])
def test_flashscope_configs_start_from_the_problem_the_call_poses(case, monkeypatch):
    """A ``--config`` given to the flashscope provider starts from the default of the
    problem the library's call poses (window, softcap, band width as the API sets them)."""
    import torch

    import flashscope.families as families
    from flashscope import api

    seen = []
    real = families.config_from_text
    monkeypatch.setattr(families, "config_from_text",
                        lambda text, problem, *a, **k: seen.append(problem) or real(
                            text, problem, *a, **k))
    providers._flashscope(case, {"config": "num_warps=4", "device": "cpu"})
    if case.varlen:
        want = dict(varlen=True, **case.mask().problem_fields())
    else:
        q = torch.empty(case.B, case.H, case.Nq, case.D, dtype=torch.bfloat16, device="meta")
        k = torch.empty(case.B, case.Hkv, case.Nk, case.D, dtype=torch.bfloat16,
                        device="meta")
        posed = api.problem_of(q, k, case.mask(), None)
        want = {f: getattr(posed, f) for f in ("varlen", "window", "softcap", "band_keys")}
    assert {f: getattr(seen[0], f) for f in want} == want


def test_odd_shapes_keep_the_variant_and_a_band_to_mask():
    case = Case(1, 32, 32768, 32768, 128, 8, True, window=(4096, 0), softcap=50.0,
                mode="bwd")
    odd = odd_cases(case)
    assert all(c.window == (24, 0) and c.softcap == 50.0 for c in odd)
    assert validation_key(odd[0]) != validation_key(odd[0].with_(window=None))
    packed = odd_cases(Case(29, 16, 8097, 8097, 128, 16, True, seqlens=(8097,) * 29))
    assert all(c.varlen and 1 in c.seqlens and c.Nq == max(c.seqlens) for c in packed)


@pytest.mark.interpreter
@pytest.mark.parametrize("case", [
    Case(3, 2, 40, 40, 16, 1, True, "float16", "fwd+bwd", seqlens=(1, 40, 23),
         window=(9, None), align="bottom_right"),
    Case(1, 2, 45, 45, 16, 2, False, "float16", "fwd", window=(6, 6), softcap=4.0),
], ids=["packed", "windowed"])
def test_packed_and_windowed_cases_validate_and_time(case, monkeypatch):
    """flashscope passes the validation of its own cases (odd shapes included) on CPU
    tensors; SDPA's math path is unsupported there, with the reason. The packed odd batch
    is shortened for the interpreter (an empty, a length-1 and two partial-tile
    sequences)."""
    from flashscope.bench import suite

    monkeypatch.setattr(suite, "ODD_SEQLENS", (0, 1, 37, 20))
    chosen = providers.select(["sdpa-math", "flashscope"])
    results, _ = run_bench([case], chosen, device="cpu", timer=Timer(device="cpu", cpu_reps=1))
    rows = {r.provider: r for r in results}
    assert rows["flashscope"].status == "ok", rows["flashscope"].reason
    assert rows["flashscope"].max_rel_error <= 2e-3 and rows["flashscope"].tflops > 0
    assert len(rows["flashscope"].validated_shapes) >= 2
    assert rows["sdpa-math"].status == "unsupported"
