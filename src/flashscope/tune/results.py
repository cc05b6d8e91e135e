"""A/B result files: one JSON file per cell, written whole or not at all, read back checked.

::

    {"kind": "flashscope tune ab", "format": 1,
     "meta": {"cell": "d64c16k", "shape": "1,32,16384,64", "causal": true,
              "dtype": "bfloat16", "target": "sm90", "device": "NVIDIA H100 80GB HBM3",
              "gpu": "3", "uuid": "GPU-...", "rounds": 32, "reps": 30, "flush": true,
              "seed": 0, "date": "YYYY-MM-DD HH:MM", "variants": "d=+;po=+PINGPONG=1;n=cudnn"},
     "rows": [{"name": "d", "spec": "+", "provider": "flashscope", "kernel": "sm90-fwd",
               "config": {...every knob...}, "label": "sm90-fwd 192x128 s3 ...",
               "ms": 2.1157, "tflops": 519.7, "ratio": 1.0, "ratio_q1": 1.0,
               "ratio_q3": 1.0, "max_rel_error": 0.0031}, ...],
     "times": {"d": [ms per launch, one per round], ...},
     "dropped": {"f": "fa4: flash_attn not installed"}}

The first row is the base of every ratio. ``gpu`` (the device id the worker was pinned
to) and ``uuid`` say which GPU timed the cell; every ratio in a file comes from that one
GPU. A row records the config it ran, whole, so an adoption writes exactly what was
timed. :func:`read_result` refuses anything else by file and place (ArtifactError):
other JSON, a missing key, a config its family does not know, a time that is not a
positive finite number, rounds that do not match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..bench.suite import parse_shape
from ..errors import ArtifactError, ConfigError, FlashscopeError
from ..families import FAMILIES, family
from ..families.base import DTYPE_BYTES
from ..targets import get_target
from ..outfiles import json_text, write_atomic
from .cells import Cell, mask_meta, parse_cell
from .rule import Reading
from .variants import Variant

KIND, FORMAT = "flashscope tune ab", 1
_KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false"}
META_KEYS = {"cell": str, "shape": str, "causal": bool, "dtype": str, "device": str,
             "rounds": int, "reps": int, "flush": bool, "date": str, "variants": str}


@dataclass(frozen=True)
class ABResult:
    """A checked A/B result file: its cell, target (None: Triton's interpreter), meta,
    variants in row order, rows by name, times by name."""

    path: str
    cell: Cell
    target: "str | None"
    meta: dict
    variants: list
    rows: dict
    times: dict

    @property
    def base(self) -> Variant:
        return self.variants[0]

    def reading(self) -> Reading:
        """The rule's view: candidates are configs of the base's kernel other than the
        base's config."""
        b = self.base.config
        ids = {v.name: v.identity for v in self.variants[1:]
               if v.config is not None and b is not None and v.config.KERNEL == b.KERNEL
               and v.config != b}
        return Reading(self.base.name, ids, self.times)

    def variant(self, identity: str) -> Variant:
        return next(v for v in self.variants if v.identity == identity)


def document(result: dict) -> dict:
    """An A/B result (as :func:`flashscope.tune.ab.run_ab` returns it) as its file holds
    it."""
    return {"kind": KIND, "format": FORMAT, **result}


def write_result(path, result: dict) -> Path:
    """Write an A/B result atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json_text(document(result)))


def read_result(path) -> ABResult:
    """The checked A/B result at ``path`` (module docstring)."""
    from ..tuned import read_json

    where = str(path)

    def bad(msg):
        return ArtifactError(f"{where}: {msg}")

    data = read_json(path)
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise bad(f"not a flashscope tune A/B result (no \"kind\": \"{KIND}\"); A/B files of "
                  "the retired scripts/gpu/ab.py name format-1 knobs: time the cell again")
    if data.get("format") != FORMAT:
        raise bad(f"format {data.get('format')!r}: this flashscope reads format {FORMAT}")
    for key, kind in (("meta", dict), ("rows", list), ("times", dict)):
        if not isinstance(data.get(key), kind):
            raise bad(f"{key}: expected a JSON {'object' if kind is dict else 'list'}")
    meta = data["meta"]
    for key, kind in META_KEYS.items():
        if not isinstance(meta.get(key), kind) or (kind is int and isinstance(meta[key], bool)):
            raise bad(f"meta.{key}: expected {_KIND_NAMES[kind]}, got {meta.get(key)!r}")
    if meta["dtype"] not in DTYPE_BYTES or meta["rounds"] < 1 or meta["reps"] < 1:
        raise bad("meta: dtype, rounds or reps out of range")
    target = meta.get("target")
    try:
        cell = parse_cell(meta["cell"], meta["dtype"])
        parse_shape(meta["shape"])
        if target is not None:
            target = get_target(target).name
    except (FlashscopeError, TypeError) as e:
        raise bad(f"meta: {e}") from None
    if (cell.case.shape, cell.case.causal) != (meta["shape"], meta["causal"]):
        raise bad(f"meta: cell {cell.name} is not shape {meta['shape']}, causal "
                  f"{meta['causal']}")
    mask = {k: meta[k] for k in ("window", "align", "softcap") if k in meta}
    if mask != mask_meta(cell.case):
        raise bad(f"meta: cell {cell.name}'s mask is {mask_meta(cell.case) or 'causal or none'}"
                  f", not {mask}")
    if not data["rows"]:
        raise bad("rows: empty (the first row is the base of every ratio)")
    variants, rows = [], {}
    for i, row in enumerate(data["rows"]):
        variants.append(_variant(row, f"rows[{i}]", bad))
        if row["name"] in rows:
            raise bad(f"rows[{i}]: a second row named {row['name']!r}")
        rows[row["name"]] = row
    times = data["times"]
    if set(times) != set(rows):
        raise bad(f"times: expected the rows' names {sorted(rows)}, got {sorted(times)}")
    for name, ts in times.items():
        if not (isinstance(ts, list) and len(ts) == meta["rounds"] and all(
                isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
                and t > 0 for t in ts)):
            raise bad(f"times.{name}: expected {meta['rounds']} positive finite numbers of ms")
    return ABResult(where, cell, target, meta, variants, rows, times)


def _variant(row, at: str, bad) -> Variant:
    if not isinstance(row, dict) or not all(isinstance(row.get(k), str)
                                            for k in ("name", "spec", "provider")):
        raise bad(f"{at}: expected an object with name, spec and provider")
    for key in ("ms", "tflops"):
        v = row.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise bad(f"{at}.{key}: expected a finite number, got {v!r}")
    if row["provider"] != "flashscope":
        return Variant(row["name"], row["spec"], row["provider"])
    if not isinstance(row.get("kernel"), str) or row["kernel"] not in FAMILIES:
        raise bad(f"{at}.kernel: {row.get('kernel')!r} is not one of {', '.join(FAMILIES)}")
    try:
        cfg = family(row["kernel"]).Config.from_dict(row.get("config"))
    except ConfigError as e:
        raise bad(f"{at}.config: {e}") from None
    return Variant(row["name"], row["spec"], "flashscope", cfg)


def result_paths(folder) -> list:
    """The A/B result files of a folder (``<cell>.json``), sorted; not the summary."""
    d = Path(folder)
    if not d.is_dir():
        raise FlashscopeError(f"{folder}: not a folder of A/B results")
    return sorted(p for p in d.glob("*.json")
                  if not p.name.startswith(".") and p.name != "summary.json")
