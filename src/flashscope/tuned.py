"""Tuned configs: data files of measured winners, their one writer, and the lookup the
attention API uses by default.

One JSON file per target, ``flashscope/data/tuned/<target>.json``::

    {"format": 2, "target": "sm90",
     "entries": [{"kernel": "sm90-fwd", "dtype": "bfloat16", "head_dim": 64,
                  "causal": false, "seq_class": "le4k",
                  "config": {"BLOCK_M": 192, "num_stages": 3, "PINGPONG": true},
                  "ms": 1.05, "tflops": 522.2, "shape": "4,32,4096,64",
                  "source": "...", "search": "ab"}]}

An entry names its kernel family and stores only the knobs that differ from that family's
defaults (:meth:`flashscope.families.base.Knobs.diff`). It applies to its exact (kernel,
head dim, mask) and to every key length in its sequence-length class
(:data:`SEQ_CLASSES`); an entry measured in one 16-bit dtype also serves the other when
that one has no entry of its own (the kernels differ only in the conversion of P and the
wgmma operand type). Anything else is on the family's rule (``select``), and
:func:`lookup` says so.

The reader fails closed: a file that exists but is malformed (bad JSON, unknown keys, a
duplicate entry, a config its family's rules reject for the target) raises
:class:`~flashscope.errors.ArtifactError` naming the file and the entry. Format-1 files
(one record for both forward kernels) are refused with the command that converts them
(:func:`convert`). Every write goes through :func:`write_entries`: merged by key,
validated by the reader, written atomically.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from pathlib import Path

from .errors import ArtifactError, ConfigError, FlashscopeError
from .families import FAMILIES, Problem, family
from .families.base import DTYPE_BYTES
from .targets import get_target

FORMAT = 2
DATA_DIR = Path(__file__).parent / "data" / "tuned"

#: Sequence-length classes: (name, largest key length in it; None = unbounded).
SEQ_CLASSES = (("le1k", 1024), ("le4k", 4096), ("le16k", 16384), ("gt16k", None))

ENTRY_KEYS = {"kernel", "dtype", "head_dim", "causal", "seq_class", "config"}
ENTRY_OPTIONAL = {"ms", "tflops", "shape", "evaluated", "source", "search"}
#: the dtype whose entries serve a dtype that has none of its own
DTYPE_TWIN = {"float16": "bfloat16", "bfloat16": "float16"}


def seq_class(seq_len: int) -> str:
    """The class of a key length: ``le1k`` (<= 1024), ``le4k``, ``le16k``, ``gt16k``."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise FlashscopeError(f"seq_len: expected a positive integer, got {seq_len!r}")
    for name, bound in SEQ_CLASSES:
        if bound is None or seq_len <= bound:
            return name


def entry_key(kernel: str, dtype: str, head_dim: int, causal: bool, cls: str) -> tuple:
    return (kernel, dtype, int(head_dim), bool(causal), cls)


def tuned_path(target, data_dir=None) -> Path:
    return Path(data_dir or DATA_DIR) / f"{get_target(target).name}.json"


def _config_of(kernel: str, d: dict, target: str, head_dim: int, dtype: str):
    fam = family(kernel)
    return fam.check(fam.Config.from_dict(d), target, head_dim, dtype)


def parse_tuned(data, target: str, where: str) -> dict:
    """{entry_key: (config, entry)} from a file's JSON; ArtifactError if malformed."""
    def bad(msg):
        return ArtifactError(f"{where}: {msg}")

    if isinstance(data, dict) and data.get("format") == 1:
        raise bad("format 1 (one record for both forward kernels): convert it in place "
                  f"with `flashscope tune convert {where} --force`")
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
        if e["kernel"] not in FAMILIES:
            raise bad(f"{at}: kernel {e['kernel']!r} is not one of {', '.join(FAMILIES)}")
        if e["dtype"] not in DTYPE_BYTES:
            raise bad(f"{at}: dtype {e['dtype']!r} is not one of {', '.join(DTYPE_BYTES)}")
        if isinstance(e["head_dim"], bool) or not isinstance(e["head_dim"], int):
            raise bad(f"{at}: head_dim {e['head_dim']!r} is not an integer")
        if not isinstance(e["causal"], bool):
            raise bad(f"{at}: causal {e['causal']!r} is not true/false")
        if e["seq_class"] not in classes:
            raise bad(f"{at}: seq_class {e['seq_class']!r}: expected one of "
                      f"{', '.join(classes)}")
        try:
            cfg = _config_of(e["kernel"], e["config"], target, e["head_dim"], e["dtype"])
        except ConfigError as err:
            raise bad(f"{at}: {err}") from None
        k = entry_key(e["kernel"], e["dtype"], e["head_dim"], e["causal"], e["seq_class"])
        if k in out:
            raise bad(f"{at}: a second entry for {k}")
        out[k] = (cfg, e)
    return out


@functools.lru_cache(maxsize=64)
def _load(path: str, mtime_ns: int, size: int, target: str) -> dict:
    return parse_tuned(read_json(path), target, path)


def read_json(path) -> object:
    """The JSON of a tuned file; ArtifactError naming it when it cannot be read."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None


#: How long a read of a file's stamp stands, in seconds: a default-config call asks for
#: the stamp every time, and a stat costs more than the rest of the lookup (about a third
#: of the host time of a short launch). :func:`write_entries` clears it at once; a file
#: edited by hand or by another process takes effect within this time.
RESTAT_S = 1.0
_STAMPS: dict = {}


def file_stamp(target, data_dir=None) -> "tuple | None":
    """(path, mtime in ns, size) of a target's file, None when it has none: what the
    entries read from it depend on. Read again from the file system at most every
    :data:`RESTAT_S` seconds."""
    key = (target, str(data_dir or DATA_DIR))
    now = time.monotonic()
    hit = _STAMPS.get(key)
    if hit is not None and now - hit[0] < RESTAT_S:
        return hit[1]
    path = tuned_path(target, data_dir)
    try:
        st = os.stat(path)
        stamp = str(path), st.st_mtime_ns, st.st_size
    except FileNotFoundError:
        stamp = None
    if len(_STAMPS) >= 64:
        _STAMPS.clear()
    _STAMPS[key] = (now, stamp)
    return stamp


def load_tuned(target, data_dir=None) -> dict:
    """The parsed entries of a target's file ({} when it has none)."""
    stamp = file_stamp(target, data_dir)
    return {} if stamp is None else _load(*stamp, get_target(target).name)


def lookup(problem: Problem, kernel: str, data_dir=None) -> tuple:
    """(config, tuned, source) of family ``kernel`` for ``problem``.

    ``tuned`` is True when the target's file has an entry for (kernel, dtype or its 16-bit
    twin, head dim, causal, the class of the key length); ``source`` then names the file
    and the entry, else the family's rule. Windowed (or bottom-right shifted) and packed
    problems always take the rule: entries are measured on full-width dense rows and do
    not record a window. Raises ArtifactError when the file is malformed."""
    name = get_target(problem.target).name
    fam = family(kernel)
    if problem.window or problem.varlen:
        return fam.select(problem), False, f"{kernel} rule (select; windowed or packed)"
    cls = seq_class(max(1, int(problem.n_k)))
    entries = load_tuned(name, data_dir)
    for dtype in (problem.dtype, DTYPE_TWIN.get(problem.dtype)):
        hit = entries.get(entry_key(kernel, dtype, problem.head_dim, problem.causal, cls))
        if hit is not None:
            twin = "" if dtype == problem.dtype else f", from {dtype}"
            return hit[0], True, f"{tuned_path(name, data_dir).name} [{cls}{twin}]"
    return fam.select(problem), False, f"{kernel} rule (select)"


def make_entry(cfg, dtype: str, head_dim: int, causal: bool, cls: str, **meta) -> dict:
    """A tuned entry for ``cfg`` (its family named, only the knobs off the defaults)."""
    unknown = set(meta) - ENTRY_OPTIONAL
    if unknown:
        raise FlashscopeError(f"tuned entry: unknown field(s) {sorted(unknown)}")
    return {"kernel": cfg.KERNEL, "dtype": dtype, "head_dim": int(head_dim),
            "causal": bool(causal), "seq_class": cls, "config": cfg.diff(),
            **{k: v for k, v in meta.items() if v is not None}}


def check_replacements(target, entries: list, data_dir=None, force: bool = False,
                       flag: str = "tuned file") -> None:
    """FlashscopeError when an entry would replace one of the same key that holds another
    config, unless ``force``: a measured entry is never overwritten unasked."""
    existing = load_tuned(target, data_dir)
    for e in entries:
        k = entry_key(e["kernel"], e["dtype"], e["head_dim"], e["causal"], e["seq_class"])
        if k in existing and existing[k][1]["config"] != e["config"] and not force:
            raise FlashscopeError(f"{flag}: {tuned_path(target, data_dir)} already has an "
                                  f"entry for {k} with another config; pass --force to "
                                  "replace it")


def write_entries(target, entries: list, data_dir=None) -> Path:
    """The one writer of tuned files: ``entries`` replace those of the same key in the
    target's file (the others stay), the result is checked by :func:`parse_tuned` and
    written atomically (temporary file, fsync, rename), so a written file always loads."""
    name = get_target(target).name
    d = Path(data_dir or DATA_DIR)
    d.mkdir(parents=True, exist_ok=True)
    merged = {k: e for k, (_, e) in load_tuned(name, d).items()}
    for e in entries:
        merged[entry_key(e["kernel"], e["dtype"], e["head_dim"], e["causal"],
                         e["seq_class"])] = e
    data = {"format": FORMAT, "target": name,
            "entries": [merged[k] for k in sorted(merged, key=str)]}
    path = tuned_path(name, d)
    parse_tuned(data, name, str(path))
    _atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    _STAMPS.clear()
    return path


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- format 1 -> 2 --------------------------------------------------------------------------

#: format-1 knobs that no kernel has any more, and the value each must have had to convert
_DROPPED = {"TMA": None, "WARP_SPEC": False, "EXP2_POLY": 0, "JOINT_KV": False,
            "LEAN_RELEASE": False}
#: format-1 knobs of the Gluon kernel that are now its fixed design, and their value
_FIXED_GLUON = {"OVERLAP": 2, "PERSISTENT": True, "num_warps": 4, "maxnreg": None,
                "waves_per_eu": None}


def _convert_config(c: dict, where: str) -> tuple:
    """(kernel, config dict) of a format-1 config record."""
    c = dict(c)
    gluon = bool(c.pop("GLUON", False))
    for knob, need in _DROPPED.items():
        v = c.pop(knob, need)
        if need is not None and v not in (need, None) and bool(v) != bool(need):
            raise ArtifactError(f"{where}: {knob}={v} is a switch no kernel has any more "
                                "(docs/experiments.md); this entry cannot be converted")
    if gluon:
        for knob, need in _FIXED_GLUON.items():
            v = c.pop(knob, need)
            if v != need and not (knob == "OVERLAP" and v is True and need == 2):
                raise ArtifactError(f"{where}: {knob}={v}: the sm90 kernel now always runs "
                                    f"{knob}={need}; this entry cannot be converted")
        return "sm90-fwd", c
    for knob in ("OVERLAP", "PERSISTENT", "PINGPONG", "LAZY_RESCALE", "EARLY_Q", "K_EARLY",
                 "MASKED_FIRST", "OUT_RCP", "BALANCE", "SPLIT_KV"):
        if c.pop(knob, False):
            raise ArtifactError(f"{where}: {knob} on the portable kernel is a switch it does "
                                "not have any more; this entry cannot be converted")
    return "triton-fwd", c


def convert(data, where: str) -> dict:
    """A format-1 file's JSON as format 2: each entry's kernel named, its config as the
    diff from that kernel's defaults. Raises ArtifactError for an entry that used a
    switch no kernel has any more."""
    if not isinstance(data, dict) or data.get("format") != 1:
        raise ArtifactError(f"{where}: not a format-1 tuned file")
    target = data.get("target")
    try:
        get_target(target)
    except FlashscopeError as e:
        raise ArtifactError(f"{where}: {e}") from None
    entries = []
    for i, e in enumerate(data.get("entries") or []):
        at = f"{where}: entries[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("config"), dict):
            raise ArtifactError(f"{at}: expected an object with a config")
        kernel, c = _convert_config(e["config"], at)
        fam = family(kernel)
        try:
            cfg = fam.Config.from_dict(c)
        except ConfigError as err:
            raise ArtifactError(f"{at}: {err}") from None
        entries.append({**{k: v for k, v in e.items() if k != "config"},
                        "kernel": kernel, "config": cfg.diff()})
    out = {"format": FORMAT, "target": target, "entries": entries}
    parse_tuned(out, target, where)
    return out
