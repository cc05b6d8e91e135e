"""Tuned forward configs: data files written by ``flashscope sweep --write-tuned``, and the
lookup the attention API uses by default.

One JSON file per target, ``flashscope/data/tuned/<target>.json``::

    {"format": 1, "target": "sm90",
     "entries": [{"dtype": "bfloat16", "head_dim": 64, "causal": false,
                  "seq_class": "le4k", "config": {"BLOCK_M": 128, ...},
                  "ms": 0.51, "tflops": 540.2, "shape": "4,32,4096,64",
                  "evaluated": 36, "source": "..."}]}

An entry applies to its exact (dtype, head dim, causal) and to every key length in its
sequence-length class (:data:`SEQ_CLASSES`). Anything else is on the defaults of
:func:`flashscope.config.select_config`, and :func:`lookup` says so. The reader fails
closed: a file that exists but is malformed (bad JSON, unknown keys, a duplicate entry, a
config that :func:`~flashscope.config.check_config` rejects for its target) raises
:class:`~flashscope.errors.ArtifactError` naming the file, instead of silently falling back.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Optional

from .config import DTYPE_BYTES, AttentionConfig, check_config, select_config
from .errors import ArtifactError, ConfigError, FlashscopeError
from .targets import get_target

FORMAT = 1
DATA_DIR = Path(__file__).parent / "data" / "tuned"

#: Sequence-length classes: (name, largest key length in it; None = unbounded).
SEQ_CLASSES = (("le1k", 1024), ("le4k", 4096), ("le16k", 16384), ("gt16k", None))

ENTRY_KEYS = {"dtype", "head_dim", "causal", "seq_class", "config"}
ENTRY_OPTIONAL = {"ms", "tflops", "shape", "evaluated", "source", "search"}


def seq_class(seq_len: int) -> str:
    """The class of a key length: ``le1k`` (<= 1024), ``le4k``, ``le16k``, ``gt16k``."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise FlashscopeError(f"seq_len: expected a positive integer, got {seq_len!r}")
    for name, bound in SEQ_CLASSES:
        if bound is None or seq_len <= bound:
            return name


def entry_key(dtype: str, head_dim: int, causal: bool, cls: str) -> tuple:
    return (dtype, int(head_dim), bool(causal), cls)


def tuned_path(target, data_dir=None) -> Path:
    return _tuned_path(get_target(target).name, data_dir or DATA_DIR)


@functools.lru_cache(maxsize=64)
def _tuned_path(name: str, data_dir) -> Path:
    return Path(data_dir) / f"{name}.json"


def parse_tuned(data, target: str, where: str) -> dict:
    """{entry_key: (AttentionConfig, entry)} from a file's JSON; ArtifactError if malformed."""
    def bad(msg):
        return ArtifactError(f"{where}: {msg}")

    if not isinstance(data, dict) or set(data) != {"format", "target", "entries"}:
        raise bad("expected an object with keys format, target, entries")
    if data["format"] != FORMAT:
        raise bad(f"format {data['format']!r}: this flashscope reads format {FORMAT}")
    if data["target"] != target:
        raise bad(f"target {data['target']!r} does not match the file's target {target!r}")
    if not isinstance(data["entries"], list):
        raise bad("entries: expected a list")
    classes = [c for c, _ in SEQ_CLASSES]
    out = {}
    for i, e in enumerate(data["entries"]):
        at = f"entries[{i}]"
        if not isinstance(e, dict):
            raise bad(f"{at}: expected an object")
        missing, unknown = ENTRY_KEYS - set(e), set(e) - ENTRY_KEYS - ENTRY_OPTIONAL
        if missing or unknown:
            raise bad(f"{at}: missing {sorted(missing)} / unknown {sorted(unknown)} keys")
        if e["dtype"] not in DTYPE_BYTES:
            raise bad(f"{at}: dtype {e['dtype']!r} is not one of {', '.join(DTYPE_BYTES)}")
        if isinstance(e["head_dim"], bool) or not isinstance(e["head_dim"], int):
            raise bad(f"{at}: head_dim {e['head_dim']!r} is not an integer")
        if not isinstance(e["causal"], bool):
            raise bad(f"{at}: causal {e['causal']!r} is not true/false")
        if e["seq_class"] not in classes:
            raise bad(f"{at}: seq_class {e['seq_class']!r}: expected one of "
                      f"{', '.join(classes)}")
        if not isinstance(e["config"], dict):
            raise bad(f"{at}: config: expected an object")
        try:
            cfg = check_config(AttentionConfig.from_dict(e["config"]), target, e["head_dim"],
                               e["dtype"])
        except ConfigError as err:
            raise bad(f"{at}: {err}") from None
        k = entry_key(e["dtype"], e["head_dim"], e["causal"], e["seq_class"])
        if k in out:
            raise bad(f"{at}: a second entry for {k}")
        out[k] = (cfg, e)
    return out


@functools.lru_cache(maxsize=64)
def _load(path: str, mtime_ns: int, size: int, target: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None
    return parse_tuned(data, target, path)


def file_stamp(target, data_dir=None) -> "tuple | None":
    """(path, mtime in ns, size) of a target's file, None when it has none: what the
    entries read from it depend on (a default-config call stats the file every time, so
    an edited file takes effect at once; os.stat, not Path.stat's extra layer)."""
    path = _tuned_path(get_target(target).name, data_dir or DATA_DIR)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return str(path), st.st_mtime_ns, st.st_size


def load_tuned(target, data_dir=None) -> dict:
    """The parsed entries of a target's file ({} when it has none)."""
    stamp = file_stamp(target, data_dir)
    return {} if stamp is None else _load(*stamp, get_target(target).name)


def lookup(target, dtype: str, head_dim: int, causal: bool, seq_len: int,
           data_dir=None) -> tuple:
    """(config, tuned, source) for a forward problem.

    ``tuned`` is True when a data file has an entry for (dtype, head_dim, causal, the class
    of ``seq_len``); ``source`` then names the file and the entry's class, else
    "defaults (select_config)". Raises ArtifactError when the target's file is malformed."""
    name = get_target(target).name
    cls = seq_class(seq_len)
    entries = load_tuned(name, data_dir)
    hit: Optional[tuple] = entries.get(entry_key(dtype, head_dim, causal, cls))
    if hit is not None:
        return hit[0], True, f"{_tuned_path(name, data_dir or DATA_DIR).name} [{cls}]"
    return select_config(head_dim, dtype, causal, name), False, "defaults (select_config)"
