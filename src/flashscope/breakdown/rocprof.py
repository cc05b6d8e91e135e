"""rocprofv3 CSV exports: ``*_kernel_trace.csv`` (``--kernel-trace``), ``*_kernel_stats.csv``
(``--stats``) and ``*_agent_info.csv``.

Kernel trace columns (rocprofv3): Kind, Agent_Id, Queue_Id, Stream_Id, Thread_Id,
Dispatch_Id, Kernel_Id, Kernel_Name, Correlation_Id, Start_Timestamp, End_Timestamp (ns),
LDS_Block_Size, Scratch_Size, VGPR_Count (``Arch_VGPR_Count`` in some versions),
Accum_VGPR_Count, SGPR_Count, Workgroup_Size_X/Y/Z, Grid_Size_X/Y/Z. Only the name and the
two timestamps are required; the resource columns feed the occupancy calculator.
Stats columns: Name, Calls, TotalDurationNs, AverageNs, Percentage, MinNs, MaxNs, StdDev.

Occupancy per kernel goes through :func:`flashscope.occupancy.occupancy` with the
workgroup's threads, the VGPRs (on CDNA's unified file: arch VGPRs rounded up to 4 plus
AGPRs, LLVM's ``.vgpr_count``), the SGPRs and the LDS bytes, for the target named by
``--target`` or found in the agent info (a ``gfx...`` name). The founding study divided
"512 VGPRs" by the per-thread count and capped at 32 waves per CU; the calculator applies
the per-SIMD register file, allocation granules and wave slots instead.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from ..errors import ParseError
from ..profile.ncu_csv import decode

_REQUIRED = ("Kernel_Name", "Start_Timestamp", "End_Timestamp")
_VGPR = ("VGPR_Count", "Arch_VGPR_Count")


def _read_csv(path, what: str):
    p = Path(path)
    try:
        text = decode(p.read_bytes(), str(p))
    except OSError as e:
        raise ParseError(f"{what} {p}: cannot read ({e.strerror})") from None
    try:
        rows = list(csv.reader(text.splitlines(), strict=True))
    except csv.Error as e:
        raise ParseError(f"{what} {p}: {e}") from None
    rows = [r for r in rows if r]
    if not rows:
        raise ParseError(f"{what} {p}: file is empty")
    header = [h.strip() for h in rows[0]]
    out = []
    for i, r in enumerate(rows[1:], start=2):
        if len(r) != len(header):
            raise ParseError(f"{what} {p}: line {i}: {len(r)} columns, the header has "
                             f"{len(header)}")
        out.append(dict(zip(header, r)))
    return p, header, out


def _int(row, col, where, default=None):
    """A count, size or timestamp cell: an integer >= 0 (thousands separators allowed)."""
    v = row.get(col)
    if v is None or v.strip() == "":
        return default
    try:
        x = float(v.replace(",", ""))
        if not math.isfinite(x) or x != int(x):
            raise ValueError
    except ValueError:
        raise ParseError(f"{where}: column {col}: expected an integer, got {v!r}") from None
    if x < 0:
        raise ParseError(f"{where}: column {col}: {v.strip()} is impossible (a negative "
                         "count, size or time)")
    return int(x)


def read_kernel_trace(path) -> list:
    """One dict per dispatch: name, seconds, threads, vgprs, agprs, sgprs, lds, scratch,
    grid, agent."""
    p, header, rows = _read_csv(path, "--rocprof")
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise ParseError(f"--rocprof {p}: missing column(s) {', '.join(missing)}; is this a "
                         "rocprofv3 --kernel-trace CSV?")
    vcol = next((c for c in _VGPR if c in header), None)
    out = []
    for i, r in enumerate(rows, start=2):
        where = f"--rocprof {p}: line {i}"
        start, end = _int(r, "Start_Timestamp", where), _int(r, "End_Timestamp", where)
        if start is None or end is None or end < start:
            raise ParseError(f"{where}: End_Timestamp before Start_Timestamp (or empty)")
        wg = [_int(r, f"Workgroup_Size_{a}", where, 1) for a in "XYZ"]
        if "Workgroup_Size" in header:
            wg = [_int(r, "Workgroup_Size", where, 1), 1, 1]
        out.append({
            "name": r["Kernel_Name"], "seconds": (end - start) * 1e-9,
            "threads": wg[0] * wg[1] * wg[2],
            "vgprs": _int(r, vcol, where) if vcol else None,
            "agprs": _int(r, "Accum_VGPR_Count", where),
            "sgprs": _int(r, "SGPR_Count", where),
            "lds": _int(r, "LDS_Block_Size", where),
            "scratch": _int(r, "Scratch_Size", where),
            "grid": tuple(_int(r, f"Grid_Size_{a}", where, 1) for a in "XYZ"),
            "agent": r.get("Agent_Id", ""),
        })
    if not out:
        raise ParseError(f"--rocprof {p}: no dispatches")
    return out


def read_stats(path) -> list:
    """(name, seconds, calls) per kernel from a ``--stats`` kernel_stats CSV."""
    p, header, rows = _read_csv(path, "--stats")
    name_col = next((c for c in ("Name", "Kernel_Name", "KernelName") if c in header), None)
    if name_col is None or "TotalDurationNs" not in header:
        raise ParseError(f"--stats {p}: expected columns Name and TotalDurationNs (rocprofv3 "
                         "*_kernel_stats.csv)")
    out = []
    for i, r in enumerate(rows, start=2):
        where = f"--stats {p}: line {i}"
        try:
            total = float(r["TotalDurationNs"])
            if not math.isfinite(total) or total < 0:
                raise ValueError
        except ValueError:
            raise ParseError(f"{where}: TotalDurationNs: expected a finite time >= 0, got "
                             f"{r['TotalDurationNs']!r}") from None
        out.append((r[name_col], total * 1e-9, _int(r, "Calls", where, 1)))
    if not out:
        raise ParseError(f"--stats {p}: no kernels")
    return out


def read_agent_target(path):
    """The first GPU agent's gfx name in an agent-info CSV, or None."""
    _, header, rows = _read_csv(path, "--agent-info")
    for r in rows:
        kind = (r.get("Agent_Type") or r.get("Type") or "GPU").upper()
        if "GPU" not in kind:
            continue
        for v in r.values():
            m = re.search(r"\bgfx[0-9a-f]+\b", v)
            if m:
                return m.group(0)
    return None


def kernel_occupancy(dispatches, target) -> list:
    """Per distinct (name, threads, VGPRs, AGPRs, LDS): calls, time, and the occupancy
    calculator's result (None with a reason when resources are missing or the calculator
    rejects them)."""
    from ..occupancy import occupancy
    from ..occupancy.amd import unified_vgpr_count
    from ..targets import get_target

    unified = target is not None and getattr(get_target(target), "unified_vgprs", False)
    groups = {}
    for d in dispatches:
        key = (d["name"], d["threads"], d["vgprs"], d["agprs"], d["lds"])
        g = groups.setdefault(key, {"name": d["name"], "threads": d["threads"],
                                    "vgprs": d["vgprs"], "agprs": d["agprs"],
                                    "sgprs": d["sgprs"], "lds": d["lds"],
                                    "scratch": d["scratch"], "calls": 0, "seconds": 0.0})
        g["calls"] += 1
        g["seconds"] += d["seconds"]
    out = []
    for g in sorted(groups.values(), key=lambda g: -g["seconds"]):
        g["occupancy"] = None
        if target is None:
            g["note"] = "no target (give --target gfx... or --agent-info)"
        elif g["vgprs"] is None:
            g["note"] = "no VGPR column"
        else:
            try:
                vgprs = (unified_vgpr_count(g["vgprs"], g["agprs"] or 0) if unified
                         else g["vgprs"])
                r = occupancy(target, threads=g["threads"], vgprs=vgprs,
                              agprs=g["agprs"] or 0, sgprs=g["sgprs"], lds=g["lds"] or 0)
                g["occupancy"] = r.as_dict()
                g["note"] = ""
            except ValueError as e:  # FlashscopeError is a ValueError
                g["note"] = str(e)
        out.append(g)
    return out
