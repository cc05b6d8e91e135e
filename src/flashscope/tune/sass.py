"""Two kernels compared instruction by instruction from Nsight Compute source pages.

A *source page* is ncu's ``--page source --csv --print-source sass`` export of a report
recorded with the SourceCounters and WarpStateStats sections: one row per SASS
instruction with its address, text, warp instructions executed and warp-stall samples by
reason (``stall_wait``, ``stall_long_sb``, ...). Recorded anywhere, compared anywhere:

- :func:`opcode_mix`: warp instructions executed per opcode (the mnemonic without its
  predicate, cut at the first dot, ``FADD.FTZ`` -> ``FADD``; ``MUFU`` and ``HGMMA`` kept
  whole, ``MUFU.EX2``, ``HGMMA.64x128x16.F32.BF16``, since their suffix is the unit's
  operation);
- :func:`by_reason`: each stall reason's share of all samples;
- :func:`top`: the instructions with the most samples;
- :func:`compare`: all of that for two pages, and the opcodes whose counts differ most.

An entry executing 1836.8 M warp instructions against FlashAttention-4's 1784.0 M on the
same D = 64 non-causal 16k problem, with the uniform-datapath add ``UIADD3`` the largest
difference (27 M), is what this reads from two such pages. Record a page with::

    ncu --section SourceCounters --section WarpStateStats -o REPORT python ...
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > NAME_source.csv
"""

from __future__ import annotations

import csv
import gzip
import io

from ..errors import ParseError
from ..profile.ncu_csv import decode, parse_number

TOTAL = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def source_rows(text: str) -> list:
    """The rows of a source page (one per SASS instruction), from its ``"Address"``
    header on; [] when it has none or no warp-stall samples."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"Address"')), None)
    if start is None:
        return []
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    return rows if rows and TOTAL in rows[0] else []


def read_source(path) -> list:
    """:func:`source_rows` of a recorded page, plain or gzipped; ParseError naming the file
    for anything that is not a page with instructions executed per row."""
    path = str(path)
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except (OSError, EOFError) as e:
        raise ParseError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    rows = source_rows(decode(data, path))
    if not rows or EXECUTED not in rows[0]:
        raise ParseError(f"{path}: not an ncu source page with {TOTAL!r} and {EXECUTED!r} "
                         "per instruction (ncu --page source --csv --print-source sass)")
    return rows


def _count(row, key) -> float:
    return parse_number(row[key] or "", f"{row.get('Address', '?')} {key!r}") or 0.0


def _reasons(rows) -> list:
    return [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]


def by_reason(rows) -> list:
    """(share of all samples, reason) over the whole kernel, largest first."""
    if not rows:
        return []
    total = sum(_count(r, TOTAL) for r in rows) or 1.0
    return sorted(((sum(_count(r, k) for r in rows) / total, k) for k in _reasons(rows)),
                  reverse=True)


def top(rows, n: int = 12) -> list:
    """The ``n`` instructions with the most warp-stall samples: (share of all samples,
    address, SASS, the three largest stall reasons with their sample counts)."""
    if not rows:
        return []
    reasons = _reasons(rows)
    total = sum(_count(r, TOTAL) for r in rows) or 1.0
    out = []
    for r in sorted(rows, key=lambda r: -_count(r, TOTAL))[:n]:
        why = sorted(((_count(r, k), k) for k in reasons), reverse=True)[:3]
        out.append((_count(r, TOTAL) / total, r.get("Address", ""),
                    " ".join(r.get("Source", "").split())[:60],
                    [(k, int(v)) for v, k in why if v]))
    return out


def opcode_mix(rows) -> list:
    """(warp instructions executed, opcode) summed over a page, largest first (module
    docstring)."""
    if not rows or EXECUTED not in rows[0]:
        return []
    mix = {}
    for r in rows:
        words = [w for w in r.get("Source", "").replace("{", " ").split()
                 if not w.startswith("@")]
        if not words:
            continue
        op = words[0] if words[0].startswith(("MUFU", "HGMMA")) else words[0].split(".")[0]
        mix[op] = mix.get(op, 0.0) + _count(r, EXECUTED)
    return sorted(((v, k) for k, v in mix.items()), reverse=True)


def opcode_diff(mix_a, mix_b, n: int = 16) -> list:
    """The ``n`` opcodes whose executed counts differ most between two :func:`opcode_mix`
    lists: (opcode, count in a, count in b, a - b), largest absolute difference first."""
    a = {k: v for v, k in mix_a}
    b = {k: v for v, k in mix_b}
    rows = [(k, a.get(k, 0.0), b.get(k, 0.0), a.get(k, 0.0) - b.get(k, 0.0))
            for k in set(a) | set(b)]
    return sorted(rows, key=lambda r: (-abs(r[3]), r[0]))[:n]


def summary(rows, n_top: int = 12) -> dict:
    """One page as JSON-able data: instructions executed, stall reasons, top stalls, mix."""
    mix = opcode_mix(rows)
    return {"instructions": sum(v for v, _ in mix),
            "stall_reasons": {k: round(v, 4) for v, k in by_reason(rows)},
            "top_stalls": [{"share": round(s, 4), "address": a, "sass": t, "reasons": dict(w)}
                           for s, a, t, w in top(rows, n_top)],
            "opcodes": {k: v for v, k in mix}}


def compare(path_a, path_b, n: int = 16) -> dict:
    """The two pages' :func:`summary` and the ``n`` opcodes whose counts differ most."""
    a, b = summary(read_source(path_a)), summary(read_source(path_b))
    diff = opcode_diff(*([(v, k) for k, v in side["opcodes"].items()] for side in (a, b)),
                       n)
    return {"a": {"path": str(path_a), **a}, "b": {"path": str(path_b), **b},
            "opcode_diff": [{"opcode": k, "a": x, "b": y, "a_minus_b": d}
                            for k, x, y, d in diff],
            "stall_diff": {k: round(a["stall_reasons"].get(k, 0.0)
                                    - b["stall_reasons"].get(k, 0.0), 4)
                           for k in sorted(set(a["stall_reasons"]) | set(b["stall_reasons"]))}}
