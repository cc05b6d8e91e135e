"""The Nsight Compute counters flashscope reads, as data.

Each :class:`Metric` maps a short key (used in gates, JSON and tables) to ncu's metric name
and the unit flashscope reports it in. Names are those ncu 2023+ uses on sm_80..sm_90
(checked on an H100, see ``docs/profile.md``); ``launch__*`` values are per launch, the
``.avg``/``.sum`` rollups over the whole kernel.

Units: ncu prints values with a unit column. With ``--print-units base`` (the runner passes
it) ncu 2025.3 writes ``ns``, ``byte/s``, ``byte/block``; other versions and settings write
``nsecond``, ``usecond``, ``Kbyte``, ``Gbyte/second``. :func:`to_base` converts time to
milliseconds and sizes to bytes with decimal (SI) prefixes, which is what ncu means by
``Kbyte``/``Mbyte``, and refuses a time or size metric in a unit it does not know (reading
``831,968 ns`` as milliseconds once put cuDNN at 0.00066 TFLOP/s instead of 661).
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
    Metric("theoretical_occupancy", "sm__maximum_warps_per_active_cycle_pct", "theor. occ.",
           "%", "resident warps per SM the launch allows / the SM's maximum (the occupancy "
                "calculator's number)"),
    Metric("achieved_occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "achieved occ.", "%", "average resident warps per active cycle / the SM's maximum"),
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
_PREFIX = {"n": -9, "u": -6, "m": -3, "": 0, "K": 3, "M": 6, "G": 9, "T": 12}  # powers of 10
#: ncu's spellings of time and size units -> (dimension, power of 10 from the SI base unit
#: to flashscope's unit). ncu 2025.3 with ``--print-units base`` prints ``ns``, ``byte/s`` and
#: ``byte/block`` (H100 recording, tests/data/profile); older versions and
#: ``--print-units auto`` write ``nsecond``, ``usecond``, ``Kbyte``, ``Gbyte/second``.
_BASE = {"second": ("time", 3), "s": ("time", 3), "byte": ("bytes", 0),
         "byte/second": ("rate", 0), "byte/s": ("rate", 0), "byte/block": ("bytes", 0)}
_UNIT_RE = re.compile(r"^([numKMGT]?)(second|s|byte/second|byte/s|byte/block|byte)$")
#: flashscope's unit -> the dimension a value must arrive in.
_DIMENSION = {"ms": "time", "B": "bytes", "B/s": "rate"}


def to_base(value: float, unit: str, want: "str | None" = None) -> float:
    """``value`` in ncu's ``unit`` converted to flashscope's unit: ms for time, bytes,
    bytes/s (``1,093,280 ns`` -> ``1.09328`` ms). Units without a time or size dimension
    (%, counts, register/thread, warp, block) pass unchanged. With ``want`` (the metric's
    flashscope unit: ms, B, B/s), a unit of another dimension, or none, raises ValueError:
    a duration in an unknown unit must not pass as milliseconds."""
    m = _UNIT_RE.match(unit.strip())
    dim, exp = (None, 0) if not m else (_BASE[m.group(2)][0],
                                        _PREFIX[m.group(1)] + _BASE[m.group(2)][1])
    need = _DIMENSION.get(want or "")
    if need is not None and dim != need:
        raise ValueError(f"unit {unit!r} is not a {need} unit (expected e.g. "
                         f"{ {'time': 'ns', 'bytes': 'byte', 'rate': 'byte/s'}[need]!r})")
    # one multiplication or division by an exact power of ten: correctly rounded
    return value * 10 ** exp if exp >= 0 else value / 10 ** -exp
