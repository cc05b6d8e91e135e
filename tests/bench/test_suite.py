"""The shape suite, shape parsing and the provider registry."""

import pytest

from flashscope.bench import providers
from flashscope.bench.suite import Case, odd_cases, parse_shape, standard_suite
from flashscope.errors import FlashscopeError


def test_standard_suite_keeps_tokens_and_width():
    cases = standard_suite(dtypes=("bfloat16", "float16"), modes=("fwd", "bwd"))
    assert len(cases) == 2 * 2 * 3 * 2 * 6
    for c in cases:
        assert c.B * c.Nq == 16384 and c.H * c.D == 2048 and c.Nq == c.Nk and c.Hkv == c.H
    assert {c.Nq for c in cases} == {512, 1024, 2048, 4096, 8192, 16384}


def test_parse_shape_defaults_and_round_trip():
    assert parse_shape("2,8,100,64") == (2, 8, 100, 64, 100, 8)
    assert parse_shape("2,8,100,64,300,2") == (2, 8, 100, 64, 300, 2)
    c = Case(2, 8, 100, 300, 64, 2, False)
    assert parse_shape(c.shape) == (2, 8, 100, 64, 300, 2)
    for bad in ("2,8,100", "a,b,c,d", "2,8,0,64", "1,2,3,4,5,6,7"):
        with pytest.raises(FlashscopeError, match="--shape"):
            parse_shape(bad)


def test_odd_cases_cover_odd_lengths_and_gqa():
    case = Case(8, 16, 2048, 2048, 128, 16, True, "bfloat16", "bwd")
    odd = odd_cases(case)
    assert any(c.Nq % 2 for c in odd)
    assert any(c.Nq > c.Nk for c in odd) and any(c.Nq < c.Nk for c in odd)
    assert any(c.gqa for c in odd) and not any(c.gqa for c in odd_cases(case, gqa=False))
    assert all((c.D, c.causal, c.dtype, c.mode) == (128, True, "bfloat16", "bwd") for c in odd)


def test_registry_lists_the_required_providers():
    names = set(providers.REGISTRY)
    assert {"sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "flex", "fa4", "fa2",
            "xformers", "flashscope"} <= names
    assert providers.REGISTRY["fa4"].layout == "bnhd"
    assert not providers.REGISTRY["flashscope"].baseline
    with pytest.raises(FlashscopeError, match="--skip 'nope'"):
        providers.select(None, ["nope"])
    assert [p.name for p in providers.select(["sdpa-math", "fa4"], ["fa4"])] == ["sdpa-math"]
