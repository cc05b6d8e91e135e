"""The ground-truth comparisons, on synthetic inputs and on the recorded H100 run under
tests/data/isa/groundtruth/ (see its README): the recorded cubins are re-read with the
current reader and compared with what the launch and Nsight Compute reported."""

import gzip
import json
from pathlib import Path

import pytest

from flashscope.errors import ParseError
from flashscope.isa import nvidia
from flashscope.isa.groundtruth import (PROBE_STATIC_BYTES, compare_launch, compare_ncu,
                                        probe_cubin, with_offline)

RECORDED = Path(__file__).resolve().parents[1] / "data" / "isa" / "groundtruth"

OFF = {"registers": 176, "static_shared_bytes": 0, "dynamic_shared_bytes": 131072,
       "reserved_shared_bytes": 1024, "local_bytes": 0, "threads": 256}

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"\n')
LINE = ('"0","1","python","h","_attn_fwd","1","7","(256, 1, 1)","(8, 32, 1)","0","9.0",'
        '"Command line profiler metrics","{}","{}","{}"\n')
NCU = HEAD + "".join(LINE.format(*m) for m in (
    ("launch__block_size", "", "256"),
    ("launch__registers_per_thread", "register/thread", "176"),
    ("launch__shared_mem_per_block_dynamic", "byte/block", "131,072"),
    ("launch__shared_mem_per_block_static", "byte/block", "{static}")))
DRIVER = LINE.format("launch__shared_mem_per_block_driver", "byte/block", "1,024")


def test_compare_ncu_equal_and_not():
    order = {"rows": [{"config": "m128n64w8s3q1", "offline": OFF}]}
    rows = compare_ncu(order, NCU.format(static=0) + DRIVER)
    assert len(rows) == 5 and all(r["equal"] is True for r in rows)
    rows = compare_ncu(order, NCU.format(static=1024) + DRIVER)
    assert [r["field"] for r in rows if r["equal"] is False] == ["static_shared_bytes"]
    with pytest.raises(ParseError, match="1 _attn_fwd launches, expected 2"):
        compare_ncu({"rows": order["rows"] * 2}, NCU.format(static=0))


def test_compare_ncu_optional_metric_missing_is_unchecked_required_is_unequal():
    order = {"rows": [{"config": "c", "offline": OFF}]}
    rows = {r["source"]: r for r in compare_ncu(order, NCU.format(static=0))}
    assert rows["launch__shared_mem_per_block_driver"]["equal"] is None
    text = "".join(x for x in NCU.format(static=0).splitlines(keepends=True)
                   if "block_size" not in x)
    rows = {r["source"]: r for r in compare_ncu(order, text)}
    assert rows["launch__block_size"]["equal"] is False


def test_compare_launch():
    doc = {"rows": [{"config": "c", "offline": OFF,
                     "launched": {"n_regs": 176, "n_spills": 0, "shared": 131072}}]}
    assert [r["equal"] for r in compare_launch(doc)] == [True, True, True]
    doc["rows"][0]["launched"]["n_spills"] = 2  # n_spills = local bytes / 4 -> 8 bytes
    assert [r["field"] for r in compare_launch(doc) if not r["equal"]] == ["local_bytes"]
    doc["rows"][0]["launched"].update(n_spills=0, func_num_regs=176, func_shared_size_bytes=0,
                                      func_local_size_bytes=0,
                                      device_reserved_shared_per_block=1024)
    rows = compare_launch(doc)
    assert len(rows) == 7 and all(r["equal"] is True for r in rows)
    doc["rows"][0]["launched"]["func_shared_size_bytes"] = 1024
    assert [r["source"] for r in compare_launch(doc) if not r["equal"]] == \
        ["func_shared_size_bytes"]
    del doc["rows"][0]["launched"]["n_regs"]  # a required value missing is never a pass
    assert [r["equal"] for r in compare_launch(doc)][0] is False


@pytest.mark.parametrize("arch, reserved", [("sm_90a", 1024), ("sm_80", 0)])
def test_probe_static_shared_excludes_the_system_window(arch, reserved):
    """ptxas counts the 1 KB system window in .nv.shared.<k> on sm_90 (cuobjdump SHARED =
    1280 for 256 declared bytes), not on sm_80; the reader reports it apart."""
    cubin = probe_cubin(arch)
    (rec,) = nvidia.read_cubin(cubin, arch, sass="")
    assert rec["static_shared_bytes"] == PROBE_STATIC_BYTES
    assert rec["reserved_shared_bytes"] == reserved
    assert nvidia.resource_usage(cubin)["probe"]["SHARED"] == PROBE_STATIC_BYTES + reserved


def _recorded_offline(doc):
    """{(config, head_dim, causal): fields} re-read now from the recorded sm90 cubins (ELF
    only); the dynamic shared size is Triton's metadata, kept from the recording."""
    out = {}
    for r in doc["rows"]:
        name = f"{r['config']}_d{r['head_dim']}{'_causal' if r['causal'] else ''}.cubin.gz"
        (k,) = nvidia.read_cubin(gzip.decompress((RECORDED / "cubins" / name).read_bytes()),
                                 name, sass="")
        out[r["config"], r["head_dim"], r["causal"]] = {
            f: k[f] for f in ("registers", "static_shared_bytes", "reserved_shared_bytes",
                              "local_bytes", "threads")}
    return out


def test_recorded_cubins_have_the_system_window():
    doc = json.loads((RECORDED / "ncu_order.json").read_text())
    offline = _recorded_offline(doc)
    assert len(offline) == 8
    for key, rec in offline.items():
        assert (rec["static_shared_bytes"], rec["reserved_shared_bytes"]) == (0, 1024), key
    # the recording's own offline reading agrees (reader with the window split out)
    assert {r["offline"]["static_shared_bytes"] for r in doc["rows"]} == {0}
    assert {r["offline"]["reserved_shared_bytes"] for r in doc["rows"]} == {1024}


def test_recorded_launches_equal_offline():
    doc = json.loads((RECORDED / "inspect_groundtruth.json").read_text())
    assert len(doc["rows"]) == 8 and doc["device"] == "NVIDIA H100 80GB HBM3"
    rows = compare_launch(with_offline(doc, _recorded_offline(doc)))
    # 8 configs x (n_regs, n_spills, shared, and the driver's NUM_REGS, SHARED_SIZE_BYTES,
    # LOCAL_SIZE_BYTES, reserved shared per block)
    assert len(rows) == 56 and all(r["equal"] is True for r in rows), \
        [r for r in rows if not r["equal"]]


def test_recorded_driver_probe_counts_declared_static_only():
    """A probe kernel declaring 256 bytes of static shared memory: ptxas's sm_90 section is
    1280 bytes (with the 1 KB system window); the driver's CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
    says 256, as the reader does."""
    probe = json.loads((RECORDED / "inspect_groundtruth.json").read_text())["static_probe"]
    assert probe["cuda_rc"] == 0
    assert probe["elf_section_bytes"] == probe["declared_static_bytes"] + 1024
    assert probe["driver_shared_size_bytes"] == probe["offline_static_shared_bytes"] == \
        probe["declared_static_bytes"]


def test_recorded_ncu_equal_offline():
    order = json.loads((RECORDED / "ncu_order.json").read_text())
    text = (RECORDED / "ncu.csv").read_text()
    for offline in (order, with_offline(order, _recorded_offline(order))):
        rows = compare_ncu(offline, text)
        # 8 configs x (registers, static, dynamic, driver shared, block size), all checked
        assert len(rows) == 40 and all(r["equal"] is True for r in rows), \
            [r for r in rows if r["equal"] is not True]


def test_occupancy_adds_the_reserve_once_like_ncu():
    """The 8 kernels profiled on the H100 (tests/data/profile/ncu_*.csv): a record holding
    ncu's registers, block size and static + dynamic shared (the reserve not included)
    gives ncu's register limit, its shared-memory limit (against the carveout the driver
    configures: details["launch_shared_mem_limit"]) and theoretical occupancy. cuDNN's
    232,448 dynamic bytes (the sm90 opt-in maximum) fit one block only if the 1 KB reserve
    is added once; counted in the static size as well, the block would not fit at all."""
    from flashscope.errors import FlashscopeError
    from flashscope.isa.record import KernelRecord
    from flashscope.occupancy import occupancy_for_record
    from flashscope.profile.ncu_csv import read_ncu_csv

    files = sorted((RECORDED.parents[1] / "profile").glob("ncu_0*.csv"))
    assert len(files) == 8
    for f in files:
        (k,) = read_ncu_csv(f)
        rec = KernelRecord(kernel=k.name, target="sm90", vendor="nvidia",
                           registers=int(k.get("registers")), threads=int(k.get("block_size")),
                           wave_size=32, reserved_shared_bytes=int(k.get("smem_driver")),
                           shared_bytes=int(k.get("smem_static") + k.get("smem_dynamic")))
        res = occupancy_for_record(rec)
        assert res.details["smem_per_block"] == 128 * -(-(rec.shared_bytes + 1024) // 128)
        occ = res.as_dict()
        assert (occ["limits"]["registers"], res.details["launch_shared_mem_limit"]) == (
            k.get("limit_registers"), k.get("limit_shared_mem")), f.name
        assert 100 * occ["occupancy"] == pytest.approx(k.get("theoretical_occupancy"),
                                                       abs=0.005), f.name
        if f.name.endswith("cudnn.csv"):
            rec.shared_bytes += rec.reserved_shared_bytes
            with pytest.raises(FlashscopeError):
                occupancy_for_record(rec)
