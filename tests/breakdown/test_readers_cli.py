"""Breakdown readers (torch.profiler traces, rocprofv3, ncu) through the CLI, the model on
CPU, and malformed input -> exit 2."""

import json
from pathlib import Path

import pytest

from flashscope.breakdown.rocprof import read_agent_target, read_kernel_trace
from flashscope.breakdown.torch_trace import read_trace
from flashscope.cli import main

DATA = Path(__file__).parents[1] / "data"
BD = DATA / "breakdown"


def _json(capsys, args):
    assert main(["breakdown", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _share(r, bucket):
    return next(b for b in r["buckets"] if b["bucket"] == bucket)


def test_rocprof_stats_reproduce_the_study_table(capsys):
    (r,) = _json(capsys, ["--rocprof", str(BD / "rocprof_kernel_trace.csv"),
                          "--stats", str(BD / "rocprof_kernel_stats.csv"),
                          "--agent-info", str(BD / "rocprof_agent_info.csv")])
    assert r["total_seconds"] == pytest.approx(157.16e-3)
    assert _share(r, "gemm")["share"] == pytest.approx(121.89 / 157.16)
    assert _share(r, "attention")["calls"] == 75
    assert r["amdahl_ceiling"] == pytest.approx(157.16 / (157.16 - 2.35))
    assert r["target"] == "gfx1100"
    attn = next(k for k in r["kernels"] if "flash_attention" in k["name"])
    # 256 threads, 8 VGPRs, 1.5 KB LDS on RDNA3: 16 waves/SIMD -> full occupancy
    assert attn["calls"] == 3 and attn["occupancy"]["occupancy"] == 1.0


def test_rocprof_cdna_unifies_agprs(capsys):
    (r,) = _json(capsys, ["--rocprof", str(BD / "rocprof_cdna_kernel_trace.csv"),
                          "--target", "gfx942"])
    gemm = next(k for k in r["kernels"] if k["name"].startswith("Cijk"))
    assert gemm["vgprs"] == 128 and gemm["agprs"] == 128 and gemm["occupancy"] is not None
    assert _share(r, "attention")["seconds"] == pytest.approx(200e-6)


def test_rocprof_accepts_both_vgpr_column_names():
    assert read_kernel_trace(BD / "rocprof_kernel_trace.csv")[0]["vgprs"] == 120
    assert read_kernel_trace(BD / "rocprof_cdna_kernel_trace.csv")[0]["vgprs"] == 50
    assert read_agent_target(BD / "rocprof_agent_info.csv") == "gfx1100"


def test_torch_gpu_trace_counts_kernels_not_annotations(capsys):
    events, kind = read_trace(BD / "torch_gpu_sample.json")
    assert kind == "gpu" and len(events) == 7
    (r,) = _json(capsys, ["--trace", str(BD / "torch_gpu_sample.json")])
    assert r["total_seconds"] == pytest.approx(1000e-6)
    assert _share(r, "attention")["seconds"] == pytest.approx(100e-6)
    assert _share(r, "memory")["calls"] == 2


@pytest.mark.parametrize("name, attention", [("torch_cpu_sdpa.json", "aten::"),
                                             ("torch_cpu_flashscope.json", "flashscope::")])
def test_recorded_cpu_traces(name, attention):
    events, kind = read_trace(BD / name)
    assert kind == "cpu"
    names = {n for n, _ in events}
    assert any(n.startswith(attention) and "attention" in n for n in names)
    assert all(s >= 0 for _, s in events)


def test_ncu_csv_export(capsys):
    (r,) = _json(capsys, ["--ncu-csv", str(DATA / "profile" / "ncu_raw_h100.csv")])
    # attention is all of the time: the ceiling is unbounded, null in strict JSON
    assert _share(r, "attention")["share"] == 1.0 and r["amdahl_ceiling"] is None
    # the three H100 SDPA kernels: 831,968 + 1,536,704 + 3,118,912 ns
    assert r["total_seconds"] == pytest.approx(5.487584e-3, rel=1e-12)


@pytest.mark.interpreter
def test_model_runs_on_cpu_with_both_attentions(capsys, tmp_path):
    res = _json(capsys, ["--layers", "1", "--width", "32", "--heads", "2", "--seq", "16",
                         "--batch", "1", "--ffn", "64", "--iters", "1", "--device", "cpu",
                         "--out", str(tmp_path)])
    assert [r["attention"] for r in res] == ["sdpa", "flashscope"]
    for r in res:
        assert "CPU ops" in r["source"] and _share(r, "attention")["seconds"] > 0
        # qkv, out, fc1, fc2: each an aten::linear with its aten::addmm inside (self time)
        assert _share(r, "gemm")["calls"] == 8
    assert (tmp_path / "breakdown.json").exists()


@pytest.mark.parametrize("args, msg", [
    (["--preset", "lc0-encodr"], "did you mean"),
    (["--width", "100", "--heads", "3"], "not divisible"),
    (["--layers", "0"], "argument --layers: expected an integer >= 1, got 0"),
])
def test_bad_model_arguments_exit_2(capsys, args, msg):
    assert main(["breakdown", *args]) == 2
    assert msg in capsys.readouterr().err


TRACE_HDR = ("Kind,Agent_Id,Kernel_Name,Start_Timestamp,End_Timestamp,VGPR_Count,"
             "Workgroup_Size_X\n")


@pytest.mark.parametrize("flag, data, msg", [
    ("--rocprof", b"", "empty"),
    ("--rocprof", b"\x89PNG\r\n\x1a\n\x00\x00", "binary"),
    ("--rocprof", "Kernel_Name,x\n\xe9t\xe9\n".encode("latin-1"), "not UTF-8"),
    ("--rocprof", b"Kind,Kernel_Name,Start_Timestamp\nK,a,1\n", "missing column"),
    ("--rocprof", (TRACE_HDR + "K,1,k,100,50,8,64\n").encode(), "End_Timestamp before"),
    ("--rocprof", (TRACE_HDR + "K,1,k,100,150,eight,64\n").encode(), "VGPR_Count"),
    ("--rocprof", (TRACE_HDR + "K,1,k,100\n").encode(), "columns"),
    ("--stats", b'"Name","Calls"\n"k",3\n', "TotalDurationNs"),
    ("--stats", b'"Name","Calls","TotalDurationNs"\n"k",3,"12ms"\n', "expected a finite time"),
    ("--trace", b"{not json", "invalid JSON"),
    ("--trace", b'{"traceEvents": [{"ph": "X", "name": "k", "cat": "kernel"}]}', "event 0"),
    ("--trace", b'{"traceEvents": []}', "no kernel or cpu_op"),
    ("--ncu-csv", b"hello\n", "no ncu CSV header"),
])
def test_malformed_files_exit_2(capsys, tmp_path, flag, data, msg):
    f = tmp_path / "bad.csv"
    f.write_bytes(data)
    assert main(["breakdown", flag, str(f)]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and err.count("\n") == 1


# Shares the H100 run reported (`flashscope breakdown --device cuda --attention both`,
# 2026-11-21, breakdown.json),
# re-derived here from the real torch.profiler traces of that run (kernel, memset and
# memcpy events kept: tests/data/breakdown/torch_h100_<preset>_<attention>.json).
H100_SHARES = {
    "lc0-encoder_sdpa": {"gemm": 0.4515, "attention": 0.2297, "normalization": 0.1617, "elementwise": 0.1501, "memory": 0.007, "other": 0.0},
    "lc0-encoder_flashscope": {"gemm": 0.4754, "attention": 0.1928, "normalization": 0.1697, "elementwise": 0.1575, "memory": 0.0046, "other": 0.0},
    "decoder-long_sdpa": {"gemm": 0.5955, "attention": 0.2744, "normalization": 0.0391, "elementwise": 0.0883, "memory": 0.0027, "other": 0.0},
    "decoder-long_flashscope": {"gemm": 0.5638, "attention": 0.3134, "normalization": 0.0372, "elementwise": 0.0836, "memory": 0.0021, "other": 0.0},
}


@pytest.mark.parametrize("name", sorted(H100_SHARES))
def test_real_h100_traces_bucket_as_recorded(name):
    from flashscope.breakdown import summarize

    events, kind = read_trace(BD / f"torch_h100_{name}.json")
    assert kind == "gpu"
    report = summarize(events)
    got = {b["bucket"]: round(b["share"], 4) for b in report["buckets"]}
    assert got == H100_SHARES[name]
    top = {b["bucket"]: " ".join(b["top"]) for b in report["buckets"]}
    expected = "cudnn" if name.endswith("sdpa") else "_attn_fwd"
    assert expected in top["attention"]
