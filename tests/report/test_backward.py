"""The backward report on a tiny spec (sm90 + gfx942, head dim 32, BLOCK_M1 ablation): the
plan, the records against the binaries, the files, bad input."""

import json

import pytest

from flashscope.cli import main
from flashscope import TritonBwdConfig
from flashscope.families import Problem, triton_bwd


def select_bwd_config(head_dim, target):
    from flashscope.targets import get_target

    return triton_bwd.select(Problem(get_target(target).name, "bfloat16", head_dim))
from flashscope.errors import FlashscopeError
from flashscope.isa import inspect_config
from flashscope.report.backward import BwdSpec, make_bwd_spec, plan, uses
from flashscope.targets import parse_targets


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("bwd") / "r"
    assert main(["report", "--kernel", "bwd", "--targets", "sm90,gfx942", "--head-dims", "32",
                 "--ablate", "BLOCK_M1", "--out", str(out), "--jobs", "2"]) == 0
    return out, json.loads((out / "report.json").read_text())


def test_tile_knobs_apply_to_their_kernel_only():
    assert uses("bwd_dkdv", "BLOCK_M1") and not uses("bwd_dq", "BLOCK_M1")
    assert uses("bwd_dq", "BLOCK_N2") and not uses("bwd_dkdv", "BLOCK_N2")
    assert uses("bwd_dq", "num_warps") and uses("bwd_dkdv", "num_warps")
    spec = BwdSpec(tuple(parse_targets("sm90")), 32, knobs=("BLOCK_M1", "BLOCK_N2"))
    assert [s.name for s in plan(spec, spec.targets[0], "bwd_dkdv")] == [
        "BLOCK_M1 halved", "BLOCK_M1 doubled"]
    assert [s.name for s in plan(spec, spec.targets[0], "bwd_dq")] == [
        "BLOCK_N2 halved", "BLOCK_N2 doubled"]


def test_unbuildable_variant_is_kept_without_a_config():
    spec = BwdSpec(tuple(parse_targets("gfx942")), 256, knobs=("BLOCK_M1",))
    t = spec.targets[0]
    base = select_bwd_config(256, t)
    assert base.BLOCK_M1 == 16  # halving gives 8: below the 16 the checks allow
    halved, doubled = plan(spec, t, "bwd_dkdv")
    assert halved.after is None and doubled.after == base.replace(BLOCK_M1=32)


def test_rows_match_the_binaries(written):
    _, data = written
    assert data["kernel"] == "bwd" and "measured only" in data["model"]
    rows = {(r["kernel"], r["target"], r["config"]): r for r in data["rows"]}
    # per target: dK/dV base + M1 halved + doubled, dQ base only
    assert data["timings"]["kernels"] == len(rows) == 8
    for t in ("sm90", "gfx942"):
        base = select_bwd_config(32, t)
        assert data["spec"]["base"][t] == base.label
        for kernel in ("bwd_dkdv", "bwd_dq"):
            rec = inspect_config(base, t, kernel=kernel, head_dim=32)
            row = rows[(kernel, t, base.label)]
            assert row["error"] is None
            assert row["measured"]["registers"] == rec.registers > 0
            assert row["measured"]["shared_bytes"] == rec.shared_bytes
            assert row["measured"]["wgmma_serialized"] == rec.wgmma_serialized
            assert 0 < row["occupancy"]["occupancy"] <= 1


def test_ablation_deltas_are_the_row_differences(written):
    _, data = written
    rows = {(r["kernel"], r["target"], r["config"]): r for r in data["rows"]}
    steps = [a for a in data["ablations"] if a["kernel"] == "bwd_dkdv"]
    assert [a["name"] for a in steps] == ["BLOCK_M1 halved", "BLOCK_M1 doubled"]
    assert not [a for a in data["ablations"] if a["kernel"] == "bwd_dq"]
    for a in steps:
        for t, e in a["targets"].items():
            before = rows[("bwd_dkdv", t, e["config_before"])]["measured"]["registers"]
            after = rows[("bwd_dkdv", t, e["config_after"])]["measured"]["registers"]
            assert e["d_registers"] == after - before
            lanes = 64 if t == "gfx942" else 32
            assert e["d_file_bytes_per_wave"] == (after - before) * lanes * 4
    doubled = steps[1]["targets"]
    assert all(e["d_registers"] > 0 for e in doubled.values())  # a larger streamed tile


def test_files_written(written):
    out, data = written
    for name in ("report.json", "report.html", "bwd_registers.png", "staircase.png"):
        assert (out / name).stat().st_size > 0
    html = (out / "report.html").read_text()
    assert "dK/dV" in html and "measured only" in html.lower()
    assert "<script>" in html and "<script src" not in html  # sorting, inline
    assert all(c["kernel"] in ("bwd_dkdv", "bwd_dq") for c in data["cliffs"])


@pytest.mark.parametrize("argv, needle", [
    (["--configs", "x.json"], "--configs applies to --kernel fwd"),
    (["--head-dims", "64,128"], "takes one head dim"),
    (["--ablate", "BLOCK_M"], "--ablate 'block_m'"),
    (["--targets", "sm99"], "sm99"),
])
def test_bad_arguments(tmp_path, capsys, argv, needle):
    code = main(["report", "--kernel", "bwd", "--out", str(tmp_path / "o"), *argv])
    assert code == 2
    assert needle in capsys.readouterr().err


def test_spec_defaults():
    spec = make_bwd_spec("sm90")
    assert spec.head_dim == 128 and "HEAD_DIM" in spec.knobs and "Q_IN_REGS" not in spec.knobs
    with pytest.raises(FlashscopeError):
        make_bwd_spec("sm90", ablate="Q_IN_REGS")
    assert isinstance(select_bwd_config(128, "sm90"), TritonBwdConfig)


def test_spill_cell_names_serialized_wgmma_and_narrow_loads():
    """The spill cell adds the wgmma ptxas serialized and, for a kernel reading narrow
    (8 or more 16-bit global loads, a quarter of its loads), their count."""
    from flashscope.isa.record import KernelRecord
    from flashscope.report.collect import Row

    def row(serial, stores=0, widths=None):
        rec = KernelRecord("k", "sm90", "nvidia", spill_stores=stores, spill_loads=0,
                           wgmma_serialized=serial, global_widths=widths)
        return Row(TritonBwdConfig(), 128, "sm90", rec)

    assert row(32).spill_cell == "0 (32 wgmma serial)"
    assert row(0, stores=3).spill_cell == "3" and row(None).spill_cell == "0"
    assert Row(TritonBwdConfig(), 128, "sm90").spill_cell == "0"
    assert row(4, widths={"load.b16": 256, "store.b32": 1}).spill_cell == (
        "0 (4 wgmma serial, 256 16-bit loads)")
    assert row(0, widths={"load.b16": 8, "load.b128": 24}).spill_cell == "0 (8 16-bit loads)"
    assert row(0, widths={"load.b16": 8, "load.b128": 25}).spill_cell == "0"
    assert row(0, widths={"load.b16": 7}).spill_cell == "0"
