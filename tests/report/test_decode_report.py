"""``flashscope report --kernel decode``: the decoding family's kernels through the family
report (:mod:`flashscope.report.backward`): which kernels a knob rebuilds, the plan, and
one target's base built offline (no ablations, so three compiles)."""

import json

import pytest

from flashscope.cli import main
from flashscope.families import Problem, triton_decode
from flashscope.report.backward import DECODE, BwdSpec, make_bwd_spec, plan
from flashscope.targets import parse_targets


def test_knobs_rebuild_only_the_kernels_that_read_them():
    assert DECODE.uses("triton-decode", "BLOCK_N") and DECODE.uses("decode_paged", "num_stages")
    assert DECODE.uses("decode_merge", "BLOCK_M") and not DECODE.uses("decode_merge", "BLOCK_N")
    spec = BwdSpec(tuple(parse_targets("sm90")), 128, knobs=("BLOCK_N", "num_stages"),
                   family=DECODE)
    t = spec.targets[0]
    assert plan(spec, t, "decode_merge") == []
    steps = plan(spec, t, "decode_paged")
    assert [s.name for s in steps] == ["BLOCK_N halved", "BLOCK_N doubled",
                                       "num_stages halved", "num_stages doubled"]
    base = steps[0].before
    assert steps[0].after == base.replace(BLOCK_N=base.BLOCK_N // 2)
    assert base.BLOCK_N == 128 and steps[1].after is None  # 256 x 128 x 3 stages: too big
    assert steps[2].after == base.replace(num_stages=base.num_stages // 2)


def test_spec_takes_the_family_knobs():
    assert make_bwd_spec("sm90", ablate="BLOCK_M", family=DECODE).knobs == ("BLOCK_M",)


def test_report_builds_the_decoding_kernels(tmp_path):
    out = tmp_path / "r"
    assert main(["report", "--kernel", "decode", "--targets", "sm90", "--ablate", "none",
                 "--out", str(out), "--jobs", "1"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["kernel"] == "decode" and "decoding kernels" in data["model"]
    want = triton_decode.select(Problem("sm90", "bfloat16", 128, False, **DECODE.problem))
    assert data["spec"]["base"]["sm90"] == want.label
    rows = {r["kernel"]: r for r in data["rows"]}
    assert set(rows) == {"triton-decode", "decode_paged", "decode_merge"}
    for r in rows.values():
        assert r["error"] is None and r["measured"]["registers"] > 0
    # the paged kernel gets the dense one's K/V buffers (2 S - 1 stages: triton_stages),
    # both above the rules' bound of two 64 x 128 K and V tiles
    assert rows["decode_paged"]["measured"]["shared_bytes"] >= \
        rows["triton-decode"]["measured"]["shared_bytes"] > 2 * 2 * 64 * 128 * 2
    for name in ("report.html", "decode_registers.png", "staircase.png", "report.csv"):
        assert (out / name).stat().st_size > 0
    assert "decoding kernels (attention, paged, merge)" in (out / "report.html").read_text()


@pytest.mark.parametrize("argv, needle", [
    (["--ablate", "BLOCK_M1"], "--ablate 'block_m1'"),
    (["--configs", "x.json"], "the decoding report starts from each target's default"),
    (["--lines"], "--lines goes with --kernel fwd"),
    (["--varlen"], "--varlen goes with --kernel fwd or bwd"),
    (["--kernel", "fwd", "--page", "128"], "--page goes with --kernel decode"),
    (["--kernel", "bwd", "--page", "128"], "--page goes with --kernel decode"),
])
def test_bad_arguments(tmp_path, capsys, argv, needle):
    code = main(["report", "--kernel", "decode", "--out", str(tmp_path / "o"), *argv])
    assert code == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_decoding_kernels_build_under_a_window_and_a_cap(tmp_path, capsys):
    """``--window`` and ``--softcap`` reach the attention kernels (a masked build differs
    from the plain one); the merge reads no mask and builds under one all the same; a
    packed batch (``--varlen``) is refused by name, exit 2, one line."""
    import json as _json

    def build(kernel, *flags):
        assert main(["inspect", "--kernel", kernel, "--target", "sm90", "--json",
                     *flags]) == 0
        return _json.loads(capsys.readouterr().out)["kernels"][0]["instructions"]

    plain = build("triton-decode")
    assert build("triton-decode", "--window", "8,0", "--softcap", "5") != plain
    assert build("decode_merge", "--window", "8,0") > 0
    assert main(["inspect", "--kernel", "decode_paged", "--target", "sm90", "--varlen"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--varlen: decode_paged takes no packed batch" in err


def test_the_paged_kernel_builds_for_the_page_size_asked(capsys):
    """``--page N`` sets the paged kernel's page size, which picks its table reads: a
    128-key tile inside a 128-key page reads one entry (fewer registers than 16-key
    pages); the dense kernel builds as it is; a forward or backward kernel refuses it."""
    import json as _json

    def regs(kernel, *flags):
        assert main(["inspect", "--kernel", kernel, "--target", "sm90", "--json",
                     *flags]) == 0
        return _json.loads(capsys.readouterr().out)["kernels"][0]["registers"]

    assert regs("decode_paged", "--page", "128") < regs("decode_paged")  # 16-key pages
    for kernel in ("fwd", "bwd_dq"):
        assert main(["inspect", "--kernel", kernel, "--target", "sm90", "--page", "16"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--page 16:" in err and "reads no paged cache" in err


def test_report_builds_the_hopper_backward(tmp_path, capsys):
    """``--kernel sm90-bwd``: its one kernel at the sm90 default (the report's default
    targets narrowed to sm90), the ablation that does not fit marked; another target, or
    a variant the kernel does not build, refused in one line with exit 2."""
    from flashscope.families import sm90_bwd

    out = tmp_path / "r"
    assert main(["report", "--kernel", "sm90-bwd", "--ablate", "BLOCK_M", "--out", str(out),
                 "--jobs", "1"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["spec"]["targets"] == ["sm90"]
    assert data["spec"]["base"]["sm90"] == sm90_bwd.Sm90BwdConfig().label
    (row,) = [r for r in data["rows"] if r["kernel"] == "sm90-bwd"]
    assert row["error"] is None and row["measured"]["shared_bytes"] > 200 * 1024
    (step,) = data["ablations"]
    assert step["targets"]["sm90"]["config_after"] is None  # 128-row tiles: over 227 KB
    capsys.readouterr()
    for argv, needle in ((["--targets", "sm80"], "builds for sm90 only"),):
        assert main(["report", "--kernel", "sm90-bwd", "--out", str(tmp_path / "o"),
                     *argv]) == 2
        assert needle in capsys.readouterr().err
        assert not (tmp_path / "o").exists()


def test_report_builds_the_hopper_backward_at_d256(tmp_path):
    """``--kernel sm90-bwd --head-dims 256``: the 64-key build whose warpgroups split the
    head dim, dQ by atomics; DQ_SLOTS halved leaves it as it is (no slot to halve)."""
    out = tmp_path / "r"
    assert main(["report", "--kernel", "sm90-bwd", "--head-dims", "256", "--ablate",
                 "DQ_SLOTS", "--out", str(out), "--jobs", "1"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["spec"]["base"]["sm90"] == "sm90-bwd 64x64 s2 dq atomics"
    (row,) = [r for r in data["rows"] if r["kernel"] == "sm90-bwd"]
    assert row["error"] is None and row["head_dim"] == 256
    assert 200 * 1024 < row["measured"]["shared_bytes"] <= 227 * 1024
    (step,) = data["ablations"]
    assert step["targets"]["sm90"]["d_registers"] == 0


def test_inspect_builds_the_wide_rows_on_the_hopper_forward(capsys):
    """``--kernel decode_rows``: the sm_90 forward as a decoding call runs it (G = 8
    packed rows a position, a KV cache's lengths; MASKED_FIRST off in its default): no
    spill at D = 128, dense or paged (--page, V from a second loading warp); the tail
    head dims, --varlen and pages the kernel cannot read refused in one line."""
    import json as _json

    def kernel(name, *flags):
        assert main(["inspect", "--kernel", name, "--target", "sm90", "--json",
                     "--causal", "yes", *flags]) == 0
        return _json.loads(capsys.readouterr().out)["kernels"][0]

    rows = kernel("decode_rows")  # q and out in the caller's layout (G = 8 divides 64)
    assert rows["spill_stores"] == 0 and rows["config"]["MASKED_FIRST"] is False
    assert rows["constants"]["GROUPED"] is True
    paged = kernel("decode_rows", "--page", "64")  # 2 copies of K (and V) a key tile
    assert paged["spill_stores"] == 0 and paged["constants"]["PAGE"] == 64
    assert paged["constants"]["GROUPED"] is True
    assert paged["constants"]["LOADERS"] == 2 and rows["constants"]["LOADERS"] == 1
    for flags in (["--varlen"], ["--head-dim", "96"], ["--page", "24"]):
        assert main(["inspect", "--kernel", "decode_rows", "--target", "sm90", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert ("--varlen: decode_rows takes no packed batch" in err
                or "head dim 96 against a KV cache" in err
                or "--page 24: decode_rows reads pages of a power of two" in err), err


def test_report_builds_the_wide_rows_on_the_hopper_forward(tmp_path, capsys):
    """``--kernel decode-rows``: the route's kernel at its default (sm90 only, MASKED_FIRST
    off) and its BLOCK_N step, dense and with --page 64; another target, --varlen or a
    page size the kernel cannot read refused in one line with exit 2, nothing written."""
    from flashscope.families.base import Problem
    from flashscope.kvcache import forward_config

    out = tmp_path / "r"  # causal, as a decoding call runs (and the inspect test builds)
    assert main(["report", "--kernel", "decode-rows", "--causal", "--ablate", "BLOCK_N",
                 "--out", str(out), "--jobs", "1"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["spec"]["targets"] == ["sm90"]
    base = forward_config(Problem("sm90", "bfloat16", 128, True, 16, 8192, 64 * 64,
                                  group=8))
    assert data["spec"]["base"]["sm90"] == base.label and not base.MASKED_FIRST
    rows = [r for r in data["rows"] if r["kernel"] == "decode_rows"]
    assert len(rows) == 2 and all(r["error"] is None for r in rows)
    (step,) = data["ablations"]
    assert step["name"] == "BLOCK_N halved" and step["targets"]["sm90"]["config_after"]
    assert main(["report", "--kernel", "decode-rows", "--causal", "--page", "64",
                 "--ablate", "BLOCK_N", "--out", str(tmp_path / "p"), "--jobs", "1"]) == 0
    paged = json.loads((tmp_path / "p" / "report.json").read_text())
    rows = [r for r in paged["rows"] if r["kernel"] == "decode_rows"]
    # at most the two values ptxas may store once at the entry for the partitions (the
    # producer's loop values reloaded every work tile were seven and more)
    assert rows and all(r["error"] is None and r["measured"]["spill_stores"] <= 2
                        for r in rows), rows
    capsys.readouterr()
    for argv, needle in ((["--targets", "sm80"], "builds for sm90 only"),
                         (["--varlen"], "--varlen goes with --kernel fwd or bwd"),
                         (["--page", "24"], "--page 24: decode_rows reads pages of a "
                          "power of two")):
        assert main(["report", "--kernel", "decode-rows", "--out", str(tmp_path / "o"),
                     *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
        assert not (tmp_path / "o").exists()
