"""Where a model's time goes: GPU kernels (or CPU ops) bucketed into GEMM, attention,
normalization, elementwise/bias, memory copy/fill and other, with each bucket's share and
the Amdahl ceiling on what a faster attention can buy.

- :mod:`.buckets`: the kernel-name rules (a data table of regexes) and the summary.
- :mod:`.model`: a transformer with random weights and its presets.
- :mod:`.torch_trace`: torch.profiler run and its Chrome-trace reader.
- :mod:`.rocprof`: rocprofv3 kernel-trace / stats / agent-info CSVs, with occupancy.
- :mod:`.ncu_export`: an ncu CSV export as kernel durations.
"""

from .buckets import BUCKETS, RULES, classify, summarize

__all__ = ["BUCKETS", "RULES", "classify", "summarize"]
