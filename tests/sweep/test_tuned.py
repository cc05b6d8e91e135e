"""Tuned data files: the sweep's winners written through the one writer, the lookup the API
uses (exact entries, the 16-bit twin dtype, else the family's rule), readers that fail
closed on damaged files, and the conversion of format-1 files."""

import json

import pytest

from flashscope import TritonFwdConfig
from flashscope.errors import ArtifactError, FlashscopeError
from flashscope.families import Problem, sm90_fwd, triton_fwd
from flashscope.families.sm90_fwd import Sm90FwdConfig
from flashscope.sweep.tuned import best_entries, write_tuned
from flashscope.tuned import convert, lookup, make_entry, seq_class, write_entries


def gpu_rec(cfg, ms, shape="4,32,4096,64", causal=False, status="ok", dtype="bfloat16"):
    D = int(shape.split(",")[3])
    rec = {"kind": "gpu", "status": status, "ms": ms, "tflops": 100 / ms, "shape": shape,
           "target": "sm90", "dtype": dtype, "head_dim": D, "causal": causal,
           "config": cfg.as_dict(), "config_key": cfg.key, "search": "exhaustive"}
    if cfg.KERNEL != "triton-fwd":
        rec["kernel"] = cfg.KERNEL
    return rec


A, B, C = TritonFwdConfig(128, 64, 8, 3), TritonFwdConfig(64, 64, 4, 2), TritonFwdConfig(64, 32, 4, 3)


def P(dtype="bfloat16", d=64, causal=False, n=4096):
    return Problem("sm90", dtype, d, causal, n, n)


def test_seq_class():
    assert [seq_class(n) for n in (1, 1024, 1025, 4096, 16384, 16385)] == [
        "le1k", "le1k", "le4k", "le4k", "le16k", "gt16k"]
    with pytest.raises(FlashscopeError):
        seq_class(0)


def test_write_then_lookup(tmp_path):
    recs = [gpu_rec(A, 1.0), gpu_rec(B, 0.8), gpu_rec(C, 0.9, status="failed"),
            gpu_rec(C, 0.5, causal=True), gpu_rec(A, 0.7, causal=True)]
    paths = write_tuned(recs, tmp_path, source="test")
    assert [p.name for p in paths] == ["sm90.json"]
    cfg, tuned, src = lookup(P(), "triton-fwd", tmp_path)
    assert (cfg, tuned) == (B, True) and "sm90.json [le4k]" in src
    assert lookup(P(causal=True, n=2048), "triton-fwd", tmp_path)[:2] == (C, True)
    # the other 16-bit dtype takes the entry, and says so
    cfg, tuned, src = lookup(P("float16"), "triton-fwd", tmp_path)
    assert (cfg, tuned) == (B, True) and "from bfloat16" in src
    # another class or head dim, or another kernel: the family's rule, and it says so
    for problem, kernel in ((P(n=8192), "triton-fwd"), (P(d=128), "triton-fwd"),
                            (P(), "sm90-fwd")):
        cfg, tuned, src = lookup(problem, kernel, tmp_path)
        fam = triton_fwd if kernel == "triton-fwd" else sm90_fwd
        assert not tuned and "rule" in src and cfg == fam.select(problem)
    # no file for a target: the rule
    assert lookup(Problem("sm80", head_dim=64), "triton-fwd", tmp_path)[1] is False


def test_entries_store_only_the_knobs_off_the_defaults(tmp_path):
    write_tuned([gpu_rec(A, 1.0)], tmp_path)
    (e,) = json.loads((tmp_path / "sm90.json").read_text())["entries"]
    assert e["kernel"] == "triton-fwd" and e["config"] == {"num_warps": 8}
    g = Sm90FwdConfig(BLOCK_M=192, PINGPONG=True)
    write_entries("sm90", [make_entry(g, "bfloat16", 64, True, "le1k", ms=1.0)], tmp_path)
    assert lookup(P(causal=True, n=1000), "sm90-fwd", tmp_path)[:2] == (g, True)


def test_merge_keeps_other_entries(tmp_path):
    write_tuned([gpu_rec(A, 1.0)], tmp_path)
    write_tuned([gpu_rec(B, 1.0, causal=True)], tmp_path)
    assert lookup(P(), "triton-fwd", tmp_path)[:2] == (A, True)
    assert lookup(P(causal=True), "triton-fwd", tmp_path)[:2] == (B, True)
    with pytest.raises(FlashscopeError, match="pass --force to replace it"):
        write_tuned([gpu_rec(C, 0.1)], tmp_path)  # an entry of the same problem exists
    assert lookup(P(), "triton-fwd", tmp_path)[0] == A
    write_tuned([gpu_rec(C, 0.1)], tmp_path, force=True)
    assert lookup(P(), "triton-fwd", tmp_path)[0] == C
    assert len(json.loads((tmp_path / "sm90.json").read_text())["entries"]) == 2


def test_needs_measured_records(tmp_path):
    off = dict(gpu_rec(A, 1.0), kind="offline")
    with pytest.raises(FlashscopeError, match="no validated GPU timings"):
        write_tuned([off, gpu_rec(B, 1.0, status="failed")], tmp_path)


def test_most_evaluated_shape_wins_a_class():
    recs = [gpu_rec(A, 1.0, shape="2,32,2048,64"), gpu_rec(B, 0.5, shape="2,32,2048,64"),
            gpu_rec(C, 0.1, shape="4,32,4096,64")]
    (entry,) = best_entries(recs)["sm90"]
    assert entry["shape"] == "2,32,2048,64" and entry["config"] == B.diff()
    assert entry["evaluated"] == 2


def _file(tmp_path, entries, **top):
    data = {"format": 2, "target": "sm90", "entries": entries, **top}
    (tmp_path / "sm90.json").write_text(json.dumps(data))


GOOD = {"kernel": "triton-fwd", "dtype": "bfloat16", "head_dim": 64, "causal": False,
        "seq_class": "le4k", "config": A.diff()}


@pytest.mark.parametrize("entries,top,needle", [
    ([dict(GOOD, extra=1)], {}, "unknown ['extra']"),
    ([{k: v for k, v in GOOD.items() if k != "config"}], {}, "missing ['config']"),
    ([GOOD, GOOD], {}, "a second entry"),
    ([dict(GOOD, seq_class="huge")], {}, "seq_class 'huge'"),
    ([dict(GOOD, config=dict(BLOCK_N=256, num_stages=8), head_dim=256)], {},
     "shared memory"),
    ([dict(GOOD, config=dict(waves_per_eu=2))], {}, "AMD option"),
    ([dict(GOOD, config=dict(BLOCK_M="big"))], {}, "BLOCK_M expects an integer"),
    ([dict(GOOD, config=[1, 2])], {}, "expected an object of knobs"),
    ([dict(GOOD, kernel="fwd")], {}, "kernel 'fwd' is not one of"),
    ([dict(GOOD, kernel="sm90-fwd", config={"BLOCK_M": 96})], {}, "BLOCK_M=96"),
    ([dict(GOOD, causal="no")], {}, "causal"),
    ([GOOD], {"format": 3}, "format 3"),
    ([GOOD], {"format": 1}, "flashscope tune convert"),
    ([GOOD], {"target": "sm80"}, "does not match"),
    ("entries", {}, "entries: expected a list"),
])
def test_malformed_files_fail_closed(tmp_path, entries, top, needle):
    _file(tmp_path, entries, **top)
    with pytest.raises(ArtifactError) as e:
        lookup(P(), "triton-fwd", tmp_path)
    assert needle in str(e.value) and "sm90.json" in str(e.value)


def test_bad_json_fails_closed(tmp_path):
    (tmp_path / "sm90.json").write_text("{")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        lookup(P(d=128, causal=True, n=100), "triton-fwd", tmp_path)
    (tmp_path / "sm90.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ArtifactError, match="sm90.json"):
        lookup(P(), "triton-fwd", tmp_path)


V1_GLUON = {"BLOCK_M": 192, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3,
            "Q_IN_REGS": False, "maxnreg": None, "waves_per_eu": None, "TMA": True,
            "WARP_SPEC": False, "EXP2_POLY": 0, "OVERLAP": 2, "GLUON": True,
            "PERSISTENT": True, "PINGPONG": True, "LAZY_RESCALE": False, "EARLY_Q": False,
            "K_EARLY": False, "MASKED_FIRST": True, "OUT_RCP": False, "BALANCE": False}


def test_format_1_files_convert():
    v1 = {"format": 1, "target": "sm90", "entries": [
        {"dtype": "bfloat16", "head_dim": 64, "causal": False, "seq_class": "le16k",
         "config": V1_GLUON, "ms": 4.0},
        {"dtype": "float16", "head_dim": 80, "causal": True, "seq_class": "le1k",
         "config": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}}]}
    out = convert(v1, "old.json")
    g, t = out["entries"]
    assert g["kernel"] == "sm90-fwd" and g["ms"] == 4.0
    assert Sm90FwdConfig.from_dict(g["config"]) == Sm90FwdConfig(
        BLOCK_M=192, num_stages=3, Q_IN_REGS=False, PINGPONG=True, LAZY_RESCALE=False,
        EARLY_Q=False, K_EARLY=False, OUT_RCP=False)
    assert t["kernel"] == "triton-fwd" and t["config"] == {"BLOCK_M": 64, "num_stages": 2}


@pytest.mark.parametrize("change,needle", [
    ({"JOINT_KV": True}, "JOINT_KV=True is a switch no kernel has"),
    ({"OVERLAP": 1}, "OVERLAP=1: the sm90 kernel now always runs OVERLAP=2"),
    ({"PERSISTENT": False}, "PERSISTENT=False"),
    ({"EXP2_POLY": 4}, "EXP2_POLY=4"),
])
def test_dropped_switches_do_not_convert(change, needle):
    v1 = {"format": 1, "target": "sm90", "entries": [
        {"dtype": "bfloat16", "head_dim": 64, "causal": False, "seq_class": "le16k",
         "config": dict(V1_GLUON, **change)}]}
    with pytest.raises(ArtifactError, match=needle):
        convert(v1, "old.json")


def test_packaged_files_load():
    """Whatever tuned files ship must parse, and every entry must be found by lookup."""
    from flashscope.tuned import DATA_DIR, SEQ_CLASSES, load_tuned

    files = sorted(DATA_DIR.glob("*.json"))
    assert files, "the sm90 entries ship with the package"
    largest = {c: b or 65536 for c, b in SEQ_CLASSES}  # an entry without a shape: its class
    for path in files:
        for (kernel, dtype, hd, causal, cls), (cfg, e) in load_tuned(path.stem).items():
            n = int(e["shape"].split(",")[2]) if "shape" in e else largest[cls]
            problem = Problem(path.stem, dtype, hd, causal, n, n)
            assert lookup(problem, kernel) == (cfg, True, f"{path.name} [{cls}]")
