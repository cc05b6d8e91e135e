import json

import pytest

from flashscope.config import AttentionConfig, select_config
from flashscope.errors import ArtifactError, FlashscopeError
from flashscope.sweep.tuned import best_entries, write_tuned
from flashscope.tuned import lookup, seq_class


def gpu_rec(cfg, ms, shape="4,32,4096,64", causal=False, status="ok", dtype="bfloat16"):
    D = int(shape.split(",")[3])
    return {"kind": "gpu", "status": status, "ms": ms, "tflops": 100 / ms, "shape": shape,
            "target": "sm90", "dtype": dtype, "head_dim": D, "causal": causal,
            "config": cfg.as_dict(), "config_key": cfg.key, "search": "exhaustive"}


A, B, C = AttentionConfig(128, 64, 8, 3), AttentionConfig(64, 64, 4, 2), AttentionConfig(64, 32, 4, 3)


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
    cfg, tuned, src = lookup("sm90", "bfloat16", 64, False, 4096, tmp_path)
    assert (cfg, tuned) == (B, True) and "sm90.json [le4k]" in src
    assert lookup("sm90", "bfloat16", 64, True, 2048, tmp_path)[:2] == (C, True)
    # another class, head dim or dtype: the defaults, and it says so
    for args in (("bfloat16", 64, False, 8192), ("bfloat16", 128, False, 4096),
                 ("float16", 64, False, 4096)):
        cfg, tuned, src = lookup("sm90", *args[:3], args[3], tmp_path)
        assert not tuned and src.startswith("defaults")
        assert cfg == select_config(args[1], args[0], args[2], "sm90")
    # no file for a target: defaults
    assert lookup("sm80", "bfloat16", 64, False, 4096, tmp_path)[1] is False


def test_merge_keeps_other_entries(tmp_path):
    write_tuned([gpu_rec(A, 1.0)], tmp_path)
    write_tuned([gpu_rec(B, 1.0, causal=True)], tmp_path)
    assert lookup("sm90", "bfloat16", 64, False, 4096, tmp_path)[:2] == (A, True)
    assert lookup("sm90", "bfloat16", 64, True, 4096, tmp_path)[:2] == (B, True)
    with pytest.raises(FlashscopeError, match="pass --force to replace it"):
        write_tuned([gpu_rec(C, 0.1)], tmp_path)  # an entry of the same problem exists
    assert lookup("sm90", "bfloat16", 64, False, 4096, tmp_path)[0] == A
    write_tuned([gpu_rec(C, 0.1)], tmp_path, force=True)
    assert lookup("sm90", "bfloat16", 64, False, 4096, tmp_path)[0] == C
    assert len(json.loads((tmp_path / "sm90.json").read_text())["entries"]) == 2


def test_needs_measured_records(tmp_path):
    off = dict(gpu_rec(A, 1.0), kind="offline")
    with pytest.raises(FlashscopeError, match="no validated GPU timings"):
        write_tuned([off, gpu_rec(B, 1.0, status="failed")], tmp_path)


def test_most_evaluated_shape_wins_a_class():
    recs = [gpu_rec(A, 1.0, shape="2,32,2048,64"), gpu_rec(B, 0.5, shape="2,32,2048,64"),
            gpu_rec(C, 0.1, shape="4,32,4096,64")]
    (entry,) = best_entries(recs)["sm90"]
    assert entry["shape"] == "2,32,2048,64" and entry["config"] == B.as_dict()
    assert entry["evaluated"] == 2


def _file(tmp_path, entries, **top):
    data = {"format": 1, "target": "sm90", "entries": entries, **top}
    (tmp_path / "sm90.json").write_text(json.dumps(data))


GOOD = {"dtype": "bfloat16", "head_dim": 64, "causal": False, "seq_class": "le4k",
        "config": A.as_dict()}


@pytest.mark.parametrize("entries,top,needle", [
    ([dict(GOOD, extra=1)], {}, "unknown ['extra']"),
    ([{k: v for k, v in GOOD.items() if k != "config"}], {}, "missing ['config']"),
    ([GOOD, GOOD], {}, "a second entry"),
    ([dict(GOOD, seq_class="huge")], {}, "seq_class 'huge'"),
    ([dict(GOOD, config=dict(A.as_dict(), BLOCK_N=256, num_stages=8), head_dim=256)], {},
     "shared memory"),
    ([dict(GOOD, config=dict(A.as_dict(), waves_per_eu=2))], {}, "AMD option"),
    ([dict(GOOD, causal="no")], {}, "causal"),
    ([GOOD], {"format": 2}, "format 2"),
    ([GOOD], {"target": "sm80"}, "does not match"),
])
def test_malformed_files_fail_closed(tmp_path, entries, top, needle):
    _file(tmp_path, entries, **top)
    with pytest.raises(ArtifactError) as e:
        lookup("sm90", "bfloat16", 64, False, 4096, tmp_path)
    assert needle in str(e.value) and "sm90.json" in str(e.value)


def test_bad_json_fails_closed(tmp_path):
    (tmp_path / "sm90.json").write_text("{")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        lookup("sm90", "bfloat16", 128, True, 100, tmp_path)


def test_packaged_files_load():
    """Whatever tuned files ship must parse, and every entry must be found by lookup."""
    from flashscope.tuned import DATA_DIR, load_tuned

    for path in sorted(DATA_DIR.glob("*.json")) if DATA_DIR.exists() else []:
        for (dtype, hd, causal, cls), (cfg, e) in load_tuned(path.stem).items():
            n = int(e["shape"].split(",")[2]) if "shape" in e else 1024
            assert lookup(path.stem, dtype, hd, causal, n) == (
                cfg, True, f"{path.name} [{cls}]")
