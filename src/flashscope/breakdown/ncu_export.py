"""An Nsight Compute CSV export as (kernel name, seconds) events for the breakdown.

Any ``ncu --csv`` output that includes ``gpu__time_duration.sum`` per kernel works (e.g.
``ncu --csv --metrics gpu__time_duration.sum python model.py``, or ``ncu --import
report.ncu-rep --csv --page raw``). Note that ncu serializes kernels and replays each one,
so the shares are of summed kernel time, not of wall time.
"""

from __future__ import annotations

from ..errors import ParseError
from ..profile.ncu_csv import read_ncu_csv


def read_ncu_events(path) -> list:
    events = []
    for k in read_ncu_csv(path):
        ms = k.get("duration")
        if ms is None:
            raise ParseError(f"--ncu-csv {path}: kernel {k.id} ({k.name[:40]}) has no "
                             "gpu__time_duration.sum; add it to --metrics")
        events.append((k.name, ms * 1e-3))
    return events
