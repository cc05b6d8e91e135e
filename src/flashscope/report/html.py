"""One self-contained HTML page: inline CSS and script, the PNG plots as base64 data URIs,
no network resource, so it opens from a file anywhere (and in an offline browser).

The page is laid out for a 1400-pixel window without sideways scrolling: numeric cells stay
on one line, text cells (configs, reasons, the per-target ablation cells) wrap, and the
ablation table gives each target one cell instead of five columns. Every table sorts by
the column whose header is clicked (numbers by value, text alphabetically; a second click
reverses). A build that failed is a row saying FAILED with its reason, a config its target
cannot run (a rule or a limit) one saying NOT BUILT with the limit; never a missing row.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Mapping, Optional

from ..budget import COMPONENT_LABELS, COMPONENTS, REST
from ..terminal import label, pct
from .collect import no_comparison, unbuilt

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:20px;
color:#1d1d1f;background:#fff;max-width:1360px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid
#ddd;padding-bottom:4px}p,li{font-size:13px;line-height:1.45}
table{border-collapse:collapse;font-size:12px;margin:6px 0 14px;max-width:100%}
th,td{border:1px solid #d0d0d0;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f1f3f6;cursor:pointer;user-select:none;white-space:normal}
th:after{content:" \\2195";color:#aaa;font-size:10px}
th.asc:after{content:" \\2191";color:#333}th.desc:after{content:" \\2193";color:#333}
td.l,th.l{text-align:left}td.l{white-space:normal;overflow-wrap:anywhere;min-width:6em}
tr.spill td{background:#fff1f0}tr.near td{background:#fff8e1}
tr.fail td{background:#fde2e1}td.fail{color:#a40000;font-weight:600}
img{max-width:100%;border:1px solid #e3e3e3}
code{background:#f4f4f4;padding:0 3px}.muted{color:#666}.bad{color:#a40000}
"""

#: Click-to-sort for every table (numbers by value: '25.0%', '+14.4 KB', '1 -> 2' read as
#: their first number; '-' and empty cells last).
_SCRIPT = """
function fsKey(t){
 var m=t.replace(/,/g,'').match(/^[^0-9+\\-.]*([+\\-]?[0-9]*\\.?[0-9]+(e[+\\-]?[0-9]+)?)/i);
 return m&&t.trim()!=='-'?parseFloat(m[1]):null}
document.querySelectorAll('table').forEach(function(tb){
 tb.querySelectorAll('th').forEach(function(th,i){th.title='sort by this column';
  th.addEventListener('click',function(){
   var body=tb.tBodies[0],rows=Array.prototype.slice.call(body.rows);
   var dir=th.classList.contains('asc')?-1:1;
   tb.querySelectorAll('th').forEach(function(h){h.classList.remove('asc','desc')});
   th.classList.add(dir>0?'asc':'desc');
   rows.sort(function(a,b){
    var x=a.cells[i]?a.cells[i].textContent:'',y=b.cells[i]?b.cells[i].textContent:'';
    var p=fsKey(x),q=fsKey(y);
    if(p!==null&&q!==null)return dir*(p-q);
    if(p===null&&q!==null)return 1;if(q===null&&p!==null)return -1;
    return dir*x.localeCompare(y)});
   rows.forEach(function(r){body.appendChild(r)})})})});
"""


def _img(path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{escape(Path(path).stem)}" src="data:image/png;base64,{data}">'


def _table(head, rows, left=(), classes=None) -> str:
    """A sortable table. A row is a list of cells; a cell is a value or ``(value, attrs)``
    where attrs is e.g. ``'colspan="9" class="l fail"'``."""
    h = "".join(f'<th class="l">{escape(c)}</th>' if c in left else f"<th>{escape(c)}</th>"
                for c in head)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = []
        for c, v in zip(head, row):
            if isinstance(v, tuple):
                cells.append(f"<td {v[1]}>{escape(str(v[0]))}</td>")
            else:
                cells.append(f'<td class="l">{escape(str(v))}</td>' if c in left
                             else f"<td>{escape(str(v))}</td>")
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{h}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def default_kernel_sentence(targets, kernels: Mapping) -> str:
    """'Default kernel: sm90 runs ...; gfx942 runs ...' for the targets that ``kernels``
    (target -> the config label the library runs there, :meth:`Report.default_kernels`)
    describes; '' when it describes none of them."""
    said = [f"{escape(t)}: {escape(str(kernels[t]))}" for t in targets if t in kernels]
    if not said:
        return ""
    return ("<p>Kernel that <code>flashscope.attention</code> runs by default on each "
            "target: " + "; ".join(said) + ".</p>")


def failed_note(rows) -> str:
    """Lines naming every build that failed and every config its target cannot run, with
    the reason (the tables show them too)."""
    def items(bad):
        return "".join(f"<li><code>{escape(label(r.config))}</code> D{r.head_dim} on "
                       f"{escape(r.target)}: {escape(r.error or 'no record')}</li>"
                       for r in bad)
    failed = [r for r in rows if r.record is None and not r.refused]
    refused = [r for r in rows if r.record is None and r.refused]
    out = ""
    if failed:
        out += (f'<p class="bad">{len(failed)} of {len(rows)} builds failed; they appear as '
                f"FAILED in the tables and the plots:</p><ul>{items(failed)}</ul>")
    if refused:
        out += (f"<p>{len(refused)} of {len(rows)} configs do not fit their target (a rule "
                f"or a limit); they appear as NOT BUILT in the tables and the plots:</p>"
                f"<ul>{items(refused)}</ul>")
    return out


def _defaults_section(report) -> str:
    """The kernel each target runs by default, read from its binary: on sm90 the Gluon
    kernel, elsewhere the portable one (the budget model counts one sm90 consumer)."""
    if not report.defaults:
        return ""
    head = ["target", "D", "runs by default", "registers", "spills", "shared bytes",
            "occupancy", "limiter", "predicted", "error"]
    rows, classes = [], []
    for r in report.defaults:
        rec, c = r.record, r.comparison
        if rec is None:
            rows.append([r.target, r.head_dim, r.config.label, unbuilt(r.refused, r.error)[0],
                         "-", "-", "-", (r.error or "")[:60], "-", "-"])
            classes.append("spill")
            continue
        rows.append([r.target, r.head_dim, r.config.label, rec.registers, r.spill_cell,
                     rec.shared_bytes, pct(r.occ.occupancy if r.occ else None),
                     ",".join(r.occ.limiter) if r.occ else "-",
                     "-" if c is None else f"{c['predicted']:.0f}",
                     "-" if c is None else f"{c['error']:+.0f} ({100 * c['rel_error']:+.0f}%)"])
        classes.append("spill" if r.spills else "")
    return ("<h2>The kernel that runs</h2><p>What <code>flashscope.attention</code> runs on "
            "each target by default, and its resources as compiled: on sm90 the Gluon "
            "kernel (<code>sm90-fwd</code>: a TMA producer warp and one consumer warpgroup "
            "per 64 rows; registers are the consumers' setmaxnreg budget), elsewhere the "
            "portable Triton kernel (<code>triton-fwd</code>), which the tables below "
            "study.</p>"
            + _table(head, rows, left=("target", "runs by default", "limiter"),
                     classes=classes))


def _neighbours_section(report) -> str:
    """Each AMD default next to its neighbours, as the offline choice reads them."""
    from ..tune.offline import TERMS
    from .cliffs import NEAR

    if not report.choices:
        return ""
    head = ["target", "D", "role", "move", "config", "VGPRs", "spills", "waves/SIMD",
            "workgroups", "occupancy", "verdict"]
    rows, classes = [], []
    for ch in report.choices:
        for v in ch.verdicts():
            rows.append([ch.cell.target, ch.cell.head_dim, v["role"], v["move"], v["config"],
                         *("-" if v[k] is None else v[k] for k in
                           ("vgprs", "spills", "waves_per_simd", "workgroups")),
                         pct(v["occupancy"]), v["verdict"]])
            classes.append({"spills": "spill", "failed": "fail", "no-launch": "fail",
                            "cliff": "near", "repeats": "near"}.get(v["kind"], ""))
    return ("<h2>AMD defaults and their neighbours</h2><p>The default of each AMD target "
            "and head dim next to every config one knob (or one of the paired two-knob "
            "moves) away, compiled and judged as <code>flashscope tune offline</code> "
            "judges them: a config that spills or uses scratch is out (red), so is one "
            "whose waves repeat each other's matrix instructions, and one just past an "
            f"occupancy cliff, within {NEAR['registers']} VGPRs or "
            f"{NEAR['shared_mem'] // 1024} KB of LDS of gaining a workgroup (yellow); the "
            f"rest are ranked by {escape(', then '.join(TERMS))}. The verdict says which "
            "term each one lost on.</p>"
            + _table(head, rows, left=("target", "role", "move", "config", "verdict"),
                     classes=classes))


def _budget_section(report) -> str:
    head = ["config", "D", "target", "measured", "spills", *COMPONENTS, "predicted", "error",
            "dominant", "occupancy", "limiter"]
    span = len(head) - 4
    rows, classes = [], []
    for r in report.main_rows():
        if r.comparison is None:
            cell, reason = no_comparison(r)
            rows.append([label(r.config), r.head_dim, r.target, (cell, 'class="fail"'),
                         (reason, f'colspan="{span}" class="l"')])
            classes.append("fail")
            continue
        c, b = r.comparison, r.budget
        rows.append([label(r.config), r.head_dim, r.target, c["measured"], r.spills,
                     *[f"{b.parts[k]:.0f}" for k in COMPONENTS], f"{c['predicted']:.0f}",
                     f"{c['error']:+.0f} ({100 * c['rel_error']:+.0f}%)", c["dominant"],
                     pct(r.occ.occupancy if r.occ else None),
                     ", ".join(r.occ.limiter) if r.occ else "-"])
        classes.append("spill" if c["spilled"] else "")
    legend = "".join(f"<li><code>{k}</code>: {escape(v)}</li>"
                     for k, v in COMPONENT_LABELS.items())
    summ = []
    for t, s in report.model_summary().items():
        dom = ", ".join(f"{k} {v}" for k, v in sorted(s["dominant"].items(),
                                                      key=lambda kv: -kv[1]))
        summ.append([t, s["rows"], s["spilled"], pct(s["mean_abs_rel_error"]),
                     pct(s["max_abs_rel_error"]), dom])
    return (
        "<h2>Where the registers go</h2>"
        "<p>Measured registers per thread (NVIDIA) or unified VGPRs per lane (AMD), read from "
        "the compiled binaries, beside the analytic budget of the long-lived structures (per "
        f"thread; <code>rest</code> is a fixed {REST}). error = predicted &minus; measured. "
        "Rows in red spill: their count is what the allocator was allowed, not the demand. "
        "Click a column's header to sort by it.</p>"
        f"<ul>{legend}</ul>"
        + _table(head, rows, left=("config", "target", "dominant", "limiter"),
                 classes=classes)
        + "<p>How well the model predicts (error over the rows that do not spill):</p>"
        + _table(["target", "rows", "spilling", "mean |error|", "max |error|", "dominant"],
                 summ, left=("target", "dominant")))


def ablation_cell(e) -> object:
    """One target's cell of an ablation step (registers, spills, occupancy, register file
    per wave), or FAILED with the reason."""
    if e is None:
        return ""
    if "d_registers" not in e:
        bad = e["before"] if not e["before"]["ok"] else e["after"]
        cell = unbuilt(bad.get("refused", False), None)[0]
        return (cell + (f": {bad['error']}" if bad.get("error") else " (not built)"),
                'class="l fail"')
    return (f"{e['before']['registers']} -> {e['after']['registers']} regs "
            f"({e['d_registers']:+d}), spills {e['d_spills']:+d}, occupancy "
            f"{pct(e['before']['occupancy'])} -> {pct(e['after']['occupancy'])}, "
            f"file/wave {e['d_file_bytes_per_wave'] / 1024:+.1f} KB")


def _ablation_section(report) -> str:
    names = [t.name for t in report.spec.targets]
    head = ["step", "before", "after", *names]
    rows = [[a["name"], f"{a['before']} D{a['head_dim_before']}",
             f"{a['after']} D{a['head_dim_after']}",
             *[ablation_cell(a["targets"][n]) for n in names]] for a in report.ablations]
    return ("<h2>Ablations (compiled, not estimated)</h2>"
            "<p>One knob changed at a time from the base config; NVIDIA and AMD side by side, "
            "one cell per target. <em>file/wave</em> = d registers &times; lanes &times; 4 "
            "bytes: the same per-thread growth costs a 64-lane CDNA wavefront twice the "
            "register file of a 32-lane warp.</p>"
            + _table(head, rows, left=("step", "before", "after", *names)))


def _cliff_section(report) -> str:
    head = ["target", "config", "D", "resource", "now", "save to gain", "blocks",
            "occupancy now", "after saving", "room before loss"]
    rows, classes = [], []
    for c in report.cliffs:
        rows.append([c["target"], c["config"], c["head_dim"], c["resource"], c["value"],
                     c["save_to_gain"], f"{c['active_blocks']} -> {c['blocks_after']}",
                     pct(c["occupancy"]), pct(c["occupancy_after"]),
                     "-" if c["room_before_loss"] is None else c["room_before_loss"]])
        classes.append("near" if c["near"] else "")
    return ("<h2>Occupancy cliffs</h2><p>For each target, the saving of one resource that "
            "gains a block (workgroup) per SM (CU/WGP); highlighted rows are just past a "
            "cliff (within 16 registers or 8 KB).</p>"
            + _table(head, rows, left=("target", "config", "resource"), classes=classes))


def page(title: str, meta: str, body: str) -> str:
    """The page around ``body`` (HTML): the one head, style and sort script of every
    report."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width">'
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class=\"muted\">{meta}</p>{body}"
            f"<script>{_SCRIPT}</script></body></html>")


def write_html(report, path, plots: dict, extra: str = "",
               default_kernels: Optional[Mapping] = None) -> str:
    """Write the page to ``path``; ``plots`` maps names to PNG paths (embedded inline);
    ``extra``: more sections (HTML) placed before the plots; ``default_kernels`` adds to or
    replaces the report's own per-target description of the kernel that runs by default
    (:meth:`Report.default_kernels`)."""
    s = report.spec
    title = "flashscope report: register budget and occupancy cliffs"
    meta = escape(f"targets {', '.join(t.name for t in s.targets)}; head dims "
                  f"{', '.join(map(str, s.head_dims))}; {s.dtype}; "
                  f"{'causal' if s.causal else 'non-causal'}; ablation base {label(s.base)}; "
                  f"{report.timings.get('kernels', 0)} kernels")
    imgs = "".join(f"<h2>{escape(k)}</h2>{_img(v)}" for k, v in plots.items())
    kernels = {**report.default_kernels(), **(default_kernels or {})}
    body = (default_kernel_sentence([t.name for t in s.targets], kernels)
            + failed_note(report.main_rows()) + _defaults_section(report)
            + _neighbours_section(report) + _budget_section(report)
            + _ablation_section(report) + _cliff_section(report)
            + extra + imgs)
    Path(path).write_text(page(title, meta, body), encoding="utf-8")
    return str(path)
