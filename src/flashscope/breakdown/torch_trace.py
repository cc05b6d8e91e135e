"""torch.profiler: run a model, export its Chrome trace, read the trace into (name,
seconds) events.

On a GPU the events are the device's kernels, copies and fills (trace categories
``kernel``, ``gpu_memcpy``, ``gpu_memset``), each with its duration. Without one, they are
the CPU operators (``cpu_op``, and ``record_function`` ranges) with their *self* time
(duration minus that of the ops nested directly inside, per thread), so nested ops
(``aten::linear`` -> ``aten::addmm``) are not counted twice and the buckets add up to the
profiled time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import ParseError
from ..profile.ncu_csv import decode

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: CPU operators, and ``record_function`` ranges (flashscope's attention under Triton's
#: interpreter runs as Python inside one, with no operator of its own)
CPU_CATS = ("cpu_op", "user_annotation")


def record(model, x, trace_path, warmup: int = 2, iters: int = 3):
    """Profile ``iters`` forward passes after ``warmup`` unprofiled ones; write the trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if x.is_cuda:
        acts.append(ProfilerActivity.CUDA)
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        if x.is_cuda:
            torch.cuda.synchronize()
        with profile(activities=acts) as prof:
            for _ in range(iters):
                model(x)
            if x.is_cuda:
                torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))


def read_trace(path) -> tuple:
    """(events, kind): kind 'gpu' when the trace holds device kernels, else 'cpu'."""
    p = Path(path)
    try:
        text = decode(p.read_bytes(), str(p))
    except OSError as e:
        raise ParseError(f"{p}: cannot read ({e.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(f"{p}: not a Chrome trace (invalid JSON: {e.msg} at line "
                         f"{e.lineno})") from None
    except (ValueError, RecursionError):
        raise ParseError(f"{p}: not a Chrome trace (JSON nested too deeply)") from None
    evs = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(evs, list):
        raise ParseError(f"{p}: not a Chrome trace (expected 'traceEvents')")
    complete = []
    for i, e in enumerate(evs):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            name = e["name"]
            ts, dur = _time(e["ts"]), _time(e["dur"])
            if not isinstance(name, str):
                raise TypeError
        except (KeyError, TypeError, ValueError, OverflowError):
            raise ParseError(f"{p}: event {i}: expected a name, and ts and dur as finite "
                             "numbers") from None
        if dur < 0:
            raise ParseError(f"{p}: event {i} ({name[:40]}): negative duration {dur:g} us")
        pid, tid = e.get("pid"), e.get("tid")
        complete.append((str(e.get("cat", "")), name, ts, dur,
                         pid if isinstance(pid, (int, str)) else str(pid),
                         tid if isinstance(tid, (int, str)) else str(tid)))
    gpu = [(n, d * 1e-6) for c, n, _, d, _, _ in complete if c in GPU_CATS]
    if gpu:
        return gpu, "gpu"
    cpu = _self_times([e for e in complete if e[0] in CPU_CATS])
    if not cpu:
        raise ParseError(f"{p}: no kernel or cpu_op events in the trace")
    return cpu, "cpu"


def _time(v) -> float:
    """A trace's ts or dur (microseconds): a finite JSON number (or its text)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TypeError
    x = float(v)
    if not math.isfinite(x):
        raise ValueError
    return x


def _self_times(ops) -> list:
    """Self time of each op: its duration minus its direct children's, per (pid, tid)."""
    by_thread = {}
    for op in ops:
        by_thread.setdefault((op[4], op[5]), []).append(op)
    out = []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e[2], -e[3]))
        stack = []  # [name, end, self]
        for _, name, ts, dur, _, _ in evs:
            while stack and ts >= stack[-1][1]:
                n, _, s = stack.pop()
                out.append((n, max(s, 0.0) * 1e-6))
            if stack:
                stack[-1][2] -= dur
            stack.append([name, ts + dur, dur])
        out.extend((n, max(s, 0.0) * 1e-6) for n, _, s in stack)
    return out
