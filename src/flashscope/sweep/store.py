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

One writer at a time: :class:`ResultStore` holds an exclusive ``flock`` on the file while
it is open, and a second sweep on the same file is refused at once (two writers would
evaluate the same points twice and double their records). The kernel drops the lock when
its holder dies, however it dies, so a killed sweep never leaves a stale lock.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows: no advisory locks, one writer assumed)
    fcntl = None

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


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v) -> bool:
    return v is None or (_is_int(v) and v >= 0)


def _text_list(v) -> bool:
    return v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v))


#: Field -> (check, what it must be) for the fields sweeps write; a record may carry
#: others (they are kept and not read).
RECORD_FIELDS = {
    "key": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "kind": (lambda v: v in ("offline", "gpu"), "'offline' or 'gpu'"),
    "status": (lambda v: v in ("ok", "failed", "pruned"), "'ok', 'failed' or 'pruned'"),
    "target": (lambda v: isinstance(v, str) and v != "", "a target name"),
    "dtype": (lambda v: v in ("bfloat16", "float16"), "'bfloat16' or 'float16'"),
    "head_dim": (lambda v: _is_int(v) and 1 <= v <= 1024, "an integer head dim"),
    "causal": (lambda v: isinstance(v, bool), "true or false"),
    "config": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and (x is None or isinstance(x, (bool, int, str)))
        for k, x in v.items()), "an object of knob values"),
    "config_key": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "kernel": (lambda v: isinstance(v, str) and v != "", "a kernel name"),
    "shape": (lambda v: v is None or isinstance(v, str), "a 'B,H,N,D' string"),
    "search": (lambda v: v is None or isinstance(v, str), "a string"),
    "reason": (lambda v: v is None or isinstance(v, str), "a string"),
    "ms": (lambda v: v is None or (_is_num(v) and v > 0), "a positive number of ms"),
    "tflops": (lambda v: v is None or (_is_num(v) and v >= 0), "a number >= 0"),
    "max_rel_error": (lambda v: v is None or (_is_num(v) and v >= 0), "a number >= 0"),
    "seconds": (lambda v: v is None or (_is_num(v) and v >= 0), "a number of seconds >= 0"),
    "occupancy": (lambda v: v is None or (_is_num(v) and 0 <= v <= 1),
                  "a fraction in 0..1"),
    "limiter": (_text_list, "a list of resource names"),
    "validated_shapes": (_text_list, "a list of shapes"),
    **{k: (_count, "an integer >= 0") for k in (
        "registers", "spill_stores", "spill_loads", "local_bytes", "shared_bytes",
        "threads", "agprs", "sgprs", "vgpr_spills", "active_warps")},
}
#: Fields every record has.
REQUIRED = ("key", "kind", "status", "target", "dtype", "head_dim", "causal", "config",
            "config_key")


def check_record(rec, where: str) -> dict:
    """``rec`` if it is a sweep record as sweeps write it, else an ArtifactError naming
    ``where`` and the first field that is missing or of the wrong type or range."""
    if not isinstance(rec, dict):
        raise ArtifactError(f"{where}: expected a JSON object, got "
                            f"{type(rec).__name__}")
    for k in REQUIRED:
        if k not in rec:
            raise ArtifactError(f"{where}: no '{k}' field (not a flashscope sweep record)")
    for k, (ok, what) in RECORD_FIELDS.items():
        if k in rec and not ok(rec[k]):
            raise ArtifactError(f"{where}: '{k}' is {_shown(rec[k])}, expected {what}")
    if rec["kind"] == "gpu" and rec["status"] != "pruned" and not rec.get("shape"):
        raise ArtifactError(f"{where}: a GPU record without its 'shape'")
    if rec.get("shape"):
        from .evaluate import parse_gpu_shape

        try:
            parse_gpu_shape(rec["shape"])
        except FlashscopeError:
            raise ArtifactError(f"{where}: 'shape' is {_shown(rec['shape'])}, expected "
                                "'B,H,N,D'") from None
    if rec["status"] == "ok" and rec["kind"] == "gpu" and rec.get("ms") is None:
        raise ArtifactError(f"{where}: an 'ok' GPU record without 'ms'")
    return rec


def _shown(v) -> str:
    text = json.dumps(v, default=str) if not isinstance(v, float) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def read_records(path) -> list:
    """Every complete record of a JSONL file, each checked by :func:`check_record`; a torn
    last line is ignored. Anything else malformed (a line that is not JSON, binary data,
    a record of the wrong shape) is an ArtifactError naming the line."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return []
    except IsADirectoryError:
        raise ArtifactError(f"{p}: is a folder, expected a results .jsonl file") from None
    except OSError as e:
        raise ArtifactError(f"{p}: cannot read ({e.strerror or e})") from None
    complete = data.split(b"\n")[:-1]  # the part after the last newline is torn (or empty)
    out = []
    for i, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
            raise ArtifactError(f"{p}: line {i} is not a JSON object (damaged results "
                                "file; only a torn last line is tolerated)") from None
        out.append(check_record(rec, f"{p}: line {i}"))
    return out


class ResultStore:
    """Append-only JSONL results file (see the module docstring)."""

    def __init__(self, path, *, resume: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._lock()
            if os.fstat(self._fd).st_size > 0 and not resume:
                raise FlashscopeError(f"--out: {self.path} already holds results; pass "
                                      "--resume to continue that sweep or choose another "
                                      "--out")
            self._repair()
            self.records = read_records(self.path)
            self.done = {r["key"] for r in self.records if "key" in r}
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        if fcntl is None:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FlashscopeError(f"--out: {self.path} is being written by another sweep "
                                  "(it holds the file's lock); wait for it to end or "
                                  "choose another --out") from None

    def _repair(self) -> None:
        """Cut a torn last line (a write interrupted by a kill) before appending."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            os.ftruncate(self._fd, data.rfind(b"\n") + 1)
            os.fsync(self._fd)

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
