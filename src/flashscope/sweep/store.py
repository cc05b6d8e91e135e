"""Sweep results as JSONL, one record per line, each appended atomically.

Writing: a record is serialized to one line and written with a single ``os.write`` on a
file opened with ``O_APPEND``, then ``fsync``-ed before :meth:`ResultStore.append`
returns. A process killed (even by SIGKILL) between records loses nothing; one killed
inside a write leaves at most a torn last line with no newline. Readers ignore such a
line; the writer cuts it off when it reopens the file (``--resume``), so it never joins
the next record. A malformed line anywhere else is an error (the file was edited or
damaged), never skipped silently.

Each record carries ``key``: the identity of the work it finishes (kind, problem, config,
shape), which ``--resume`` uses to skip finished work.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ArtifactError, FlashscopeError


def work_key(kind: str, problem, config, shape: "str | None" = None,
             kernel: str = "fwd") -> str:
    """``offline|sm90|bfloat16|64|causal|m128n64w4s3q1[|4,32,4096,64]``; a backward
    kernel's name follows the kind (``offline|bwd_dq|sm90|...``)."""
    parts = [kind, *([] if kernel == "fwd" else [kernel]), problem.target, problem.dtype,
             str(problem.head_dim), "causal" if problem.causal else "full", config.key]
    if shape:
        parts.append(shape)
    return "|".join(parts)


def read_records(path) -> list:
    """Every complete record of a JSONL file; a torn last line is ignored."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ArtifactError(f"{p}: cannot read ({e.strerror or e})") from None
    complete = data.split(b"\n")[:-1]  # the part after the last newline is torn (or empty)
    out = []
    for i, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise ArtifactError(f"{p}: line {i} is not a JSON object (damaged results "
                                "file; only a torn last line is tolerated)")
        out.append(rec)
    return out


class ResultStore:
    """Append-only JSONL results file (see the module docstring)."""

    def __init__(self, path, *, resume: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not resume:
            raise FlashscopeError(f"--out: {self.path} already holds results; pass --resume "
                                  "to continue that sweep or choose another --out")
        self._repair()
        self.records = read_records(self.path)
        self.done = {r["key"] for r in self.records if "key" in r}
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _repair(self) -> None:
        """Cut a torn last line (a write interrupted by a kill) before appending."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())

    def append(self, record: dict) -> None:
        line = (json.dumps(record, sort_keys=True, default=_plain) + "\n").encode()
        if b"\n" in line[:-1]:
            raise FlashscopeError("result record serialized over several lines")
        view = memoryview(line)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)
        self.records.append(record)
        if "key" in record:
            self.done.add(record["key"])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _plain(v):
    if isinstance(v, (set, tuple)):
        return list(v)
    return str(v)
