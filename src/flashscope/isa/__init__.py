"""ISA truth, read from the binaries: registers, spills, shared memory/LDS, local/scratch
memory and the instruction mix of compiled kernels, for NVIDIA cubins (ELF + SASS) and AMD
code objects (ELF + msgpack metadata + amdgcn), without a GPU.

- :func:`inspect_config`: build one config for one target (cached) and read it;
- :func:`inspect_configs`: configs x targets, compiles in parallel (:func:`inspect_pairs`:
  a list of (config, target) pairs);
- :func:`read_path`: records for a .cubin, .hsaco or a Triton cache directory;
- :func:`diff`: deltas between two records.
"""

from __future__ import annotations

from .batch import inspect_configs, inspect_pairs
from .read import attach_occupancy, read_binary, read_path, record_for
from .record import DIFF_FIELDS, KernelRecord, diff

__all__ = ["KernelRecord", "inspect_config", "inspect_configs", "inspect_pairs", "read_path",
           "read_binary", "record_for", "diff", "attach_occupancy", "DIFF_FIELDS"]


def inspect_config(config, target, *, occupancy: bool = True, **kw) -> KernelRecord:
    """Build ``config`` for ``target`` (see :func:`flashscope.compile.build` for ``kw``) and
    return its record; raises FlashscopeError when it cannot be built."""
    from ..compile import build

    rec = record_for(build(config, target, **kw))
    return attach_occupancy(rec) if occupancy else rec
