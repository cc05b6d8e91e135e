"""Acceptance gates: ``metric >= value`` checks on one kernel's counters.

The defaults are the occupancy plan's Nsight gates (founding note 001): achieved occupancy
>= 20 %, eligible warps per scheduler >= 2, issue-slot utilization >= 60 %, theoretical
occupancy >= 33 %. Whether passing them predicts speed is a separate, measured question
(:mod:`.rank`); on an H100 the fastest attention kernel fails all four (anchors.md).
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from ..errors import FlashscopeError, closest
from .metrics import METRICS, metric_by_key

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
_GATE_RE = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*%?\s*$")


@dataclass(frozen=True)
class Gate:
    metric: str  # short key of a Metric
    op: str  # one of >=, <=, >, <
    threshold: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.threshold:g}"

    def check(self, value):
        """True/False, or None when the metric was not collected."""
        if value is None:
            return None
        return bool(_OPS[self.op](value, self.threshold))


DEFAULT_GATES = (
    Gate("achieved_occupancy", ">=", 20.0),
    Gate("eligible_warps", ">=", 2.0),
    Gate("issue_active", ">=", 60.0),
    Gate("theoretical_occupancy", ">=", 33.0),
)


def parse_gate(text: str) -> Gate:
    """``"achieved_occupancy>=20"`` (short key or ncu name; a trailing % is allowed)."""
    m = _GATE_RE.match(str(text))
    if not m:
        raise FlashscopeError(f"--gate {text!r}: expected METRIC>=VALUE, e.g. "
                              "achieved_occupancy>=20")
    name, op, value = m.groups()
    metric = metric_by_key(name)
    if metric is None:
        keys = [x.key for x in METRICS]
        raise FlashscopeError(f"--gate {text!r}: unknown metric {name!r}{closest(name, keys)}; "
                              f"known: {', '.join(keys)}")
    try:
        threshold = float(value)
    except ValueError:
        raise FlashscopeError(f"--gate {text!r}: {value!r} is not a number") from None
    if not math.isfinite(threshold):
        raise FlashscopeError(f"--gate {text!r}: {value!r} is not a finite number")
    return Gate(metric.key, op, threshold)


def evaluate_gates(row: dict, gates=DEFAULT_GATES) -> dict:
    """``{str(gate): True/False/None}`` plus ``"all"``: True only if every gate passed
    (None if any metric is missing and none failed)."""
    out = {str(g): g.check(row.get(g.metric)) for g in gates}
    vals = list(out.values())
    out["all"] = False if False in vals else (None if None in vals else True)
    return out
