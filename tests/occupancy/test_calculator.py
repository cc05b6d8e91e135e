"""Hand-checked cases, bad input, cannot-launch, cliffs, records, CLI."""

import json
from types import SimpleNamespace

import pytest

from flashscope.cli import main
from flashscope.errors import FlashscopeError
from flashscope.occupancy import occupancy, occupancy_for_record, unified_vgpr_count


@pytest.mark.parametrize("regs,threads,blocks", [(40, 64, 24), (80, 32, 24), (96, 32, 20),
                                                 (104, 32, 16), (128, 256, 2), (32, 1024, 2)])
def test_nvidia_subpartition_rounding(regs, threads, blocks):
    assert occupancy("sm90", threads=threads, regs=regs).active_blocks == blocks


def test_nvidia_smem_reserve_and_carveout():
    o = occupancy("sm90", threads=128, regs=32, smem=0)
    assert o.details["smem_per_block"] == 1024 and o.limits["shared_mem"] == 228
    o = occupancy("sm90", threads=256, regs=128, smem=52224)
    assert o.limits == {"registers": 2, "shared_mem": 4, "warps": 8, "blocks": 32}
    assert o.details["launch_carveout"] == 132 * 1024
    assert o.details["launch_shared_mem_limit"] == 2
    o = occupancy("sm90", threads=384, regs=168, smem=232448)
    assert (o.active_blocks, o.limiter, o.occupancy) == (1, ("registers", "shared_mem"), 0.1875)


def test_nvidia_cannot_launch_reports_zero_with_reason():
    o = occupancy("sm90", threads=1024, regs=255)
    assert o.active_blocks == 0 and o.occupancy == 0 and "register file" in o.reason


def test_amd_cases():
    o = occupancy("gfx942", threads=256, vgprs=192, lds=32768)
    assert (o.active_blocks, o.waves_per_simd, o.limiter) == (2, 2, ("vgprs", "lds"))
    o = occupancy("gfx942", threads=1024, vgprs=192)
    assert o.active_blocks == 0 and "16 waves" in o.reason
    o = occupancy("gfx1100", threads=256, vgprs=100)
    assert (o.active_blocks, o.waves_per_simd, o.occupancy) == (6, 12, 0.75)
    o = occupancy("gfx1100", threads=64, vgprs=96, wave_size=64)
    assert o.details["vgpr_waves_per_simd"] == 8
    assert unified_vgpr_count(50, 20) == 72 and unified_vgpr_count(50) == 50


def test_cliffs_exact():
    c = occupancy("sm90", threads=32, regs=104).cliffs["registers"]
    assert c == {"save_to_gain": 8, "room_before_loss": 24}
    c = occupancy("sm90", threads=64, regs=40).cliffs["registers"]
    assert c == {"save_to_gain": 8, "room_before_loss": 0}
    c = occupancy("gfx942", threads=256, vgprs=100).cliffs["registers"]
    assert c == {"save_to_gain": 4, "room_before_loss": 28}


@pytest.mark.parametrize("target,kw,msg", [
    ("sm91", dict(threads=64, regs=32), "unknown target"),
    ("sm90", dict(threads=0, regs=32), "threads=0"),
    ("sm90", dict(threads=1025, regs=32), "at most 1024"),
    ("sm90", dict(threads=64, regs=256), "at most 255"),
    ("sm90", dict(threads=64, regs=-1), "regs=-1"),
    ("sm90", dict(threads=64, regs=32, smem=232449), "232448"),
    ("sm90", dict(threads=64), "regs"),
    ("sm90", dict(threads=64, regs=32, vgprs=8), "AMD inputs"),
    ("gfx942", dict(threads=64, vgprs=513), "at most 512"),
    ("gfx1100", dict(threads=64, vgprs=257), "at most 256"),
    ("gfx942", dict(threads=64, vgprs=64, lds=65537), "65536"),
    ("gfx942", dict(threads=64, vgprs=64, wave_size=32), "wave_size=32"),
    ("gfx942", dict(threads=64, vgprs=64, agprs=300), "agprs=300"),
    ("gfx942", dict(threads=64, regs=64), "NVIDIA inputs"),
])
def test_bad_input(target, kw, msg):
    with pytest.raises(FlashscopeError, match=msg):
        occupancy(target, **kw)


def test_record():
    rec = SimpleNamespace(target="gfx942", registers=192, agprs=0, sgprs=40,
                          shared_bytes=32768, threads=256, wave_size=64)
    assert occupancy_for_record(rec).active_blocks == 2
    rec = SimpleNamespace(target="sm90", registers=128, agprs=None, sgprs=None,
                          shared_bytes=52224, threads=256, wave_size=32)
    assert occupancy_for_record(rec).as_dict()["active_blocks"] == 2


def test_cli_json_and_error(capsys, tmp_path):
    assert main(["occupancy", "--target", "gfx942", "--vgprs", "192", "--threads", "256",
                 "--lds", "32768", "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)  # one result per --target
    assert set(d) == {"target", "active_blocks", "active_warps", "occupancy", "limiter",
                      "limits", "cliffs", "waves_per_simd"}
    assert main(["occupancy", "--target", "sm90", "--regs", "300", "--threads", "64"]) == 2
    assert "at most 255" in capsys.readouterr().err
    png = tmp_path / "s.png"
    assert main(["occupancy", "--target", "sm90", "--regs", "168", "--threads", "384",
                 "--smem", "232448", "--plot", str(png), "--json"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_targets(capsys):
    assert main(["targets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"sm90", "gfx942", "gfx1100"}
    assert all(r["triton_compiles"] for r in rows)
