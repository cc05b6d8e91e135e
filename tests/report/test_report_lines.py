"""``flashscope report --lines`` on a tiny spec (one config and its Q_IN_REGS ablation,
sm90 + gfx942, head dim 64): the per-line views of every kernel, lines.json, the HTML
section with the source and its heat strips, the budget checked against liveness."""

import json
import shutil
import subprocess
import tempfile

import pytest

from flashscope.cli import main
from flashscope import TritonFwdConfig
from flashscope.report import ReportSpec, collect, write_report
from flashscope.report.lines import (STRUCTURES, collect_lines, measured_structures,
                                     structure_of)
from flashscope.targets import parse_targets

BASE = TritonFwdConfig(64, 32, 4, 1)
TARGETS = "sm90,gfx942"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    spec = ReportSpec(tuple(parse_targets(TARGETS)), (BASE,), (64,), BASE,
                      knobs=("Q_IN_REGS",))
    rep = collect(spec, jobs=2)
    sec = collect_lines(rep)
    out = tmp_path_factory.mktemp("report-lines")
    return rep, sec, out, write_report(rep, out, lines=sec)


def test_every_kernel_has_a_view_and_its_checks_hold(built):
    rep, sec, _, _ = built
    assert len(sec.views) == len(rep.rows) == 4 and not sec.errors
    for key, v in sec.views.items():
        assert all(c["ok"] for c in v.checks), (key, v.checks)
        assert v.registers == rep.by_key()[key].record.registers
    assert sec.timings["lines_kernels"] == 4 and sec.timings["lines_s"] > 0


def test_structures_partition_the_peak(built):
    _, sec, _, _ = built
    for v in sec.views.values():
        meas = measured_structures(v)
        assert sum(meas.values()) == v.peak["live"]
    # on gfx942 the accumulator's MFMA results are placed on its line, acc = tl.dot(...)
    assert measured_structures(sec.views[(BASE.key, 64, "gfx942")])["acc"] >= 32


@pytest.mark.parametrize("line,structure", [
    ("    acc = tl.dot(p.to(v.dtype), v, acc)", "acc"),
    ("    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)", "acc"),
    ("        q = tl.load(q_src, mask=q_mask, other=0.0)", "q"),
    ("            v = tl.load(v_ptrs)", "kv"),
    ("    return tl.dot(q, kt)", "scores"),
    ("        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)", "stats"),
    ("        p = tl.math.exp2(x)", "p"),
    ("    offs_m = start_m + tl.arange(0, BLOCK_M)", "rest"),
    ("    for start_n in tl.range(lo, hi, BLOCK_N):", "loop"),
    ("    # acc = something in a comment", "rest"),
])
def test_structure_of(line, structure):
    assert structure_of(line) == structure
    assert structure in [s for s, _ in STRUCTURES] + ["rest"]


def test_files_and_html(built):
    rep, sec, out, files = built
    doc = json.loads((out / "lines.json").read_text())
    assert len(doc["kernels"]) == 4 and files["lines"].endswith("lines.json")
    html = (out / "report.html").read_text()
    assert "Registers by source line" in html and "hsl(" in html
    assert "The budget against measured liveness" in html
    v = sec.views[(BASE.key, 64, "sm90")]
    assert f"<td>{v.live_peak}</td>" in html and "acc = tl.dot" in html


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install chromium)")
def test_section_renders_in_chromium(built):
    _, _, out, _ = built
    flags = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update"]
    with tempfile.TemporaryDirectory() as prof:
        dom = subprocess.run(flags + [f"--user-data-dir={prof}", "--dump-dom",
                                      (out / "report.html").resolve().as_uri()],
                             check=True, capture_output=True, text=True, timeout=120).stdout
    assert "Source, live registers per line" in dom and "gfx942 live" in dom


def test_cli(built, tmp_path, capsys):
    cfgs = tmp_path / "configs.json"
    cfgs.write_text(json.dumps([BASE.as_dict()]))
    out = tmp_path / "out"
    argv = ["report", "--targets", TARGETS, "--configs", str(cfgs), "--head-dims", "64",
            "--ablate", "Q_IN_REGS", "--out", str(out), "--jobs", "2", "--lines",
            "--no-neighbours"]
    assert main(argv + ["--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "lines" in summary["files"] and summary["timings"]["lines_kernels"] == 4
    assert main(["report", "--kernel", "bwd", "--lines", "--out", str(tmp_path / "b")]) == 2
    assert "--lines goes with --kernel fwd" in capsys.readouterr().err
