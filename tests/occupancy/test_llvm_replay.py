"""Replay LLVM 22's occupancy readings (tests/data/occupancy/amd_llvm_readings.json, made by
scripts/occupancy_llvm_readings.py) against the calculator: every case must agree."""

import json
from pathlib import Path

from flashscope.occupancy import llvm_waves_per_simd, occupancy, unified_vgpr_count
from flashscope.targets import get_target

DATA = json.loads((Path(__file__).parents[1] / "data/occupancy/amd_llvm_readings.json")
                  .read_text())
READINGS = DATA["readings"]


def test_enough_readings_on_every_target():
    by = {(r["mcpu"], r["wave_size"]) for r in READINGS}
    assert by >= {("gfx90a", 64), ("gfx942", 64), ("gfx950", 64), ("gfx1100", 32),
                  ("gfx1100", 64), ("gfx1201", 32)}
    assert len(READINGS) >= 800


def _sgprs(r):
    return r["llvm"]["total_sgprs"] if r["sgprs_forced"] else None


def test_unified_vgpr_count_matches_llvm():
    for r in READINGS:
        t = get_target(r["mcpu"])
        ll = r["llvm"]
        expect = unified_vgpr_count(ll["vgprs"], ll["agprs"]) if t.unified_vgprs else ll["vgprs"]
        assert expect == ll["vgpr_count"], r


def test_llvm_estimate_agrees_on_every_case():
    bad = []
    for r in READINGS:
        ll = r["llvm"]
        got = llvm_waves_per_simd(get_target(r["mcpu"]), threads=r["threads"],
                                  vgprs=ll["vgpr_count"], sgprs=_sgprs(r), lds=ll["lds"],
                                  wave_size=r["wave_size"])
        if got != ll["occupancy"]:
            bad.append((r, got))
    assert not bad, bad[:5]


def test_calculator_waves_per_simd_agrees_where_packing_costs_nothing():
    """The calculator's own waves_per_simd equals LLVM's wherever the LDS size is a multiple
    of the granule and whole-workgroup packing loses no wave (see amd.py)."""
    checked = 0
    for r in READINGS:
        ll = r["llvm"]
        t = get_target(r["mcpu"])
        occ = occupancy(t, threads=r["threads"], vgprs=ll["vgpr_count"], sgprs=_sgprs(r),
                        lds=ll["lds"], wave_size=r["wave_size"])
        if ll["lds"] % t.lds_alloc_unit or occ.active_blocks == 0:
            continue
        n = occ.details["waves_per_workgroup"]
        v = occ.details["vgpr_waves_per_simd"]
        if (v * t.simds_per_unit) % n:
            continue
        checked += 1
        assert occ.waves_per_simd == ll["occupancy"], (r, occ)
    assert checked >= 700


def test_lds_readings_are_what_was_asked():
    for r in READINGS:
        assert r["llvm"]["lds"] == r["lds"] or (r["lds"] == 0 and r["llvm"]["lds"] == 0)
