"""``flashscope profile --lines``: one launch's warp stalls and executed instructions per
source line (:mod:`flashscope.profile.lines`), in the terminal, as JSON, or into --out."""

from __future__ import annotations

import json
import sys


def _artifact(args, shape, config: str):
    """The config built offline for --target at --shape (what the page is joined to when
    no --binary is given)."""
    from .. import compile as fcompile
    from ..config import AttentionConfig, select_config

    B, H, N, D = shape
    dtype = {"bf16": "bfloat16", "fp16": "float16"}[args.dtype]
    cfg = AttentionConfig.parse(config) if config else select_config(D, dtype, args.causal,
                                                                      args.target)
    return fcompile.build(cfg, args.target, head_dim=D, dtype=dtype, causal=args.causal,
                          problem=(B, H, H, N, N))


def run_lines(args) -> int:
    from ..errors import FlashscopeError
    from ..profile.lines import profile_lines, record
    from .profile import parse_shape

    shape = parse_shape(args.shape)
    configs = [c.strip() for c in args.configs.split(";") if c.strip()]
    if len(configs) > 1:
        raise FlashscopeError("--lines profiles one launch: give one config in --configs")
    if args.csv or args.from_csv:
        raise FlashscopeError("--lines reads a source page (--source-page), not --csv/--from-csv")
    if args.top < 0:
        raise FlashscopeError(f"--top {args.top}: expected 0 (all lines) or more")
    config = configs[0] if configs else ""
    if args.source_page:
        if args.binary:
            view, page = profile_lines(args.source_page, binary=args.binary,
                                       kernel_name=args.kernel_name)
        else:
            view, page = profile_lines(args.source_page, artifact=_artifact(args, shape, config),
                                       kernel_name=args.kernel_name)
        page_path = args.source_page
    else:
        import tempfile

        out = args.out or tempfile.mkdtemp(prefix="flashscope-lines-")
        page_path, cache = record(shape, args.dtype, args.causal, config, out, args.ncu)
        view, page = profile_lines(page_path, binary=cache, kernel_name=args.kernel_name)
    result = {"source_page": page_path, "kernel": view.kernel, "config": config,
              "shape": dict(zip("BHND", shape)), "lines": view.as_dict(),
              "stalls_by_reason": _reasons(view)}
    if args.out:
        from pathlib import Path

        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "lines_profile.json").write_text(json.dumps(result, indent=1))
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        _print(view, result, args.top)
    return 0


def _reasons(view) -> dict:
    from ..profile.source_page import by_reason

    return dict(sorted(by_reason(view.rows).items(), key=lambda kv: -kv[1]))


def _print(view, result, top: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from .lines_view import _fmt, _short, head

    console = Console(width=None if sys.stdout.isatty() else 200)
    total = sum((r.counters or {}).get("stall_samples", 0) for r in view.rows) or 1.0
    rows = [r for r in view.rows if r.counters]
    if top:
        rows = sorted(rows, key=lambda r: -r.counters.get("stall_samples", 0))[:top]
    t = Table(title=f"{view.kernel}@{view.target}: {head(view)}", title_justify="left")
    for col in ("line", "source", "warp instr executed", "stall samples", "share",
                "top reasons", "instr", "live max"):
        t.add_column(col, justify="left" if col in ("line", "source", "top reasons")
                     else "right")
    for r in rows:
        c = r.counters
        reasons = sorted(((v, k[len("stall."):]) for k, v in c.items()
                          if k.startswith("stall.") and v), reverse=True)[:2]
        t.add_row(f"{'  ' if r.helper else ''}{_short(r.file)}:{r.line}",
                  (r.source or "").strip()[:56], f"{c.get('instructions_executed', 0):,.0f}",
                  f"{c.get('stall_samples', 0):,.0f}",
                  f"{c.get('stall_samples', 0) / total:.1%}",
                  ", ".join(f"{k} {v / total:.1%}" for v, k in reasons), str(r.count),
                  _fmt(r.live_registers_max))
    console.print(t)
    console.print("stalls by reason: " + ", ".join(
        f"{k} {v / total:.1%}" for k, v in list(result["stalls_by_reason"].items())[:8]))
