"""``flashscope report``: where a FlashAttention config's registers go and which configs sit
on which side of an occupancy cliff, per target, NVIDIA and AMD side by side.

- :mod:`.collect`: compile configs x head dims x targets offline (cached), typed rows;
- :mod:`.ablations`: one knob at a time, measured deltas and occupancy steps;
- :mod:`.cliffs`: configs just past a cliff and the saving that crosses back;
- :mod:`.render_terminal`, :mod:`.plots`, :mod:`.html`: the outputs;
- :func:`write_report`: all files into one directory.
"""

from __future__ import annotations

from pathlib import Path

from .collect import (DEFAULT_BASE, DEFAULT_HEAD_DIMS, DEFAULT_TARGETS, Report, ReportSpec,
                      Row, collect, default_configs, load_configs, make_spec)

__all__ = ["DEFAULT_BASE", "DEFAULT_HEAD_DIMS", "DEFAULT_TARGETS", "Report", "ReportSpec",
           "Row", "collect", "default_configs", "load_configs", "make_spec", "write_report"]


def write_json(path, doc) -> str:
    """``doc`` as strict JSON (non-finite numbers as null), written whole: a temporary file
    renamed into place."""
    from ..outfiles import json_text, write_atomic

    return str(write_atomic(path, json_text(doc)))


def write_report(report: Report, out_dir, doc=None) -> dict:
    """Write report.json (``doc``, default ``report.as_dict()``), budget.png,
    staircase.png and report.html into ``out_dir`` (created if missing); returns
    {name: path}."""
    from .html import write_html
    from .plots import write_plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": write_json(out / "report.json", report.as_dict() if doc is None
                                else doc)}
    plots = write_plots(report, out)
    files.update(plots)
    files["html"] = write_html(report, out / "report.html", plots)
    return files
