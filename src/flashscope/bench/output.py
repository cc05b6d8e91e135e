"""Benchmark output: a rich table for the terminal, the stamp of a run (date, device,
versions, exact command) that heads its JSON document and sits beside its CSV as
``bench.meta.json``, PNG charts (TFLOP/s against N), and a markdown table for the docs."""

from __future__ import annotations

import datetime
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Optional

from ..errors import unknown

#: metric name -> (Result attribute, column title, format)
METRICS = MappingProxyType({
    "latency": ("ms", "time (ms)", "{:.3f}"),
    "tflops": ("tflops", "TFLOP/s", "{:.1f}"),
    "speedup": ("speedup", "x base", "{:.2f}"),
    "gemm": ("pct_gemm", "% GEMM", "{:.1f}"),
    "copy": ("pct_copy", "% copy", "{:.1f}"),
    "bandwidth": ("gbps", "GB/s", "{:.0f}"),
    "memory": ("peak_mib", "peak (MiB)", "{:.0f}"),
    "host": ("host_us", "host (us/call)", "{:.0f}"),
    "error": ("max_rel_error", "rel err", "{:.1e}"),
})


def parse_metrics(text: Optional[str]) -> list:
    if not text:
        return list(METRICS)
    names = [m.strip() for m in text.split(",") if m.strip()]
    for m in names:
        if m not in METRICS:
            raise unknown("--metrics", m, METRICS)
    return names


def _git_commit() -> Optional[str]:
    try:
        # "-dirty" when the files that ran differ from the commit
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"],
                             capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def stamp(device, *, argv=None, baseline=None, ceilings=None, timer=None) -> dict:
    """Who, what and where of a run, written at the top of every results file."""
    import torch
    import triton

    from .. import __version__

    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() \
        or platform.machine()
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "triton": triton.__version__, "flashscope": __version__,
                "cuda": torch.version.cuda, "hip": torch.version.hip,
                "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None}
    argv = sys.argv[1:] if argv is None else argv
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": name,
        "versions": versions,
        "git_commit": _git_commit(),
        "command": shlex.join(["flashscope", *argv]),
        "baseline": baseline,
        "ceilings": None if ceilings is None else {
            "gemm_tflops": ceilings.flops / 1e12, "copy_gbps": ceilings.bandwidth / 1e9,
            "source": ceilings.source},
        "timer": None if timer is None else {
            "cuda_graph": timer.cuda_graph, "hide_host": timer.hide_host,
            "warmup_ms": timer.warmup_ms,
            "rep_ms": timer.rep_ms, "rounds": timer.rounds,
            "statistic": "median" if timer.rounds == 1 else "median of round medians"},
    }


def _fmt(value, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def reason(r) -> str:
    """What a row's reason column says: why it failed or was skipped, or for a timing the
    events may have taken from the host (``host_bound``), how to time the GPU alone."""
    if r.reason or not r.host_bound:
        return r.reason
    return (f"host-bound? the host takes {r.host_us:.0f} us to queue a call, "
            f"{1e3 * r.ms:.0f} us measured: --hide-host or --cuda-graph time the GPU alone")


def table(results, metrics, title: str = ""):
    """The terminal table: one row per (case, provider); failed rows in red with the
    reason, unsupported and unavailable ones dimmed."""
    from ..terminal import table as make_table

    t = make_table("case", "provider", "status", *(METRICS[m][1] for m in metrics), "reason",
                   title=title, left=("case", "provider", "status", "reason"))
    for r in results:
        style = {"ok": None, "failed": "red", "error": "red"}.get(r.status, "dim")
        t.add_row(r.case.label, r.provider, r.status,
                  *(_fmt(getattr(r, METRICS[m][0]), METRICS[m][2]) for m in metrics),
                  reason(r), style=style)
    return t


def plot(path, results, meta: dict) -> Optional[Path]:
    """TFLOP/s against N, one panel per (mode, dtype, D, causal, window, cap, layout),
    one line per provider."""
    ok = [r for r in results if r.status == "ok" and r.case.Nq == r.case.Nk]
    if not ok:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def panel(c):
        return c.mode, c.dtype, c.D, c.causal, c.kind

    panels = sorted({panel(r.case) for r in ok}, key=str)
    ncol = min(4, len(panels))
    nrow = -(-len(panels) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow), squeeze=False)
    for ax, key in zip(axes.flat, panels):
        mode, dtype, D, causal, kind = key
        for prov in dict.fromkeys(r.provider for r in ok):
            pts = sorted((r.case.Nq, r.tflops) for r in ok if r.provider == prov
                         and panel(r.case) == key)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=prov)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{mode} {dtype} D={D} {'causal' if causal else 'full'} {kind}".strip(),
                     fontsize=9)
        ax.set_xlabel("N")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{meta.get('device')}  {meta.get('date')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


RATIO_AGAINST = ("sdpa-cudnn", "fa4")


def round_ratios(subject, peers) -> "tuple | None":
    """(median, lowest, highest) over rounds of the fastest peer's time over the
    subject's in the same round, or None unless every one has the same two or more
    rounds. Within a round the providers run back to back, so the clock's drift between
    rounds (5-15% on an H100) cancels in the ratio."""
    runs = [r for r in (subject, *peers) if r is not None and r.status == "ok"]
    if subject not in runs or len(runs) < 2:
        return None
    n = len(subject.ms_rounds)
    if n < 2 or any(len(r.ms_rounds) != n for r in runs):
        return None
    ratios = sorted(min(r.ms_rounds[i] for r in runs if r is not subject)
                    / subject.ms_rounds[i] for i in range(n))
    return statistics.median(ratios), ratios[0], ratios[-1]


#: what a markdown table's cells show: metric -> the line that heads them
MARKDOWN_VALUES = MappingProxyType({
    "tflops": "TFLOP/s (median; FLOPs 4 B H Nq Nk D, x0.5 causal, per sequence when packed, "
              "4 H D per visible pair with a window; x2.5 bwd, x3.5 fwd+bwd):",
    "bandwidth": "GB/s (median; the cache's K and V bytes over the time; copy: the bytes "
                 "read and written):",
})


def markdown(results, meta: dict, subject: str = "flashscope", metric: str = "tflops") -> str:
    """A table of ``metric`` (TFLOP/s, or GB/s for decoding; rows: mode, D, N, mask;
    columns: providers) with subject/peer ratios, headed by the stamp. Failed cells say
    so; unsupported ones are blank."""
    attr = METRICS[metric][0]
    providers = list(dict.fromkeys(r.provider for r in results
                                   if r.status not in ("unavailable",)))
    cells = {(r.case, r.provider): r for r in results}
    cases = list(dict.fromkeys(r.case for r in results))
    peers = [p for p in RATIO_AGAINST if p in providers and subject in providers]
    per_round = any(len(r.ms_rounds) > 1 for r in results) and bool(peers)
    head = ["mode", "dtype", "shape", "causal", *providers,
            *(f"{subject} / {p}" for p in peers),
            *([f"{subject} / faster peer, per round: median (range)"] if per_round else [])]
    lines = [f"Date {meta.get('date')}, device {meta.get('device')}, versions "
             f"{', '.join(f'{k} {v}' for k, v in (meta.get('versions') or {}).items() if v)}"
             f", commit {meta.get('git_commit')}.", "",
             f"Command: `{meta.get('command')}`", ""]
    ceil = meta.get("ceilings")
    if ceil:
        lines += [f"Ceilings measured in the same run: bf16 GEMM 8192^3 "
                  f"{ceil['gemm_tflops']:.0f} TFLOP/s, device-to-device copy "
                  f"{ceil['copy_gbps']:.0f} GB/s.", ""]
    lines += [MARKDOWN_VALUES[metric], "", "| " + " | ".join(head) + " |",
              "|" + "---|" * len(head)]
    for c in cases:
        row = [c.mode, "bf16" if c.dtype == "bfloat16" else "fp16", c.shape,
               ("yes" if c.causal else "no") + (f" ({c.kind})" if c.kind else "")]
        for p in providers:
            r = cells.get((c, p))
            row.append("" if r is None or r.status in ("unsupported", "unavailable") else
                       f"{getattr(r, attr):.0f}{'*' if r.host_bound else ''}"
                       if r.status == "ok" else r.status)
        for p in peers:
            a, b = cells.get((c, subject)), cells.get((c, p))
            va, vb = (getattr(x, attr, None) if x else None for x in (a, b))
            row.append(f"{va / vb:.2f}" if va and vb else "")
        if per_round:
            rr = round_ratios(cells.get((c, subject)), [cells.get((c, p)) for p in peers])
            row.append(f"{rr[0]:.3f} ({rr[1]:.3f}-{rr[2]:.3f})" if rr else "")
        lines.append("| " + " | ".join(row) + " |")
    if any(r.host_bound for r in results):
        lines += ["", "\\* host-bound: the host took at least half as long to queue a call "
                  "as the events measured, so part of the time may be the host's "
                  "(`--hide-host` or `--cuda-graph` time the GPU alone)."]
    bad = [r for r in results if r.status in ("failed", "error")]
    if bad:
        lines += ["", "Failed or errored:", ""]
        lines += [f"- {r.provider} {r.case.label}: {r.reason}" for r in bad]
    return "\n".join(lines) + "\n"
