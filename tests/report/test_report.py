"""The report end to end on a tiny spec (one config, Q_IN_REGS ablation, sm90 + gfx942,
head dim 64): records, ablation deltas, cliffs, the files, the HTML in Chromium, the CLI."""

import csv
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from flashscope.cli import main
from flashscope import TritonFwdConfig
from flashscope.isa import KernelRecord
from flashscope.occupancy import occupancy_for_record
from flashscope.report import ReportSpec, Row, collect, write_report
from flashscope.report.ablations import KNOB_NAMES, parse_knobs, plan
from flashscope.report.cliffs import cliff_view
from flashscope.errors import FlashscopeError
from flashscope.targets import parse_targets

BASE = TritonFwdConfig(64, 32, 4, 1)
TARGETS = "sm90,gfx942"


@pytest.fixture(scope="session")
def report():
    spec = ReportSpec(tuple(parse_targets(TARGETS)), (BASE,), (64,), BASE,
                      knobs=("Q_IN_REGS",))
    seen = []
    rep = collect(spec, jobs=2, progress=lambda d, t: seen.append((d, t)))
    assert seen[0] == (0, 4) and seen[-1] == (4, 4)
    return rep


@pytest.fixture(scope="session")
def written(report, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return out, write_report(report, out)


def test_rows_measured_and_compared(report):
    off = BASE.replace(Q_IN_REGS=False)
    assert [(r.config, r.target) for r in report.rows] == [
        (BASE, "sm90"), (BASE, "gfx942"), (off, "sm90"), (off, "gfx942")]
    for r in report.rows:
        assert r.error is None and r.record.registers > 0
        c = r.comparison
        assert c["measured"] == r.record.registers
        assert c["predicted"] == pytest.approx(sum(r.budget.parts.values()))
        assert c["error"] == pytest.approx(c["predicted"] - c["measured"])
        assert r.occ.active_blocks >= 1
    assert report.rows[1].record.wave_size == 64 and report.rows[1].record.threads == 256


def test_ablation_deltas_match_rows(report):
    (step,) = report.ablations
    assert step["name"] == "Q_IN_REGS off"
    rows = report.by_key()
    for t in ("sm90", "gfx942"):
        a = rows[(BASE.key, 64, t)].record
        b = rows[(BASE.replace(Q_IN_REGS=False).key, 64, t)].record
        e = step["targets"][t]
        assert e["d_registers"] == b.registers - a.registers
        lanes = 32 if t == "sm90" else 64
        assert e["d_file_bytes_per_wave"] == e["d_registers"] * lanes * 4


def test_the_kernel_that_runs_is_read_too(report, written):
    """On sm90 the report reads the Gluon kernel the library runs there by default (its
    consumers' registers, no spills), next to the portable kernel's rows; elsewhere the
    portable kernel's default; the page says which runs where."""
    kernels = report.default_kernels()
    assert kernels["sm90"].startswith("sm90-fwd") and kernels["gfx942"].startswith("triton-fwd")
    sm90 = next(r for r in report.defaults if r.target == "sm90")
    assert sm90.error is None and sm90.record.registers > 0 and sm90.spills == 0
    assert "uses_wgmma" in sm90.record.features and sm90.budget.threads == 128
    html = (written[0] / "report.html").read_text()
    assert "The kernel that runs" in html and kernels["sm90"] in html
    data = json.loads((written[0] / "report.json").read_text())
    assert [d["family"] for d in data["defaults"]] == ["sm90-fwd", "triton-fwd"]


def test_plan_steps_and_knobs():
    ts = parse_targets("sm90,gfx942")
    names = [s.name for s in plan(TritonFwdConfig(128, 64, 8, 2), 128, ts)]
    assert names == ["Q_IN_REGS off", "BLOCK_M halved", "BLOCK_M doubled", "BLOCK_N halved",
                     "BLOCK_N doubled", "num_warps halved", "num_warps doubled",
                     "HEAD_DIM 64 -> 128", "HEAD_DIM 128 -> 256"]
    # BLOCK_N 16 cannot be halved (16..256); 16 warps cannot double (1024 threads max).
    names = [s.name for s in plan(TritonFwdConfig(64, 16, 16, 1), 64, ts, ("BLOCK_N",
                                                                           "num_warps"))]
    assert names == ["BLOCK_N doubled", "num_warps halved"]
    assert parse_knobs("all") == KNOB_NAMES and parse_knobs("none") == ()
    assert parse_knobs("q_in_regs,HEAD_DIM") == ("Q_IN_REGS", "HEAD_DIM")
    with pytest.raises(FlashscopeError, match="--ablate 'block_k'"):
        parse_knobs("BLOCK_K")


def test_cliff_view_by_hand():
    # sm90, 256 threads: 130 registers -> 17 x 256 per warp -> 15 warps -> 1 block of 8;
    # 128 registers -> 16 warps -> 2 blocks: saving 2 crosses back to 25%.
    rec = KernelRecord(kernel="fwd", target="sm90", vendor="nvidia", registers=130,
                       threads=256, shared_bytes=0)
    row = Row(TritonFwdConfig(), 128, "sm90", record=rec, occ=occupancy_for_record(rec))
    (c,) = [c for c in cliff_view([row]) if c["resource"] == "registers"]
    assert (c["save_to_gain"], c["near"], c["active_blocks"], c["blocks_after"]) == \
        (2, True, 1, 2)
    assert (c["occupancy"], c["occupancy_after"]) == (0.125, 0.25)


def test_files_exist_and_parse(written, report):
    out, files = written
    assert sorted(Path(p).name for p in files.values()) == [
        "budget.png", "report.html", "report.json", "staircase.png"]
    data = json.loads((out / "report.json").read_text())
    assert data["spec"]["targets"] == ["sm90", "gfx942"]
    assert [r["measured"]["registers"] for r in data["rows"]] == \
        [r.record.registers for r in report.rows]
    for png in ("budget.png", "staircase.png"):
        blob = (out / png).read_bytes()
        assert blob[:8] == b"\x89PNG\r\n\x1a\n" and len(blob) > 10_000


def test_html_self_contained(written, report):
    out, _ = written
    html = (out / "report.html").read_text()
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", html)
    assert "http://" not in html and "https://" not in html
    assert html.count('src="data:image/png;base64,') == 2
    for r in report.rows:
        assert f"<td>{r.record.registers}</td>" in html


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install chromium)")
def test_html_renders_in_chromium(written, report):
    from PIL import Image, ImageStat

    out, _ = written
    url = (out / "report.html").resolve().as_uri()
    shot = out / "shot.png"
    flags = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync"]
    with tempfile.TemporaryDirectory() as prof:
        subprocess.run(flags + [f"--user-data-dir={prof}", f"--screenshot={shot}",
                                "--window-size=1280,2000", url],
                       check=True, capture_output=True, timeout=120)
    with tempfile.TemporaryDirectory() as prof:
        dom = subprocess.run(flags + [f"--user-data-dir={prof}", "--dump-dom", url],
                             check=True, capture_output=True, text=True, timeout=120).stdout
    img = Image.open(shot).convert("L")
    assert img.size == (1280, 2000)
    assert ImageStat.Stat(img).var[0] > 100  # not a blank page
    assert "Where the registers go" in dom
    for r in report.rows:
        assert f"<td>{r.record.registers}</td>" in dom


def test_cli_end_to_end(report, tmp_path, capsys):
    cfgs = tmp_path / "configs.json"
    cfgs.write_text(json.dumps([BASE.as_dict()]))
    out = tmp_path / "out"
    argv = ["report", "--targets", TARGETS, "--configs", str(cfgs), "--head-dims", "64",
            "--ablate", "Q_IN_REGS", "--out", str(out), "--json", "--jobs", "2",
            "--no-neighbours"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["measured"]["registers"] for r in doc["rows"][:2]] == \
        [r.record.registers for r in report.rows[:2]]
    # stdout's JSON is the file's document
    assert doc == json.loads((out / "report.json").read_text())
    assert sorted(doc["files"]) == ["budget", "csv", "html", "json", "staircase"]
    assert (out / "report.html").is_file()
    with open(out / "report.csv", newline="") as f:  # header first: DictReader reads it
        rows = list(csv.DictReader(f))
    assert [int(r["registers"]) for r in rows] == [r.record.registers for r in report.rows[:2]]
    assert main(argv) == 2  # the folder now holds a report: no silent overwrite
    assert "report.json is already there" in capsys.readouterr().err
    assert main(argv + ["--force"]) == 0


@pytest.mark.parametrize("extra, message", [
    (["--targets", "sm91"], "unknown target 'sm91'"),
    (["--head-dims", "abc"], "--head-dims"),
    (["--head-dims", "512"], "head dim 512"),
    (["--ablate", "BLOCK_K"], "--ablate"),
    (["--jobs", "-1"], "--jobs"),
])
def test_cli_bad_arguments(extra, message, tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text, message", [
    ("not json", "not valid JSON"), ("[]", "non-empty JSON list"),
    ('[{"BLOCK_Q": 64}]', "unknown key"), ('[{"BLOCK_M": 24}]', None)])
def test_cli_bad_configs_file(text, message, tmp_path, capsys):
    f = tmp_path / "c.json"
    f.write_text(text)
    code = main(["report", "--configs", str(f), "--targets", "sm90", "--ablate", "none",
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    if message is None:  # a config the checks reject is reported in its row, not a crash
        assert code == 0
    else:
        assert code == 2 and message in err


def test_cli_out_is_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["report", "--out", str(f)]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
