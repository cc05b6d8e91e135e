"""Roofline formulas, verdicts against counters, the plot and the CLI."""

import json

import pytest

from flashscope.cli import main
from flashscope.roofline import (Ceilings, Point, attention_flops, attention_min_bytes,
                                 counter_verdict, get_ceilings, verdict)

H100 = get_ceilings("h100-measured")


def test_flops_match_the_papers_count():
    f = attention_flops(4, 16, 4096, 4096, 128)
    assert f == 4 * 4 * 16 * 4096 * 4096 * 128
    assert attention_flops(4, 16, 4096, 4096, 128, causal=True) == f / 2
    assert attention_flops(4, 16, 4096, 4096, 128, direction="bwd") == 2.5 * f
    assert attention_flops(4, 16, 4096, 4096, 128, direction="fwd+bwd") == 3.5 * f


def test_min_bytes_by_hand():
    B, H, Hkv, Nq, Nk, D = 2, 8, 2, 100, 300, 64
    q, kv, lse = B * H * Nq * D * 2, B * Hkv * Nk * D * 2, B * H * Nq * 4
    assert attention_min_bytes(B, H, Nq, Nk, D, Hkv) == 2 * q + 2 * kv + lse
    assert attention_min_bytes(B, H, Nq, Nk, D, Hkv, direction="bwd") == \
        (3 * q + 2 * kv + lse) + (q + 2 * kv)


def test_h100_forward_is_right_of_the_ridge():
    p = Point("x", attention_flops(4, 16, 4096, 4096, 128),
              attention_min_bytes(4, 16, 4096, 4096, 128))
    assert H100.ridge == pytest.approx(260.0)
    assert p.intensity == pytest.approx(2040.0, rel=1e-3) and p.side(H100) == "compute"


def test_counters_that_contradict_the_roofline_are_reported():
    # the rocprofv3 study: AI 26.6 FLOP/B against a ridge of 174, DRAM at 0.43 % of peak,
    # compute at 1.24 %: the roofline says memory-bound, the counters latency-bound
    c = Ceilings("study", 36.9e12, 212e9, "rocprofv3 study")
    p = Point("attn", 26.6e9, 1e9, 26.6e9 / 457.5e9)
    v = verdict(p, c, {"dram_throughput": 0.43, "tensor_pipe": 1.24})
    assert v["roofline_bound"] == "memory" and v["bound"] == "latency"
    assert v["agree"] is False and "counters say latency-bound" in v["note"]


def test_counter_rules_and_bandwidth_fallback():
    assert counter_verdict({"tensor_pipe": 75.0}, H100)["bound"] == "compute"
    assert counter_verdict({"dram_bandwidth": 2.4e12}, H100)["bound"] == "memory"  # 80 %
    assert counter_verdict({"issue_active": 40.0}, H100)["bound"] == "latency"
    assert counter_verdict({"registers": 128}, H100) is None


def test_point_above_the_roof_is_flagged():
    p = Point("fast", 1e12, 1e6, 1e-3)  # 1000 TFLOP/s > 780
    assert verdict(p, H100)["above_roof"] and "ABOVE the roof" in verdict(p, H100)["note"]


def test_cli_with_counters_json_and_plot(tmp_path, capsys):
    from pathlib import Path

    data = Path(__file__).parents[1] / "data" / "profile"
    png = tmp_path / "r.png"
    assert main(["roofline", "--counters", str(data / "ncu_00_cudnn.csv"), "--counters",
                 str(data / "ncu_01_flash.csv"), "--plot", str(png), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ks = {k["kernel"]: k for k in out["kernels"]}
    assert ks["cudnn"]["agree"] is True and ks["flash"]["agree"] is False
    # 831,968 ns on the H100 against the 780 TFLOP/s measured roof: 85 %
    assert ks["cudnn"]["achieved_flops"] / 1e12 == pytest.approx(660.79, abs=0.01)
    assert ks["cudnn"]["fraction_of_roof"] == pytest.approx(660.79 / 780, abs=1e-4)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, msg", [
    (["--ceilings", "h100-measurd"], "did you mean"),
    (["--peak-tflops", "100"], "go together"),
    (["--time", "x=-1"], "NAME=MILLISECONDS"),
    (["--hkv", "5"], "expected a divisor of H"),
    (["--shape", "1,2,a,4"], "--shape"),
])
def test_cli_bad_input_exit_2(capsys, args, msg):
    assert main(["roofline", *args]) == 2
    assert msg in capsys.readouterr().err


def test_cli_bad_counters_file_exit_2(tmp_path, capsys):
    f = tmp_path / "c.json"
    f.write_text("[1, 2]")
    assert main(["roofline", "--counters", str(f)]) == 2
    assert "expected 'flashscope profile --json' output" in capsys.readouterr().err
