"""Progress of long work: a bar on stderr with done/total, elapsed time and ETA when stderr
is a terminal, and nothing at all when it is a pipe or a file (logs stay clean, and a
caller that parses stdout never sees it).

One object serves every long loop (compiles of ``report`` and ``inspect``, sweep points,
benchmark cases)::

    with Progress("compiling", total=len(items)) as bar:
        for item in items:
            ...
            bar.advance()
"""

from __future__ import annotations

import sys
from typing import Optional


def interactive() -> bool:
    """Whether stderr is a terminal a person watches."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


class Progress:
    """A transient rich progress bar on stderr, or a no-op (see the module docstring).

    ``enabled=False`` turns it off whatever stderr is (``--no-progress``)."""

    def __init__(self, what: str, total: Optional[int] = None, enabled: bool = True):
        self.what = what
        self.total = total
        self._bar = None
        self._task = None
        if enabled and interactive():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                            TimeRemainingColumn(),
                            console=Console(stderr=True, markup=False, highlight=False),
                            transient=True)

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, done: int, total: Optional[int] = None) -> None:
        """Set the count done (and the total, when it is known only now)."""
        if self._task is not None:
            self._bar.update(self._task, completed=done,
                             **({} if total is None else {"total": total}))

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self._bar.advance(self._task, n)

    def note(self, text: str) -> None:
        """A line above the bar (a finished case), on a terminal only."""
        if self._bar is not None:
            self._bar.console.print(text, style="dim")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._task = None
