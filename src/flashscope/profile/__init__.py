"""Hardware counters: Nsight Compute's CSV read into typed rows, acceptance gates, and how
well each counter predicts measured speed (Spearman rank correlation).

- :mod:`.metrics`: the counters flashscope asks ncu for, as a data table.
- :mod:`.ncu_csv`: a parser for ``ncu --csv`` output (long "details" and wide "raw" pages).
- :mod:`.gates`: ``metric>=value`` acceptance gates, pass/fail per kernel.
- :mod:`.rank`: Spearman's rho with average ranks for ties.
- :mod:`.runner`: builds and runs the ncu command on a short child program (GPU only).
- :mod:`.timeline`: per-phase cycles of each work tile from the sm90 kernel's clock
  stamps (a ``TRACE`` build, ``scripts/gpu/trace_fwd.py``).
"""

from .gates import DEFAULT_GATES, Gate, evaluate_gates, parse_gate
from .metrics import METRICS, metric_by_key
from .ncu_csv import KernelCounters, parse_ncu_csv, read_ncu_csv
from .rank import predictive_power, spearman

__all__ = ["DEFAULT_GATES", "Gate", "KernelCounters", "METRICS", "evaluate_gates",
           "metric_by_key", "parse_gate", "parse_ncu_csv", "predictive_power",
           "read_ncu_csv", "spearman"]
