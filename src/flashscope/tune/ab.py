"""One A/B: every variant of one cell validated, then timed in interleaved bursts.

:func:`run_ab` does, on one device:

1. resolves every variant (:mod:`.variants`) and refuses a bad spec by name before any
   kernel runs;
2. builds each variant through its bench provider (:mod:`flashscope.bench.providers`:
   ``flashscope`` with the config, ``sdpa-cudnn``, ``fa4``, ...) and validates the exact
   step it will time as the bench harness does (:func:`flashscope.bench.validate.check_step`:
   two fresh input sets, NaN-poisoned allocations, float64/float32 reference, inputs
   unchanged, no stale result). A peer that is not available here, or any variant that
   fails, is dropped with the reason; the first variant, the base of every ratio, may not;
3. times them in interleaved bursts (:mod:`.timer`), L2 flushed before every launch by
   default;
4. checks the last timed launch of each variant against its reference again (a variant
   cannot do less work once it is timed), and drops one that fails;
5. returns the result (:mod:`.results`): per variant its median ms, TFLOP/s and the median
   and quartiles of its per-round ratio to the first variant, and every time.

On a CUDA device the target is the GPU's and the times are CUDA events; on CPU tensors
(Triton's interpreter: tests) the portable kernel runs and the host's clock times it.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import FlashscopeError
from .cells import Cell, mask_meta, problem
from .rule import round_ratios, stat
from .timer import CudaBursts, WallBursts, interleaved
from .variants import join_variants, resolve_all


@dataclass(frozen=True)
class Settings:
    """How a cell is timed: rounds of bursts of ``reps`` launches, the L2 flushed before
    each launch or not, and the seed of the round orders."""

    rounds: int = 20
    reps: int = 10
    flush: bool = True
    seed: int = 0

    def __post_init__(self):
        for name in ("rounds", "reps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise FlashscopeError(f"--{name} {v!r}: expected an integer >= 1")


def run_ab(cell: Cell, specs: dict, settings: Settings = Settings(), *, device="cuda",
           data_dir=None, burst: Optional[Callable] = None,
           log: Optional[Callable] = None) -> dict:
    """Validate and time ``specs`` ({name: spec}, the first the base) on ``cell``
    (module docstring). ``burst`` replaces the device's clock (tests); ``log(text)``
    hears of progress."""
    import torch

    from ..launch import device_target

    dev = torch.device(device)
    target = device_target(dev) if dev.type == "cuda" else None
    if dev.type == "cuda" and target is None:
        raise FlashscopeError(f"{torch.cuda.get_device_name(dev)}: not in flashscope's "
                              "target tables (flashscope targets)")
    prob = problem(cell, target or "sm90")
    variants = resolve_all(specs, prob, interpreter=target is None, data_dir=data_dir)
    kept, dropped = _validated(cell, variants, dev, log)
    burst = burst or (CudaBursts(dev, settings.flush) if dev.type == "cuda"
                      else WallBursts(settings.flush))
    t0 = time.perf_counter()
    times, last = interleaved({n: k["step"] for n, k in kept.items()}, settings.rounds,
                              settings.reps, burst, settings.seed,
                              log and (lambda k, n: log(f"{cell.name}: round {k}/{n}")))
    _recheck(cell, kept, last, times, dropped)
    meta = {"cell": cell.name, "model": cell.case.name or None, "shape": cell.case.shape,
            "causal": cell.case.causal, **mask_meta(cell.case), "dtype": cell.case.dtype,
            "target": target, **_device_meta(dev), "rounds": settings.rounds,
            "reps": settings.reps, "flush": settings.flush, "seed": settings.seed,
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "seconds": round(time.perf_counter() - t0, 1), "variants": join_variants(specs)}
    return {"meta": meta, "rows": rows(cell, kept, times), "times": times,
            "dropped": dropped}


def _validated(cell: Cell, variants: list, dev, log) -> tuple:
    """({name: {variant, step, ref, inputs, error}}, {name: why dropped})."""
    from ..bench.harness import _short, _unsupported
    from ..bench.providers import REGISTRY
    from ..bench.validate import ValidationFailure, check_step, make_step

    case = cell.case
    kept, dropped = {}, {}
    for v in variants:
        p = REGISTRY[v.provider]
        why = p.available(dev) or _unsupported(p, case)
        if not why:
            try:
                fn = p.build(case, {"config": v.config} if v.config is not None else {})
                inp, ref, step, err = check_step(lambda i, fn=fn: make_step(fn, case, i),
                                                 case, p.layout, dev)
                kept[v.name] = {"variant": v, "step": step, "ref": ref, "inputs": inp,
                                "error": err}
            except ValidationFailure as e:
                why = f"validation at {case.shape}: {e}"
            except Exception as e:  # a compile error, an unsupported launch: reported
                why = _short(e)
        if why:
            if v is variants[0]:
                raise FlashscopeError(f"{cell.name}: the first variant, {v.name}={v.spec}, "
                                      f"is the base of every ratio and cannot run: {why}")
            dropped[v.name] = why
        if log:
            log(f"{cell.name}: {v.name}={v.spec} " + (f"dropped: {why}" if why else "checked"))
    return kept, dropped


def _recheck(cell: Cell, kept: dict, last: dict, times: dict, dropped: dict) -> None:
    """The last timed launch of each variant against its reference (module docstring)."""
    from ..bench.validate import ValidationFailure, check_timed_result

    for i, (name, k) in enumerate(list(kept.items())):
        try:
            k["error"] = max(k["error"], check_timed_result(last[name], k["ref"], cell.case,
                                                            k["inputs"]))
        except ValidationFailure as e:
            if i == 0:
                raise FlashscopeError(f"{cell.name}: the base {name} failed: {e}") from None
            dropped[name] = str(e)
            del kept[name], times[name]


def rows(cell: Cell, kept: dict, times: dict) -> list:
    """One row per variant timed: median ms, TFLOP/s (a window charged the pairs it keeps,
    as the bench charges it), ratio to the first (median and quartiles over rounds), the
    worst relative error of its checks."""
    from ..bench.suite import case_flops

    flops = case_flops(cell.case)
    base = next(iter(kept))
    out = []
    for name, k in kept.items():
        ms = statistics.median(times[name])
        s = stat(round_ratios(times, name, base))
        out.append({**k["variant"].as_dict(), "ms": round(ms, 4),
                    "tflops": round(flops / (ms * 1e-3) / 1e12, 1), "ratio": round(s.ratio, 4),
                    "ratio_q1": round(s.q1, 4), "ratio_q3": round(s.q3, 4),
                    "max_rel_error": k["error"]})
    return out


def _device_meta(dev) -> dict:
    """Which device timed: its name, the id the process was pinned to and its UUID."""
    pinned = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if dev.type != "cuda":  # the id a worker was pinned to, if any
        return {"device": "cpu (Triton's interpreter)", "gpu": pinned[0] or None}
    import torch

    props = torch.cuda.get_device_properties(dev)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return {"device": props.name,
            "gpu": pinned[index] if index < len(pinned) and pinned[index] else str(index),
            "uuid": str(getattr(props, "uuid", "")) or None}
