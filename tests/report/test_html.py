"""The report page a person opens: on a report wide enough to test it (six targets, every
ablation, a failed build, a kernel held down by shared memory), built from records made up
here rather than compiled, so it takes seconds. Checked: the widest table fits a 1400-pixel
window in headless Chromium (measured in the page, with a screenshot), headers sort their
table, failed builds are said, the default-kernel sentence, shared memory's cap on the
staircase, and plot labels that never overlap."""

import json
import re
import shutil
import subprocess
import tempfile

import pytest

from flashscope import budget as fbudget
from flashscope import TritonFwdConfig
from flashscope.isa import KernelRecord
from flashscope.plotting import overlaps, place_labels, pyplot
from flashscope.report import Report, ReportSpec, default_configs, write_report
from flashscope.report import ablations, html, plots
from flashscope.report.cliffs import cliff_view
from flashscope.report.collect import _row
from flashscope.targets import parse_targets

TARGETS = "sm80,sm90,sm100,gfx942,gfx950,gfx1100"
FAILED_CFG = TritonFwdConfig(128, 128, 8, 2)
FAILED = (FAILED_CFG.key, "gfx942")  # the made-up build that failed
REFUSED = (FAILED_CFG.key, "gfx950")  # made up to need more LDS than a workgroup may have
SHARED_BOUND = (TritonFwdConfig(64, 64, 8, 2).key, "sm90")  # made up to need 150 KB of smem


def _record(cfg, t, hd):
    """A plausible record: registers near the budget, shared memory of the tiles."""
    regs = min(t.max_regs_per_thread, int(fbudget.budget(cfg, t, hd).total * 1.1))
    shared = 2 * hd * (cfg.BLOCK_N * cfg.num_stages + cfg.BLOCK_M)
    if (cfg.key, t.name) == SHARED_BOUND:
        shared = 150 * 1024
    return KernelRecord(kernel="_attn_fwd", target=t.name, vendor=t.vendor, registers=regs,
                        spill_stores=0, spill_loads=0, vgpr_spills=0, sgpr_spills=0,
                        shared_bytes=shared, threads=cfg.num_warps * t.warp_size,
                        num_warps=cfg.num_warps, wave_size=t.warp_size)


@pytest.fixture(scope="module")
def wide():
    from flashscope.errors import FlashscopeError, LimitError

    ts = tuple(parse_targets(TARGETS))
    base = TritonFwdConfig(128, 64, 8, 2)
    cfgs = default_configs(base, 64, ts) + (TritonFwdConfig(64, 64, 8, 2),)
    spec = ReportSpec(ts, cfgs, (64,), base)
    steps = ablations.plan(base, 64, ts, spec.knobs)
    pairs = [(c, 64) for c in cfgs] + sorted(ablations.needed(steps) - {(c, 64) for c in cfgs},
                                             key=lambda p: (p[1], p[0].key))
    rows = []
    for c, hd in pairs:
        for t in ts:
            rec = (FlashscopeError(f"config {c.label}: made-up failure for the test")
                   if (c.key, t.name) == FAILED else _record(c, t, hd))
            if (c.key, t.name) == REFUSED:
                rec = LimitError(f"config {c.label}: needs 98304 bytes of LDS per block; "
                                 f"gfx950 allows 65536")
            rows.append(_row(c, hd, t, rec))
    rep = Report(spec, rows, [], [])
    rep.ablations = ablations.steps(steps, rep.by_key(), ts)
    rep.cliffs = cliff_view(rep.main_rows())
    rep.timings = {"kernels": len(rows)}
    return rep


@pytest.fixture(scope="module")
def page(wide, tmp_path_factory):
    out = tmp_path_factory.mktemp("wide")
    files = write_report(wide, out)
    return out, files


def test_failed_build_is_said_not_missing(wide, page):
    out, _ = page
    text = (out / "report.html").read_text()
    assert re.search(r"\b1 of \d+ builds failed", text)  # the refused one is not counted
    assert f"build failed: config {FAILED_CFG.label}: made-up failure" in text
    assert '<td class="fail">FAILED</td>' in text  # its row in the budget table
    assert f"FAILED: config {FAILED_CFG.label}" in text  # its ablation cell (BLOCK_N doubled)


def test_a_config_its_target_cannot_run_is_not_built_not_failed(wide, page):
    """A LimitError (a rule, or more LDS than a workgroup may have) is a result of the
    ablation, listed apart from the failed builds: NOT BUILT, "does not fit"."""
    out, files = page
    text = (out / "report.html").read_text()
    assert re.search(r"\b1 of \d+ configs do not fit their target", text)
    assert '<td class="fail">NOT BUILT</td>' in text
    assert f"does not fit: config {FAILED_CFG.label}: needs 98304 bytes" in text
    assert f"NOT BUILT: config {FAILED_CFG.label}" in text  # its ablation cell
    doc = json.loads((out / "report.json").read_text())
    rows = [r for r in doc["rows"] if (r["config_key"], r["target"]) in (FAILED, REFUSED)]
    assert sorted((r["target"], r["refused"]) for r in rows) == [("gfx942", False),
                                                                 ("gfx950", True)]


def test_terminal_summary_fits_100_columns(wide, capsys, monkeypatch):
    """The same six-target report in the terminal, redirected: 100 columns, no cell cut."""
    from flashscope.report.render_terminal import render
    from flashscope.terminal import console

    monkeypatch.delenv("COLUMNS", raising=False)
    render(wide, console())
    out = capsys.readouterr().out
    assert "128x128 w8 s2" in out and "FAILED" in out and "build failed" in out
    assert "NOT BUILT" in out and "does not fit" in out
    assert max(len(x.rstrip()) for x in out.splitlines()) <= 100
    assert "\u2026" not in out


def test_every_table_has_a_sortable_header(page):
    out, _ = page
    text = (out / "report.html").read_text()
    assert text.count("<table>") == text.count("<thead>") == text.count("<tbody>")
    assert "addEventListener('click'" in text
    assert not re.search(r"<script[^>]*\bsrc=", text)  # inline: the page stays one file


def test_default_kernel_sentence_hook():
    assert html.default_kernel_sentence(["sm90", "gfx942"], {}) == ""
    s = html.default_kernel_sentence(["sm90", "gfx942"], {"sm90": "the Gluon forward",
                                                           "sm80": "not in the report"})
    assert "sm90: the Gluon forward" in s and "sm80" not in s and "gfx942" not in s


def test_staircase_draws_the_shared_memory_cap(wide, tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    labels = []
    step = Axes.step

    def spy(self, *a, **kw):
        labels.append(kw.get("label", ""))
        return step(self, *a, **kw)

    monkeypatch.setattr(Axes, "step", spy)
    plots.plot_staircase(wide, tmp_path / "s.png")
    capped = [x for x in labels if "its cap" in x]
    assert "256 threads with 153,600 B shared memory (its cap)" in capped
    assert all("shared memory" in x or "LDS" in x for x in capped)


def test_labels_never_overlap():
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    pts = [(250 + (i * 7919) % 60 / 10, 25 + (i * 104729) % 80 / 10) for i in range(40)]
    ax.scatter(*zip(*pts))
    ax.set_xlim(0, 260)
    ax.set_ylim(0, 108)
    fig.tight_layout()
    anns = place_labels(ax, pts, [f"m128n64w{i}s2q1" for i in range(40)])
    fig.canvas.draw()
    assert len(anns) == 40 and overlaps(anns, fig.canvas.get_renderer()) == []
    # what place_labels prevents: the same labels all at one offset collide
    naive = [ax.annotate(t.get_text(), p, xytext=(4, 4), textcoords="offset points",
                         fontsize=6) for t, p in zip(anns, pts)]
    fig.canvas.draw()
    assert overlaps(naive, fig.canvas.get_renderer())
    plt.close(fig)


CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"]

#: Appended to a copy of the page: measures it after layout and sorts one column, writing
#: what it found into the DOM for --dump-dom to carry out.
PROBE = """<script>
window.addEventListener('load', function () {
  var widest = 0;
  document.querySelectorAll('table').forEach(function (t) {
    widest = Math.max(widest, t.getBoundingClientRect().right); });
  var tb = document.querySelector('table'), th = tb.querySelectorAll('th')[3];
  th.click();
  var first = tb.tBodies[0].rows[0].cells[3].textContent;
  th.click();
  var last = tb.tBodies[0].rows[0].cells[3].textContent;
  document.body.setAttribute('data-probe', [document.documentElement.scrollWidth,
    window.innerWidth, Math.ceil(widest), first, last].join('|'));
});
</script>"""


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install chromium)")
def test_widest_table_fits_1400_pixels_in_chromium(wide, page):
    from PIL import Image, ImageStat

    out, _ = page
    probe = out / "probe.html"
    probe.write_text((out / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    with tempfile.TemporaryDirectory() as prof:
        dom = subprocess.run(CHROMIUM + [f"--user-data-dir={prof}", "--window-size=1400,900",
                                         "--virtual-time-budget=5000", "--dump-dom",
                                         probe.as_uri()],
                             check=True, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'data-probe="([^"]*)"', dom)
    assert m, "the probe did not run"
    scroll, inner, widest, first, last = m.group(1).split("|")
    assert int(inner) == 1400
    assert int(widest) <= 1400 and int(scroll) <= 1400, (widest, scroll)
    measured = [int(r.record.registers) for r in wide.main_rows() if r.record is not None]
    assert (int(first), int(last)) == (min(measured), max(measured))  # sorted, then reversed
    shot = out / "shot.png"
    with tempfile.TemporaryDirectory() as prof:
        subprocess.run(CHROMIUM + [f"--user-data-dir={prof}", f"--screenshot={shot}",
                                   "--window-size=1400,3000", (out / "report.html").as_uri()],
                       check=True, capture_output=True, timeout=120)
    img = Image.open(shot).convert("L")
    assert img.size == (1400, 3000) and ImageStat.Stat(img).var[0] > 100  # not blank
