"""The Nsight Compute counters flashscope reads, as data.

Each :class:`Metric` maps a short key (used in gates, JSON and tables) to ncu's metric name
and the unit flashscope reports it in. Names are those ncu 2023+ uses on sm_80..sm_90
(checked on an H100, see ``docs/profile.md``); ``launch__*`` values are per launch, the
``.avg``/``.sum`` rollups over the whole kernel.

Units: ncu prints values with a unit column (``nsecond``, ``Kbyte``, ``Gbyte/second``,
``%``...). :func:`to_base` converts time to milliseconds and sizes to bytes with decimal
(SI) prefixes, which is what ncu means by ``Kbyte``/``Mbyte``; flashscope's runner also
passes ``--print-units base`` so the prefixes do not arise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Metric:
    key: str  # short name: "achieved_occupancy"
    ncu: str  # ncu metric name
    label: str  # column title
    unit: str  # unit flashscope reports: "%", "ms", "B", "B/s", "count"
    doc: str  # what it measures, one line


METRICS = (
    Metric("theoretical_occupancy", "sm__maximum_warps_per_active_cycle_pct", "theor. occ.", "%",
           "resident warps per SM the launch allows / the SM's maximum (the occupancy calculator's number)"),
    Metric("achieved_occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occ.",
           "%", "average resident warps per active cycle / the SM's maximum"),
    Metric("limit_registers", "launch__occupancy_limit_registers", "blk lim regs", "count",
           "blocks per SM the register file allows"),
    Metric("limit_shared_mem", "launch__occupancy_limit_shared_mem", "blk lim smem", "count",
           "blocks per SM the shared-memory carveout allows"),
    Metric("limit_warps", "launch__occupancy_limit_warps", "blk lim warps", "count",
           "blocks per SM the warp slots allow"),
    Metric("limit_blocks", "launch__occupancy_limit_blocks", "blk lim blocks", "count",
           "blocks per SM the hardware block slots allow"),
    Metric("eligible_warps", "smsp__warps_eligible.avg.per_cycle_active", "eligible/sched", "count",
           "warps ready to issue per scheduler per active cycle"),
    Metric("issue_active", "smsp__issue_active.avg.pct_of_peak_sustained_active", "issue active",
           "%", "cycles a scheduler issued an instruction / active cycles"),
    Metric("tensor_pipe", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
           "tensor pipe", "%", "cycles the tensor pipe was busy / active cycles"),
    Metric("dram_throughput", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM % peak",
           "%", "DRAM throughput / its peak, over the kernel's elapsed time"),
    Metric("dram_bandwidth", "dram__bytes.sum.per_second", "DRAM B/s", "B/s",
           "DRAM bytes read + written per second"),
    Metric("registers", "launch__registers_per_thread", "regs/thread", "count",
           "registers allocated per thread"),
    Metric("block_size", "launch__block_size", "threads", "count", "threads per block"),
    Metric("grid_size", "launch__grid_size", "blocks", "count", "blocks in the grid"),
    Metric("smem_static", "launch__shared_mem_per_block_static", "static smem", "B",
           "static shared memory per block"),
    Metric("smem_dynamic", "launch__shared_mem_per_block_dynamic", "dyn. smem", "B",
           "dynamic shared memory per block"),
    Metric("smem_driver", "launch__shared_mem_per_block_driver", "driver smem", "B",
           "shared memory the driver reserves per block"),
    Metric("duration", "gpu__time_duration.sum", "time", "ms", "kernel duration"),
)

_BY_KEY = {m.key: m for m in METRICS}
_BY_NCU = {m.ncu: m for m in METRICS}

#: The metrics whose rank correlation with speed is reported (not launch geometry).
PREDICTORS = ("theoretical_occupancy", "achieved_occupancy", "eligible_warps", "issue_active",
              "tensor_pipe", "dram_throughput", "registers")


def metric_by_key(name: str) -> Optional[Metric]:
    """The metric for a short key or an ncu name, else None."""
    return _BY_KEY.get(name) or _BY_NCU.get(name)


def ncu_metric_list() -> str:
    """The comma-separated list for ``ncu --metrics``."""
    return ",".join(m.ncu for m in METRICS)


#: Decimal prefixes ncu writes in unit names.
_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
#: Base unit -> (reported unit, factor from the SI base unit to it).
_BASE = {"second": ("ms", 1e3), "byte": ("B", 1.0), "byte/second": ("B/s", 1.0)}
_UNIT_RE = re.compile(r"^([numKMGT]?)(second|byte|byte/second)$")


def to_base(value: float, unit: str) -> float:
    """``value`` in ``unit`` converted to flashscope's unit: ms for time, bytes, bytes/s.
    Units without a time or size dimension (%, counts, register/thread) pass unchanged."""
    m = _UNIT_RE.match(unit.strip())
    if not m:
        return value
    prefix, base = m.groups()
    return value * _PREFIX[prefix] * _BASE[base][1]
