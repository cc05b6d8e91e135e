"""Evaluating one point: the worker functions the executors run.

A work item is a plain dict (picklable, JSON-able): ``kind`` ("offline" or "gpu"),
``key`` (:func:`flashscope.sweep.store.work_key`), ``problem`` (target, dtype, head_dim,
causal), ``config`` (the knobs of the kernel's family record), ``kernel`` (absent: the
portable forward) and, for the GPU, ``shape`` ("B,H,N,D").
Each function returns one record dict and never raises for a config that fails (status
"failed" with the reason); only status "ok" records carry measurements.

Offline: the config is compiled for the target (:func:`flashscope.isa.inspect_config`,
cached) and read: registers, spills, local and shared memory, threads, and the
theoretical occupancy with its limiter and active warps
(:func:`flashscope.occupancy.occupancy_for_record`).

GPU: the same offline reading (compiled for the benchmark's shape, so it is the binary
the launch uses) plus the benchmark harness (:func:`flashscope.bench.harness.run_bench`)
on the ``flashscope`` provider with this config: validation on odd shapes and on the shape
itself, median time, and a check of the last timed output. Only a validated timing is
recorded; TFLOP/s = 4 B H N^2 D (x0.5 causal) / time.

Backward kernels (item ``kernel``: "bwd_dkdv" or "bwd_dq") are read offline the same way.
GPU timing is the forwards' only.
"""

from __future__ import annotations

import time

from ..errors import FlashscopeError
from .space import Problem, kernel_axes

#: KernelRecord fields copied into sweep records.
RESOURCE_FIELDS = ("registers", "spill_stores", "spill_loads", "local_bytes",
                   "shared_bytes", "threads", "agprs", "sgprs", "vgpr_spills",
                   "wgmma_serialized")


def make_item(kind: str, key: str, problem: Problem, cfg,
              shape: "str | None" = None, kernel: str = "fwd") -> dict:
    item = {"kind": kind, "key": key, "problem": problem.as_dict(), "config": cfg.as_dict()}
    if shape:
        item["shape"] = shape
    if kernel != "fwd":
        item["kernel"] = kernel
    return item


def item_config(item: dict):
    """The item's config record, of its kernel's family."""
    return kernel_axes(item.get("kernel", "fwd"))[1].from_dict(item["config"])


def base_record(item: dict) -> dict:
    cfg = item_config(item)
    rec = {"key": item["key"], "kind": item["kind"], **item["problem"],
           "config": cfg.as_dict(), "config_key": cfg.key, "label": cfg.label}
    if item.get("kernel", "fwd") != "fwd":
        rec["kernel"] = item["kernel"]
    if item.get("shape"):
        rec["shape"] = item["shape"]
    return rec


def _resources(item: dict, problem_shape=None) -> dict:
    """Offline reading of one item; raises FlashscopeError when it cannot be built."""
    from ..isa import inspect_config
    from ..occupancy import occupancy_for_record

    p = item["problem"]
    kw = {"head_dim": p["head_dim"], "dtype": p["dtype"], "causal": p["causal"]}
    if problem_shape is not None:
        kw["problem"] = problem_shape
    kw["kernel"] = item.get("kernel", "fwd")
    rec = inspect_config(item_config(item), p["target"], **kw)
    out = {k: getattr(rec, k, None) for k in RESOURCE_FIELDS}
    try:
        occ = occupancy_for_record(rec)
    except FlashscopeError as e:
        out.update(occupancy=None, limiter=None, active_warps=None, occupancy_reason=str(e))
    else:
        out.update(occupancy=occ.occupancy, limiter=list(occ.limiter),
                   active_warps=occ.active_warps)
        if occ.reason:
            out["occupancy_reason"] = occ.reason
    return out


def offline(item: dict) -> dict:
    rec = base_record(item)
    t0 = time.perf_counter()
    try:
        rec.update(_resources(item))
        rec["status"] = "ok"
    except FlashscopeError as e:
        rec.update(status="failed", reason=str(e))
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def parse_gpu_shape(shape: str) -> tuple:
    """``B,H,N,D`` -> (B, H, N, D) (self-attention: Nk = N, Hkv = H)."""
    from ..bench.suite import parse_shape

    B, H, N, D, Nk, Hkv = parse_shape(shape)
    if Nk != N or Hkv != H:
        raise FlashscopeError(f"--shapes {shape!r}: expected B,H,N,D (self-attention)")
    return B, H, N, D


def gpu(item: dict) -> dict:
    from ..bench.harness import run_bench
    from ..bench.providers import REGISTRY
    from ..bench.suite import Case

    rec = base_record(item)
    p = item["problem"]
    B, H, N, D = parse_gpu_shape(item["shape"])
    t0 = time.perf_counter()
    try:
        rec.update(_resources(item, problem_shape=(B, H, H, N, N)))
    except FlashscopeError as e:
        rec.update(status="failed", reason=str(e),
                   seconds=round(time.perf_counter() - t0, 3))
        return rec
    case = Case(B, H, N, N, D, H, bool(p["causal"]), p["dtype"], "fwd")
    cfg = item_config(item)
    results, _ = run_bench([case], [REGISTRY["flashscope"]], device=item.get("device", "cuda"),
                           options={"config": cfg}, odd_shapes=item.get("odd_shapes", True))
    r = results[0]
    rec["validated_shapes"] = list(r.validated_shapes)
    if r.status == "ok":
        rec.update(status="ok", ms=r.ms, tflops=r.tflops, max_rel_error=r.max_rel_error)
    else:
        rec.update(status="failed", reason=f"{r.status}: {r.reason}")
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def odd_shape_check(rec: dict, device: str = "cuda") -> "str | None":
    """Validate a GPU record's config on the small odd shapes of its case (lengths that
    are no tile multiple, Nq != Nk, GQA): None when it passes, else the reason."""
    from ..bench.harness import run_bench
    from ..bench.providers import REGISTRY
    from ..bench.suite import Case, odd_cases

    B, H, N, D = parse_gpu_shape(rec["shape"])
    case = Case(B, H, N, N, D, H, bool(rec["causal"]), rec["dtype"], "fwd")
    cfg = item_config(rec)
    results, _ = run_bench(odd_cases(case), [REGISTRY["flashscope"]], device=device,
                           options={"config": cfg}, odd_shapes=False)
    bad = [r for r in results if r.status != "ok"]
    return None if not bad else f"{bad[0].case.shape}: {bad[0].status}: {bad[0].reason}"


#: Worker per kind.
EVALUATORS = {"offline": offline, "gpu": gpu}
