"""One profiling session: counters for each kernel, gates, and the speed correlation.

Rows come either from running ncu (:mod:`.runner`, GPU) or from existing ncu CSV files
(offline). Speed for the correlation is TFLOP/s: from ncu's kernel duration by default, or
from a sweep's results file (joined on the flashscope config key), which is the better
measure (ncu serializes and replays kernels, so its durations carry no launch overlap).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from ..errors import ParseError
from .gates import evaluate_gates
from .metrics import PREDICTORS
from .ncu_csv import decode, read_ncu_csv
from .rank import predictive_power
from .runner import PROVIDERS, row_for


def provider_of(kernel_name: str) -> str:
    """The provider whose kernel pattern matches ``kernel_name``, else 'other'."""
    for p in PROVIDERS:
        if re.search(p.kernel_regex, kernel_name):
            return p.name
    return "other"


def rows_from_csv(paths, shape, causal: bool) -> list:
    """Rows from existing ncu CSV files (one row per kernel launch in them)."""
    rows = []
    for path in paths:
        for k in read_ncu_csv(path):
            rows.append(row_for(k, provider_of(k.name), "", shape, causal))
    return rows


_CSV_NAME = re.compile(r"^ncu_(\d+)_([a-z0-9]+)\.csv$")


def recorded_jobs(directory) -> list:
    """``[(csv path, provider, config text)]`` of a ``flashscope profile --out DIR``
    recording, in job order.

    Files are ``ncu_<i>_<provider>.csv``. Each flashscope file's config comes from
    ``jobs.json`` (written with the CSVs) or, for recordings without it, from the
    ``profile.json`` written next to them (its i-th kernel row)."""
    d = Path(directory)
    if not d.is_dir():
        raise ParseError(f"--from-csv {d}: not a directory")
    found = sorted((int(m.group(1)), m.group(2), d / f.name) for f in d.iterdir()
                   if (m := _CSV_NAME.match(f.name)))
    if not found:
        raise ParseError(f"--from-csv {d}: no ncu_<i>_<provider>.csv files (written by "
                         "'flashscope profile --out DIR')")
    configs = {}
    for name, key in (("jobs.json", "jobs"), ("profile.json", "kernels")):
        f = d / name
        if not f.exists():
            continue
        try:
            rows = json.loads(decode(f.read_bytes(), str(f)))[key]
            configs = {i: str(r.get("config") or "") for i, r in enumerate(rows)}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise ParseError(f"--from-csv {f}: expected an object with a '{key}' list of "
                             "rows with 'config'") from None
        break
    out = []
    for i, provider, path in found:
        config = configs.get(i, "") if provider == "flashscope" else ""
        out.append((path, provider, config))
    return out


def rows_from_dir(directory, shape, causal: bool) -> list:
    """Rows from a recording directory (see :func:`recorded_jobs`): one per CSV, its
    provider from the file name (checked against the kernel name) and its config."""
    rows = []
    for path, provider, config in recorded_jobs(directory):
        kernels = read_ncu_csv(path)
        k = kernels[-1]
        if provider_of(k.name) not in (provider, "other"):
            raise ParseError(f"{path}: kernel {k.name[:60]!r} is not a {provider} kernel")
        rows.append(row_for(k, provider, config, shape, causal))
    return rows


def check_counter_rows(rows, where: str) -> list:
    """Rows of a ``flashscope profile`` JSON document (``kernels``), checked before use:
    each an object whose counters are finite numbers >= 0 or null, whose names are
    strings; an impossible value (a negative duration, NaN, a string where a number
    belongs) is a ParseError naming the row and the field."""
    import math

    from .metrics import METRICS

    numeric = [m.key for m in METRICS] + ["tflops", "speed_tflops"]
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ParseError(f"{where}: kernels[{i}]: expected an object, got "
                             f"{type(r).__name__}")
        for k in ("provider", "kernel", "config", "config_key"):
            if r.get(k) is not None and not isinstance(r[k], str):
                raise ParseError(f"{where}: kernels[{i}].{k}: expected a string")
        for k in numeric:
            v = r.get(k)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                    not math.isfinite(v) or v < 0:
                raise ParseError(f"{where}: kernels[{i}].{k} is {v!r}, expected a finite "
                                 "number >= 0 or null")
        if r.get("duration") == 0:
            raise ParseError(f"{where}: kernels[{i}].duration is 0, expected a time > 0")
    return rows


def config_key(text: str) -> str:
    """``"BLOCK_M=64,num_warps=4"`` -> the config's readable label on sm90's defaults
    (``triton-fwd 64x64 w4 s3``); '' stays ''."""
    if not text:
        return ""
    from ..families import Problem, config_from_text

    return config_from_text(text, Problem("sm90")).label


def _number(v, where: str, what: str, positive: bool = False) -> float:
    """``v`` (a JSON number or a CSV cell) as a finite float >= 0 (> 0 with
    ``positive``), else a ParseError naming ``where``."""
    import math

    try:
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ValueError
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise ParseError(f"{where}: {what} is {v!r}, expected a number") from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise ParseError(f"{where}: {what} is {v!r}, expected a finite number "
                         f"{'> 0' if positive else '>= 0'}")
    return x


def load_speed(path, shape, causal: bool) -> dict:
    """Sweep or bench results -> ``{config label: TFLOP/s}``.

    Accepts JSON (a list of rows, or an object with ``rows``/``results``) or CSV, each row
    with a ``config`` (a label, or ``K=V,...`` text) or ``label`` and ``tflops`` or ``ms``;
    rows of other providers, shapes (when they carry ``N``/``D``) or an ``error`` are
    skipped. A row whose values are of the wrong type or impossible (a negative time, NaN,
    a length of 0) is a ParseError naming the row."""
    p = Path(path)
    try:
        text = decode(p.read_bytes(), str(p))
    except IsADirectoryError:
        raise ParseError(f"--speed {p}: is a folder, expected a file") from None
    except OSError as e:
        raise ParseError(f"--speed {p}: cannot read ({e.strerror})") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ParseError(f"--speed {p}: invalid JSON ({e.msg} at line {e.lineno})") from None
        except (ValueError, RecursionError):
            raise ParseError(f"--speed {p}: invalid JSON (nested too deeply)") from None
        if isinstance(data, dict):
            data = data.get("rows", data.get("results"))
        if not isinstance(data, list):
            raise ParseError(f"--speed {p}: expected a list of rows or an object with 'rows'")
    else:
        try:
            data = list(csv.DictReader(text.splitlines(), strict=True))
        except csv.Error as e:
            raise ParseError(f"--speed {p}: {e}") from None
    B, H, N, D = shape
    out = {}
    for i, r in enumerate(data):
        where = f"--speed {p}: row {i}"
        if not isinstance(r, dict) or not r.get("config") or r.get("error"):
            continue
        if not isinstance(r["config"], str):
            raise ParseError(f"{where}: config is {type(r['config']).__name__}, expected "
                             "'K=V,...' text")
        if r.get("provider", "flashscope") != "flashscope":
            continue
        if "N" in r and _number(r["N"], where, "N", True) != N:
            continue
        if "D" in r and _number(r["D"], where, "D", True) != D:
            continue
        if "causal" in r and (str(r["causal"]).lower() in ("true", "1")) != causal:
            continue
        if r.get("tflops") not in (None, ""):
            v = _number(r["tflops"], where, "tflops")
        elif r.get("ms") not in (None, ""):
            ms = _number(r["ms"], where, "ms", True)
            v = 4.0 * B * H * N * N * D * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12
        else:
            raise ParseError(f"{where}: expected a number in 'tflops' or 'ms'")
        name = str(r.get("label") or r["config"])
        out[config_key(name) if "=" in name else name] = v
    return out


def summarize(rows, gates, speed=None) -> dict:
    """Gates per row, and Spearman's rho of each counter (and gate) against speed."""
    for r in rows:
        r["gates"] = evaluate_gates(r, gates)
        key = r.get("config_key", "")
        r["speed_tflops"] = (speed or {}).get(key, r.get("tflops")) if key else r.get("tflops")
    corr = predictive_power(rows, "speed_tflops", PREDICTORS, gates)
    return {"kernels": rows, "gates": [str(g) for g in gates],
            "speed_source": "sweep file" if speed else "ncu duration",
            "correlation": corr}
