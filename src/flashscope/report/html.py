"""One self-contained HTML page: inline CSS, the PNG plots as base64 data URIs, no script and
no network resource, so it opens from a file anywhere (and in an offline browser)."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

from ..budget import COMPONENT_LABELS, COMPONENTS, REST

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;
color:#1d1d1f;background:#fff;max-width:1240px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid
#ddd;padding-bottom:4px}p,li{font-size:13px;line-height:1.45}
table{border-collapse:collapse;font-size:12px;margin:6px 0 14px}
th,td{border:1px solid #d0d0d0;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f1f3f6}td.l,th.l{text-align:left}tr.spill td{background:#fff1f0}
tr.near td{background:#fff8e1}img{max-width:100%;border:1px solid #e3e3e3}
code{background:#f4f4f4;padding:0 3px}.muted{color:#666}
"""


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _img(path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{escape(Path(path).stem)}" src="data:image/png;base64,{data}">'


def _table(head, rows, left=(), classes=None) -> str:
    h = "".join(f'<th class="l">{escape(c)}</th>' if c in left else f"<th>{escape(c)}</th>"
                for c in head)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td class="l">{escape(str(v))}</td>' if c in left
                        else f"<td>{escape(str(v))}</td>" for c, v in zip(head, row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{h}</tr>{''.join(body)}</table>"


def _budget_section(report) -> str:
    head = ["config", "D", "target", "measured", "spills", *COMPONENTS, "predicted", "error",
            "dominant", "occupancy", "limiter"]
    rows, classes = [], []
    for r in report.main_rows():
        if r.comparison is None:
            rows.append([r.config.key, r.head_dim, r.target, "-", "-", *[""] * len(COMPONENTS),
                         "-", "-", (r.error or "")[:60], "-", "-"])
            classes.append("spill")
            continue
        c, b = r.comparison, r.budget
        rows.append([r.config.key, r.head_dim, r.target, c["measured"], r.spills,
                     *[f"{b.parts[k]:.0f}" for k in COMPONENTS], f"{c['predicted']:.0f}",
                     f"{c['error']:+.0f} ({100 * c['rel_error']:+.0f}%)", c["dominant"],
                     _pct(r.occ.occupancy if r.occ else None),
                     ",".join(r.occ.limiter) if r.occ else "-"])
        classes.append("spill" if c["spilled"] else "")
    legend = "".join(f"<li><code>{k}</code>: {escape(v)}</li>"
                     for k, v in COMPONENT_LABELS.items())
    summ = []
    for t, s in report.model_summary().items():
        dom = ", ".join(f"{k} {v}" for k, v in sorted(s["dominant"].items(),
                                                      key=lambda kv: -kv[1]))
        summ.append([t, s["rows"], s["spilled"], _pct(s["mean_abs_rel_error"]),
                     _pct(s["max_abs_rel_error"]), dom])
    return (
        "<h2>Where the registers go</h2>"
        "<p>Measured registers per thread (NVIDIA) or unified VGPRs per lane (AMD), read from "
        "the compiled binaries, beside the analytic budget of the long-lived structures (per "
        f"thread; <code>rest</code> is a fixed {REST}). error = predicted &minus; measured. "
        "Rows in red spill: their count is what the allocator was allowed, not the demand.</p>"
        f"<ul>{legend}</ul>"
        + _table(head, rows, left=("config", "target", "dominant", "limiter"),
                 classes=classes)
        + "<p>How well the model predicts (error over the rows that do not spill):</p>"
        + _table(["target", "rows", "spilling", "mean |error|", "max |error|", "dominant"],
                 summ, left=("target", "dominant")))


def _ablation_section(report) -> str:
    names = [t.name for t in report.spec.targets]
    head = ["step", "before", "after"]
    for n in names:
        head += [f"{n} regs", f"{n} d regs", f"{n} d spills", f"{n} occupancy",
                 f"{n} d file/wave"]
    rows = []
    for a in report.ablations:
        row = [a["name"], f"{a['before']} D{a['head_dim_before']}",
               f"{a['after']} D{a['head_dim_after']}"]
        for n in names:
            e = a["targets"][n]
            if "d_registers" not in e:
                row += ["not built", "-", "-", "-", "-"]
                continue
            row += [f"{e['before']['registers']} -> {e['after']['registers']}",
                    f"{e['d_registers']:+d}", f"{e['d_spills']:+d}",
                    f"{_pct(e['before']['occupancy'])} -> {_pct(e['after']['occupancy'])}",
                    f"{e['d_file_bytes_per_wave'] / 1024:+.1f} KB"]
        rows.append(row)
    return ("<h2>Ablations (compiled, not estimated)</h2>"
            "<p>One knob changed at a time from the base config; NVIDIA and AMD side by side. "
            "<em>d file/wave</em> = d registers &times; lanes &times; 4 bytes: the same "
            "per-thread growth costs a 64-lane CDNA wavefront twice the register file of a "
            "32-lane warp.</p>" + _table(head, rows, left=("step", "before", "after")))


def _cliff_section(report) -> str:
    head = ["target", "config", "D", "resource", "now", "save to gain", "blocks",
            "occupancy now", "after saving", "room before loss"]
    rows, classes = [], []
    for c in report.cliffs:
        rows.append([c["target"], c["config"], c["head_dim"], c["resource"], c["value"],
                     c["save_to_gain"], f"{c['active_blocks']} -> {c['blocks_after']}",
                     _pct(c["occupancy"]), _pct(c["occupancy_after"]),
                     "-" if c["room_before_loss"] is None else c["room_before_loss"]])
        classes.append("near" if c["near"] else "")
    return ("<h2>Occupancy cliffs</h2><p>For each target, the saving of one resource that "
            "gains a block (workgroup) per SM (CU/WGP); highlighted rows are just past a "
            "cliff (within 16 registers or 8 KB).</p>"
            + _table(head, rows, left=("target", "config", "resource"), classes=classes))


def write_html(report, path, plots: dict, extra: str = "") -> str:
    """Write the page to ``path``; ``plots`` maps names to PNG paths (embedded inline);
    ``extra``: more sections (HTML) placed before the plots."""
    s = report.spec
    title = "flashscope report: register budget and occupancy cliffs"
    meta = (f"targets {', '.join(t.name for t in s.targets)}; head dims "
            f"{', '.join(map(str, s.head_dims))}; {s.dtype}; "
            f"{'causal' if s.causal else 'non-causal'}; ablation base {s.base.key}; "
            f"{report.timings.get('kernels', 0)} kernels")
    imgs = "".join(f"<h2>{escape(k)}</h2>{_img(v)}" for k, v in plots.items())
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class=\"muted\">{escape(meta)}</p>"
            + _budget_section(report) + _ablation_section(report) + _cliff_section(report)
            + extra + imgs + "</body></html>")
    Path(path).write_text(page, encoding="utf-8")
    return str(path)
