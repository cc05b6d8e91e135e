"""The ground-truth comparisons, on synthetic inputs and (once committed) on the recorded
H100 runs under tests/data/isa/groundtruth/."""

import json
from pathlib import Path

import pytest

from flashscope.errors import ParseError
from flashscope.isa.groundtruth import compare_launch, compare_ncu

RECORDED = Path(__file__).resolve().parents[1] / "data" / "isa" / "groundtruth"

OFF = {"registers": 176, "static_shared_bytes": 1024, "dynamic_shared_bytes": 131072,
       "local_bytes": 0, "threads": 256}

NCU = '''==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python","h","_attn_fwd","1","7","(256, 1, 1)","(8, 32, 1)","0","9.0","Command line profiler metrics","launch__block_size","","256"
"0","1","python","h","_attn_fwd","1","7","(256, 1, 1)","(8, 32, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","176"
"0","1","python","h","_attn_fwd","1","7","(256, 1, 1)","(8, 32, 1)","0","9.0","Command line profiler metrics","launch__shared_mem_per_block_dynamic","byte","131,072"
"0","1","python","h","_attn_fwd","1","7","(256, 1, 1)","(8, 32, 1)","0","9.0","Command line profiler metrics","launch__shared_mem_per_block_static","byte","{static}"
'''


def test_compare_ncu_equal_and_not():
    order = {"rows": [{"config": "m128n64w8s3q1", "offline": OFF}]}
    rows = compare_ncu(order, NCU.format(static=1024))
    assert len(rows) == 4 and all(r["equal"] for r in rows)
    rows = compare_ncu(order, NCU.format(static=0))
    assert [r["field"] for r in rows if not r["equal"]] == ["static_shared_bytes"]
    with pytest.raises(ParseError, match="1 _attn_fwd launches, expected 2"):
        compare_ncu({"rows": order["rows"] * 2}, NCU.format(static=1024))


def test_compare_launch():
    doc = {"rows": [{"config": "c", "offline": OFF,
                     "launched": {"n_regs": 176, "n_spills": 0, "shared": 131072}}]}
    assert all(r["equal"] for r in compare_launch(doc))
    doc["rows"][0]["launched"]["n_spills"] = 2  # n_spills = local bytes / 4 -> 8 bytes
    assert [r["field"] for r in compare_launch(doc) if not r["equal"]] == ["local_bytes"]


@pytest.mark.skipif(not (RECORDED / "inspect_groundtruth.json").exists(),
                    reason="no recorded H100 run committed yet")
def test_recorded_launches_equal_offline():
    doc = json.loads((RECORDED / "inspect_groundtruth.json").read_text())
    assert len(doc["rows"]) >= 6
    bad = [r for r in compare_launch(doc) if not r["equal"]]
    assert not bad, bad


@pytest.mark.skipif(not (RECORDED / "ncu.csv").exists(),
                    reason="no recorded ncu run committed yet")
def test_recorded_ncu_equal_offline():
    order = json.loads((RECORDED / "ncu_order.json").read_text())
    bad = [r for r in compare_ncu(order, (RECORDED / "ncu.csv").read_text()) if not r["equal"]]
    assert not bad, bad
