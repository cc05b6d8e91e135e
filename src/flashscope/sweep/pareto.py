"""Pareto fronts over sweep records.

A record a dominates b when it is at least as good in every objective and strictly better
in one ("min" objectives lower, "max" objectives higher). The front is the set of records
no other record dominates. Records missing an objective (failed, not measured) are left
out; NaN is never a value (a record with NaN in an objective is left out too).

Fronts the sweep reports (:data:`FRONTS`):
- offline: registers (min) against occupancy (max);
- GPU: latency (min) against registers (min), and latency against occupancy (max).
"""

from __future__ import annotations

import math

FRONTS = {
    "offline": (("registers", "min"), ("occupancy", "max")),
    "gpu_registers": (("ms", "min"), ("registers", "min")),
    "gpu_occupancy": (("ms", "min"), ("occupancy", "max")),
}


def _values(rec: dict, objectives) -> "tuple | None":
    out = []
    for name, sense in objectives:
        v = rec.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            return None
        out.append(-v if sense == "max" else v)
    return tuple(out)


def dominates(a: tuple, b: tuple) -> bool:
    """a, b as minimization tuples."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def pareto_front(records, objectives) -> list:
    """The non-dominated records (ties in every objective all kept), sorted by the first
    objective. ``objectives``: ((field, "min"|"max"), ...)."""
    for _, sense in objectives:
        if sense not in ("min", "max"):
            raise ValueError(f"objective sense {sense!r}: expected 'min' or 'max'")
    scored = [(v, r) for r in records
              if r.get("status", "ok") == "ok" and (v := _values(r, objectives)) is not None]
    front = [(v, r) for v, r in scored
             if not any(dominates(w, v) for w, _ in scored)]
    front.sort(key=lambda vr: vr[0])
    return [r for _, r in front]
