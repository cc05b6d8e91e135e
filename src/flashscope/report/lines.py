"""The report's per-line section (``flashscope report --lines``): registers, spills and
instructions per source line of every kernel in the report, read from the binaries
(:mod:`flashscope.isa.lines`), and the analytic budget checked against measured liveness.

For each kernel: allocation, highest register, live peak and the gap between them, and the
checks. For the ablation base on every target: the kernel's source with a heat strip of
live registers per line (NVIDIA and AMD side by side), marks on lines that spill and on the
lines that issue the most instructions, and the budget's structures linked to the lines
that create them (:data:`STRUCTURES`). At the instruction where the most registers are
live, each live register is attributed to the line whose write reaches it; summing those
lines per structure gives the measured registers of each structure beside the budget's
prediction, and the lines that belong to no structure are what the budget's fixed ``rest``
stands for. That is where the model's error sits, line by line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape

from ..budget import COMPONENT_LABELS
from ..isa.lines import source_lines

#: Budget structure -> patterns of the source lines that create or update it (first match
#: wins, in this order); lines matching none count as ``rest``.
STRUCTURES = (
    ("acc", (r"\bacc\s*=", r"\bacc\b.*=\s*tl\.dot")),
    ("q", (r"\bq\s*=\s*.*(tl\.load|\.load\()",)),
    ("kv", (r"\b(kt|k|v)\s*=\s*.*(tl\.load|\.load\()",)),
    ("p", (r"\bp\s*=", r"\bexp2\(")),
    ("stats", (r"\b(m_i|l_i|m_new|alpha)\s*=",)),
    ("scores", (r"\b(qk|qk_next|s)\s*=", r"tl\.dot\(\s*q\s*,")),
    ("loop", (r"^\s*for\b",)),
)
#: Structures the budget has no part for: what they stand for.
EXTRA_LABELS = {"loop": "written by the loop's own line: values it carries and pipelines "
                        "across iterations (ptxas places some of them there)",
                "unexplained": "live from the kernel's entry (arguments)"}
_COMPILED = tuple((name, tuple(re.compile(p) for p in pats)) for name, pats in STRUCTURES)


def structure_of(source) -> str:
    """The budget structure a source line belongs to (``rest`` when none)."""
    text = (source or "").split("#", 1)[0]
    for name, pats in _COMPILED:
        if any(p.search(text) for p in pats):
            return name
    return "rest"


@dataclass
class LinesSection:
    """Per-line views of the report's kernels, keyed like :meth:`Report.by_key`."""

    views: dict = field(default_factory=dict)  # (config key, head dim, target) -> KernelLines
    errors: dict = field(default_factory=dict)  # same key -> error text
    timings: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"kernels": [{"config": k[0], "head_dim": k[1], "target": k[2],
                             **v.as_dict()} for k, v in self.views.items()],
                "errors": [{"config": k[0], "head_dim": k[1], "target": k[2], "error": e}
                           for k, e in self.errors.items()],
                "timings": self.timings}


def collect_lines(report, jobs: int = 0) -> LinesSection:
    """The per-line view of every kernel the report compiled (cache hits by now)."""
    import resource
    import time

    from .. import compile as fcompile
    from ..isa.lines import lines_for_artifacts

    t0, c0 = time.perf_counter(), _cpu(resource)
    sec = LinesSection()
    keys, arts = [], []
    for r in report.rows:
        if r.record is None:
            continue
        key = (r.config.key, r.head_dim, r.target)
        arts.append(fcompile.build(r.config, r.target, head_dim=r.head_dim,
                                   dtype=report.spec.dtype, causal=report.spec.causal,
                                   **dict(report.spec.variant)))
        keys.append(key)
    for key, view in zip(keys, lines_for_artifacts(arts)):
        if isinstance(view, Exception):
            sec.errors[key] = str(view)
        else:
            sec.views[key] = view
    sec.timings = {"lines_s": round(time.perf_counter() - t0, 3),
                   "lines_cpu_s": round(_cpu(resource) - c0, 3), "lines_kernels": len(arts)}
    return sec


def _cpu(resource) -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measured_structures(view) -> dict:
    """{structure: registers live at the peak that its lines wrote} (with ``rest`` and
    ``unexplained``: live from the kernel's entry)."""
    out = {name: 0 for name, _ in STRUCTURES}
    out["rest"] = 0
    peak = view.peak or {}
    for item in peak.get("by_line", []):
        out[structure_of(item.get("source"))] += item["registers"]
    out["unexplained"] = peak.get("unexplained", 0)
    return out


# -- HTML -----------------------------------------------------------------------------

_CSS = (".src td{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px;"
        "padding:0 5px;border:none;border-bottom:1px solid #f0f0f0}.src td.code{white-space:pre;"
        "text-align:left}.src td.heat{min-width:64px}.src tr.none td.code{color:#999}"
        ".mark{color:#c0392b;font-weight:bold}.top{font-weight:bold}")


def _heat(value, cap) -> str:
    if value is None or not cap:
        return ""
    frac = max(0.0, min(1.0, value / cap))
    hue = int(120 * (1 - frac))  # green (few live) to red (at the allocation)
    return f"background:hsl({hue},70%,{88 - 28 * frac:.0f}%)"


def _source_view(views_by_target: dict) -> str:
    """The kernel's own source lines with one heat cell per target."""
    targets = list(views_by_target)
    by_line, files = {}, {}
    for t, v in views_by_target.items():
        tops = sorted((r for r in v.rows if r.count), key=lambda r: -r.count)[:5]
        top_keys = {(r.file, r.line) for r in tops}
        for r in v.rows:
            if "/triton/" in r.file:
                continue
            files.setdefault(r.file, set()).add(r.line)
            by_line.setdefault((r.file, r.line), {})[t] = (r, (r.file, r.line) in top_keys)
    if not files:
        return ""
    path = max(files, key=lambda f: len(files[f]))  # the kernel's file
    lines = sorted(files[path])
    text = source_lines(path, packages=True)  # the report builds its kernels
    head = "".join(f"<th>{escape(t)} live</th>" for t in targets)
    body = []
    for n in range(lines[0], lines[-1] + 1):
        cells = by_line.get((path, n), {})
        src = text[n - 1] if text and n <= len(text) else ""
        if not cells and not src.strip():
            continue
        row = [f"<td>{n}</td><td class=\"code\">{escape(src)}</td>"]
        for t in targets:
            got = cells.get(t)
            if got is None:
                row.append("<td class=\"heat\"></td>")
                continue
            r, top = got
            live = r.live_registers_max
            if live is None and r.inlined:
                live = r.inlined.get("live_registers_max")
            marks = ("<span class=\"mark\" title=\"spills\"> S</span>"
                     if r.spill_stores or r.spill_loads else "")
            label = f"<span class=\"top\">{live}</span>" if top else str(live or "")
            title = (f"{r.count} instructions here, {(r.inlined or {}).get('count', 0)} "
                     f"from helpers inlined here; spills {r.spill_stores}/{r.spill_loads}")
            row.append(f"<td class=\"heat\" style=\"{_heat(live, views_by_target[t].registers)}"
                       f"\" title=\"{escape(title)}\">{label}{marks}</td>")
        struct = structure_of(src) if cells else ""
        row.append(f"<td>{'' if struct in ('', 'rest') else escape(struct)}</td>")
        cls = "" if cells else ' class="none"'
        body.append(f"<tr{cls}>{''.join(row)}</tr>")
    return (f"<p class=\"muted\">{escape(path)}</p><table class=\"src\"><tr><th>line</th>"
            f"<th>source</th>{head}<th>budget</th></tr>{''.join(body)}</table>")


def html_section(report, section: LinesSection) -> str:
    """The HTML of the section (a string to put into the page)."""
    from .html import _table

    rows = []
    for (cfg, hd, t), v in section.views.items():
        ok = sum(c["ok"] for c in v.checks)
        peak = v.peak or {}
        where = f"{peak['file'].rsplit('/', 1)[-1]}:{peak['line']}" if peak.get("file") else "-"
        h = v.highest_register
        high = (f"R{h.get('R')}" if v.vendor == "nvidia" else
                " ".join(f"{c}{h[c]}" for c in ("v", "a", "s") if h.get(c) is not None))
        rows.append([cfg, hd, t, v.registers, high, v.live_peak, v.gap, where,
                     f"{ok}/{len(v.checks)}" + ("" if ok == len(v.checks) else " FAIL")])
    for (cfg, hd, t), e in section.errors.items():
        rows.append([cfg, hd, t, "-", "-", "-", "-", "-", e[:80]])
    summary = _table(["config", "D", "target", "allocated", "highest", "live peak", "gap",
                      "peak at", "checks"], rows, left=("config", "target", "highest",
                                                        "peak at", "checks"))
    base = report.spec.base.key
    hd = report.spec.head_dims[0]
    views = {t.name: section.views[(base, hd, t.name)] for t in report.spec.targets
             if (base, hd, t.name) in section.views}
    budget_rows = []
    for name, v in views.items():
        row = report.by_key().get((base, hd, name))
        if row is None or row.budget is None:
            continue
        meas = measured_structures(v)
        for comp in row.budget.parts:
            budget_rows.append([name, comp, f"{row.budget.parts[comp]:.0f}",
                                meas.get(comp, 0), COMPONENT_LABELS.get(comp, "")])
        for extra, what in EXTRA_LABELS.items():
            budget_rows.append([name, extra, "", meas[extra], what])
        budget_rows.append([name, "total", f"{row.budget.total:.0f}", v.live_peak,
                            f"allocated {v.registers}, gap {v.gap}"])
    budget = _table(["target", "structure", "budget", "live at the peak", "what"],
                    budget_rows, left=("target", "structure", "what"))
    return (f"<style>{_CSS}</style><h2>Registers by source line</h2>"
            "<p>Read from each binary's line table and its own liveness (NVIDIA: equal to "
            "<code>nvdisasm --life-range-mode count</code> where nvdisasm runs). highest + 1 + "
            "the reserved registers is the allocation the binary declares; the live peak sits "
            "under it by the gap (alignment of register groups, fragmentation).</p>"
            + summary
            + f"<h2>The budget against measured liveness ({escape(base)}, D = {hd})</h2>"
            "<p>At the instruction where the most registers are live, each live register is "
            "counted for the line whose write reaches it; the lines of each budget structure "
            "are summed (the <em>budget</em> column of the source below says which). Lines "
            "of no structure are addresses, offsets and loop state: the budget's "
            "<code>rest</code>.</p>" + budget
            + "<h3>Source, live registers per line</h3><p>Each cell: the most registers live "
              "at an instruction of the line (lines that only call inlined helpers: the "
              "helpers' peak), coloured from green to red by the share of the allocation; "
              "<span class=\"mark\">S</span> marks a line that spills, bold the five lines "
              "with the most instructions on that target.</p>"
            + _source_view(views))


def write_json(section: LinesSection, path) -> str:
    import json

    with open(path, "w") as f:
        json.dump(section.as_dict(), f, indent=1, default=str)
    return str(path)
