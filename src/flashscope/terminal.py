"""Terminal output, one way for every command and report: rich consoles that print text
as given, tables that fit the width by wrapping cells at spaces, and percentages with one
decimal.

Widths: the terminal's own, or 100 columns when stdout is a pipe or a file (``COLUMNS``
overrides it), so a redirected table reads the same as one on a 100-column terminal. No
cell is cut to an ellipsis: :func:`fit` sizes the columns so that long labels (config
labels, kernel names) wrap onto a second line instead. Markup is off: text in brackets,
such as a config label ``[m128n64w4s3q1]``, prints as it is.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Iterable

#: Width of tables written to a pipe or a file (``COLUMNS`` overrides it).
REDIRECTED_WIDTH = 100


def label(config) -> str:
    """The label a table prints for a config (a config record, or its dict as records and
    JSON documents hold it): the one place that decides how configs read on screen."""
    if config is None:
        return "-"
    if isinstance(config, dict):
        return str(config.get("label") or config.get("key")
                   or ",".join(f"{k}={v}" for k, v in config.items()))
    return config.label


def console(stderr: bool = False):
    """A rich console that prints text as given (no markup, emoji or highlighting: a
    config label in brackets stays), the terminal's width, or 100 columns when
    redirected."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not (hasattr(stream, "isatty") and stream.isatty()):
        width = int(os.environ.get("COLUMNS") or 0) or REDIRECTED_WIDTH
    return Console(file=stream, width=width, markup=False, emoji=False, highlight=False,
                   soft_wrap=False)


def table(*columns, title: str = "", left: Iterable[str] = ()):
    """A rich table whose cells wrap at spaces rather than end in an ellipsis (see
    :func:`fit`). Columns named in ``left`` are left-aligned (text), the rest
    right-aligned (numbers)."""
    from rich import box
    from rich.table import Table

    left = set(left)
    t = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, show_edge=False, padding=(0, 1, 0, 0))
    for c in columns:
        t.add_column(c, overflow="fold", justify="left" if c in left else "right")
    return t


def _cell_widths(text: str) -> tuple:
    """(longest word, longest line) of a cell."""
    from rich.cells import cell_len

    lines = str(text).splitlines() or [""]
    words = [w for line in lines for w in line.split()] or [""]
    return max(cell_len(w) for w in words), max(cell_len(line) for line in lines)


def fit(tab, width: int):
    """Give each column of ``tab`` a fixed width so that the table fits ``width`` and
    cells break at spaces: every column gets its longest word, then the room left goes,
    one character at a time, to the column whose longest cell would wrap onto the most
    lines (so rows stay as short as the width allows). Only a table whose longest words
    alone overflow folds inside words; headers fold before cells do."""
    gaps = 2 * len(tab.columns) - 1  # one space of padding per column, one between
    room = width - gaps
    lo, hi = [], []
    for col in tab.columns:
        sizes = [_cell_widths(c) for c in (col.header, *col._cells)]
        lo.append(max(a for a, _ in sizes))
        hi.append(max(b for _, b in sizes))
    if sum(lo) > room:  # let headers fold rather than cells
        lo = [max([1] + [_cell_widths(c)[0] for c in col._cells]) for col in tab.columns]
    if sum(hi) <= room:
        widths = hi
    elif sum(lo) > room:
        return tab  # rich folds what it must
    else:  # one column at a time to whichever would wrap onto the most lines
        widths = list(lo)
        for _ in range(room - sum(lo)):
            open_ = [i for i in range(len(widths)) if widths[i] < hi[i]]
            i = max(open_, key=lambda k: (-(-hi[k] // widths[k]), hi[k] - widths[k]))
            widths[i] += 1
    for col, w in zip(tab.columns, widths):
        col.width = max(1, w)
    return tab


def show(con, *renderables) -> None:
    """Print tables (fitted to the console's width) and lines on ``con``."""
    from rich.table import Table

    for r in renderables:
        con.print(fit(r, con.width) if isinstance(r, Table) else r)


def pct(x, digits: int = 1) -> str:
    """Occupancy and other fractions, one way everywhere: ``0.375`` -> ``37.5%``."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{100 * x:.{digits}f}%"
