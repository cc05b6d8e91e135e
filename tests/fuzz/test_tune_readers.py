"""The tuner's readers (flashscope.tune) fed 1,000 damaged files each, as test_readers.py
does for the others: an A/B result and an ncu source page either read, with every number
finite, or end in a FlashscopeError."""

import json
import math
from pathlib import Path

from .damage import damage_csv, damage_json
from .test_readers import fuzz

DATA = Path(__file__).parents[1] / "data" / "tune"


def test_ab_results():
    from flashscope.tune.results import read_result

    doc = json.loads((DATA / "balance-30" / "d64n16k.json").read_text())

    def check(res):
        bad = [t for ts in res.times.values() for t in ts if not (math.isfinite(t) and t > 0)]
        return f"times {bad[:3]}" if bad else None

    fuzz("tune A/B result", lambda rng: damage_json(doc, rng), read_result, check)


def test_ncu_source_pages():
    from flashscope.tune.sass import opcode_mix, read_source

    rows = [["Address", "Source", "Warp Stall Sampling (All Samples)",
             "Instructions Executed", "stall_wait", "stall_barrier"],
            ["0x10", "@!P0 BRA 0x40", "12", "2112", "10", "2"],
            ["0x20", "FADD.FTZ R1, R2, R3", "3", "4224", "1", "2"],
            ["0x30", "MUFU.EX2 R1, R1", "5", "4224", "5", "0"],
            ["0x40", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24", "1", "128", "0", "1"]]

    def read(path):
        return opcode_mix(read_source(path))

    def check(mix):
        bad = [(v, k) for v, k in mix if not math.isfinite(v)]
        return f"counts {bad[:3]}" if bad else None

    fuzz("ncu source page", lambda rng: damage_csv(rows, rng, '"Kernel Name","k",\n'), read,
         check, suffix=".csv")
