"""Cells and variant specs (flashscope.tune.cells, flashscope.tune.variants): parsing,
resolution against the problem's default, refusal by name."""

import pytest

from flashscope.errors import FlashscopeError
from flashscope.families import Problem, sm90_fwd, triton_fwd
from flashscope.tuned import lookup, make_entry, write_entries
from flashscope.tune.batch import cell_specs, parse_extra
from flashscope.tune.cells import parse_cell, parse_cells, problem, shape_cell
from flashscope.tune.variants import default_config, parse_variants, resolve


def test_suite_cells_are_the_standard_suite():
    c = parse_cell("d64c1k")
    assert (c.case.B, c.case.H, c.case.Nq, c.case.Nk, c.case.D, c.case.causal) == \
        (16, 32, 1024, 1024, 64, True)
    assert parse_cell("d128n16k").case.shape == "1,16,16384,128"


def test_shape_cells_round_trip_their_names():
    c = shape_cell("1,32,128,64,16384", False)
    assert c.name == "1x32x128x64x16384n" and parse_cell(c.name).case == c.case
    g = parse_cell("2x8x100x128x100x2c", "float16")
    assert (g.case.Hkv, g.case.dtype, g.case.causal) == (2, "float16", True)
    assert problem(g, "sm90") == Problem("sm90", "float16", 128, True, 100, 100, 16)


@pytest.mark.parametrize("text,msg", [
    ("64c1k", "expected d<D><c|n><N>k"), ("d64c32k", "N in 1k..16k"),
    ("d96c1k", "D dividing 2048"), ("1x2x3c", "expected d<D>"),
    ("1x2x64x16x32c", "causal with Nq != Nk"), ("1x3x64x16x64x2n", "Hkv = 2 must divide"),
])
def test_bad_cells_are_refused_with_the_forms(text, msg):
    with pytest.raises(FlashscopeError, match=msg):
        parse_cell(text)


def test_cell_lists_refuse_repeats_and_empties():
    assert [c.name for c in parse_cells("d64c1k, d128n4k")] == ["d64c1k", "d128n4k"]
    with pytest.raises(FlashscopeError, match="d64c1k given twice"):
        parse_cells("d64c1k,d64c1k")
    with pytest.raises(FlashscopeError, match="expected a comma-separated list"):
        parse_cells(" , ")


def test_variant_lists_keep_order_and_refuse_repeats():
    assert list(parse_variants("d=+; b=+BALANCE=1 ;n=cudnn;")) == ["d", "b", "n"]
    with pytest.raises(FlashscopeError, match="'d' names two variants"):
        parse_variants("d=+;d=+BALANCE=1")
    with pytest.raises(FlashscopeError, match="expected NAME=SPEC, got 'cudnn'"):
        parse_variants("cudnn")
    with pytest.raises(FlashscopeError, match="variant name 'a b'"):
        parse_variants("a b=+")


D64 = Problem("sm90", "bfloat16", 64, False, 4096, 4096, 128)


def test_plus_is_the_problems_default_and_reads_the_given_tuned_folder(tmp_path):
    assert resolve("d", "+", D64).config == lookup(D64, "sm90-fwd")[0]
    assert resolve("d", "+", D64, data_dir=tmp_path).config == sm90_fwd.select(D64)
    mine = sm90_fwd.Sm90FwdConfig(BLOCK_M=64, num_stages=4)
    write_entries("sm90", [make_entry(mine, "bfloat16", 64, False, "le4k")], tmp_path)
    v = resolve("b", "+EARLY_Q=0", D64, data_dir=tmp_path)
    assert v.config == mine.replace(EARLY_Q=False) and v.provider == "flashscope"
    assert v.identity == f"sm90-fwd:{v.config.key}"


def test_family_specs_and_the_interpreter_default():
    v = resolve("t", "triton-fwd:num_warps=4", D64)
    assert v.config == triton_fwd.select(D64).replace(num_warps=4)
    assert resolve("d", "+", D64, interpreter=True).config == triton_fwd.select(D64)
    assert default_config(D64, interpreter=True).KERNEL == "triton-fwd"


def test_peers_are_bench_providers():
    assert resolve("n", "cudnn", D64).provider == "sdpa-cudnn"
    assert resolve("f", "fa4", D64).provider == "fa4"
    m = resolve("m", "sdpa-math", D64)
    assert m.config is None and m.identity is None and m.as_dict()["provider"] == "sdpa-math"


@pytest.mark.parametrize("spec,msg", [
    ("+BLOCK_M=96", "variant b=\\+BLOCK_M=96: sm90-fwd: BLOCK_M=96: expected 64 or 128 or 192"),
    ("+num_warps=8", "variant b=\\+num_warps=8: sm90-fwd config: unknown key"),
    ("BLOCK_M=64", "expected \\+K=V,..., FAMILY:K=V"),
    ("flashscope", "expected \\+K=V"),
    ("bogus-fwd:BLOCK_M=64", "expected \\+K=V"),
    ("sm90-fwd:BLOCK_M=64,num_stages=9", "num_stages=9: expected 2 or 3 or 4"),
])
def test_bad_specs_are_refused_by_the_variants_name(spec, msg):
    with pytest.raises(FlashscopeError, match=msg):
        resolve("b", spec, D64)


def test_cell_variant_lists():
    cell = parse_cell("d64n4k")
    specs = cell_specs(cell, "sm90", common={"q": "+Q_IN_REGS=1"}, extra={"e": "+BALANCE=0"},
                       peers=("cudnn", "fa4"))
    assert specs == {"d": "+", "q": "+Q_IN_REGS=1", "e": "+BALANCE=0", "n": "cudnn",
                     "f": "fa4"}
    full = cell_specs(cell, "sm90", neighbours=True, transplants=True, peers=())
    assert "pingpong0" in full and any(n.startswith("xc") for n in full)
    with pytest.raises(FlashscopeError, match="d64n4k: variant name 'd' from --variants is "
                                              "taken by the default"):
        cell_specs(cell, "sm90", common={"d": "+BALANCE=0"})
    with pytest.raises(FlashscopeError, match="'n' from --peers is taken by --extra"):
        cell_specs(cell, "sm90", extra={"n": "+BALANCE=0"})
    with pytest.raises(FlashscopeError, match="--peers 'flash'"):
        cell_specs(cell, "sm90", peers=("flash",))


def test_extra_variants_name_their_cell():
    cells = parse_cells("d64n4k,d128c1k")
    assert parse_extra("d64n4k:a=+BALANCE=0;d64n4k:b=+PINGPONG=0;d128c1k:a=+", cells) == {
        "d64n4k": {"a": "+BALANCE=0", "b": "+PINGPONG=0"}, "d128c1k": {"a": "+"}}
    with pytest.raises(FlashscopeError, match="CELL one of --cells"):
        parse_extra("d64n16k:a=+", cells)
    with pytest.raises(FlashscopeError, match="d64n4k names 'a' twice"):
        parse_extra("d64n4k:a=+;d64n4k:a=+BALANCE=0", cells)
