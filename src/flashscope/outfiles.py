"""The files flashscope writes, written one way: strict JSON (no NaN or Infinity, which
other readers refuse), CSV with the header row first (``csv.DictReader`` and pandas read it
as it is; metadata goes in a JSON file beside it), and every file written whole, through a
temporary file renamed into place, so a killed process leaves the old file or the new one,
never half of one.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path


def write_atomic(path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder, renamed into
    place: a killed process leaves the old file or the new one."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would make results private
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return p


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def plain(value):
    """``value`` with non-finite floats as None (strict JSON has no NaN or Infinity) and
    tuples as lists, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class PartialLines:
    """A JSON-lines file of finished results, one line each, flushed to disk as it is
    added, so a run stopped by a signal or a time limit keeps every finished result;
    :meth:`close` removes it once the whole result file holds them all. Opened on the
    first line (``path`` may be a callable returning the path then), so a run refused
    before any result writes nothing; a ``path`` of None keeps nothing."""

    def __init__(self, path):
        self.path = path
        self.fh = None

    def add(self, row: dict) -> None:
        if self.path is None:
            return
        if self.fh is None:
            self.fh = open(self.path() if callable(self.path) else self.path, "w",
                           encoding="utf-8")
        self.fh.write(json.dumps(plain(row), default=str, allow_nan=False) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            os.unlink(self.fh.name)
            self.fh = None


def json_text(doc) -> str:
    return json.dumps(plain(doc), indent=1, default=str, allow_nan=False) + "\n"


def csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, (list, tuple)):
        return ";".join(csv_cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(plain(value), sort_keys=True, default=str)
    return str(value)


def csv_text(rows: list) -> str:
    """Rows (dicts) as CSV: the header row first, columns in first-seen order."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([csv_cell(r.get(c)) for c in cols])
    return buf.getvalue()
