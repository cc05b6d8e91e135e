"""A/Bs of many cells, spread over every GPU of a host.

:func:`cell_specs` writes each cell's variant list: the default ``d=+`` first (the base of
every ratio), the common variants, the cell's own extras, its one-knob neighbours and the
transplanted entries when asked (:mod:`.search`), the peers last (``n=cudnn`` by default).

:func:`run_cells` times them with one worker process per GPU
(:class:`flashscope.sweep.executors.GpuExecutor`: each worker pinned to its device with
``CUDA_VISIBLE_DEVICES`` before CUDA starts), the cells handed out longest first (FLOPs
times variants), so a long cell starts while the others share the rest of the GPUs
instead of starting last. A worker times whole cells: all variants of
an A/B share one GPU and its clock, so every ratio is taken on one device; a result file
names its GPU (id and UUID), and results of different GPUs meet only as ratios, never as
times (:mod:`.rule`). Before timing, the flashscope configs are compiled offline in a pool
of local processes, as the sweep's GPU mode does, so the GPUs do not wait on the compiler
one config at a time.

Durability: each cell's result is written (atomically) by the worker that timed it the
moment it is done, so a run killed at any point keeps every finished cell; workers die
with the parent. ``--resume`` skips the cells already in the folder; a lock on the folder
keeps a second run from writing into it at the same time.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from ..errors import FlashscopeError
from .ab import Settings, run_ab
from .cells import Cell, parse_cell, problem
from .results import read_result, result_paths, write_result
from .search import neighbour_specs, transplant_specs
from .variants import PEERS, default_config, join_variants, parse_variants

#: the peers' variant names (``--peers cudnn,fa4``)
PEER_NAMES = {"cudnn": "n", "fa4": "f"}


def cell_specs(cell: Cell, target: "str | None", *, common: dict = None, extra: dict = None,
               neighbours: bool = False, transplants: bool = False, peers=("cudnn",),
               data_dir=None) -> dict:
    """``{name: spec}`` of one cell (module docstring); a name used twice is refused by
    the cell's name (``d`` is the default, ``n`` cuDNN, ``f`` FlashAttention-4)."""
    parts = [("the default", {"d": "+"}), ("--variants", common or {}),
             ("--extra", extra or {})]
    if neighbours or transplants:
        prob = problem(cell, target or "sm90")
        base = default_config(prob, target is None, data_dir)
        if neighbours:
            parts.append(("--neighbours", neighbour_specs(base, prob)))
        if transplants:
            parts.append(("--transplants", transplant_specs(base, prob, data_dir)))
    for p in peers:
        if p not in PEERS:
            raise FlashscopeError(f"--peers {p!r}: expected some of {', '.join(PEERS)}")
    parts.append(("--peers", {PEER_NAMES[p]: p for p in peers}))
    out, where = {}, {}
    for what, specs in parts:
        for name, spec in specs.items():
            if name in out:
                raise FlashscopeError(f"{cell.name}: variant name {name!r} from {what} is "
                                      f"taken by {where[name]} ({out[name]!r})")
            out[name], where[name] = spec, what
    return out


def parse_extra(text: str, cells: list) -> dict:
    """``--extra "CELL:NAME=SPEC;CELL:NAME=SPEC"`` -> {cell: {name: spec}}."""
    names = {c.name for c in cells}
    out = {}
    for item in filter(None, (x.strip() for x in str(text or "").split(";"))):
        cell, sep, variant = item.partition(":")
        if not sep or cell not in names:
            raise FlashscopeError(f"--extra {item!r}: expected CELL:NAME=SPEC with CELL one of "
                                  f"--cells ({', '.join(sorted(names))})")
        for name, spec in parse_variants(variant, "--extra").items():
            if name in out.setdefault(cell, {}):
                raise FlashscopeError(f"--extra: {cell} names {name!r} twice")
            out[cell][name] = spec
    return out


def time_cell(item: dict) -> dict:
    """Worker body: time one cell and write its result; returns a summary row, or the
    error of a cell that cannot run (a bad variant, a base that fails)."""
    cell = parse_cell(item["cell"], item["dtype"])
    if item.get("model"):
        cell = Cell(cell.name, replace(cell.case, name=item["model"]))
    try:
        res = run_ab(cell, item["specs"], Settings(**item["settings"]),
                     device=item.get("device", "cuda"), data_dir=item.get("data_dir"))
    except FlashscopeError as e:
        return {"cell": cell.name, "error": str(e)}
    write_result(item["path"], res)
    return {"cell": cell.name, "model": res["meta"]["model"], "gpu": res["meta"]["gpu"],
            "device": res["meta"]["device"],
            "ratios": {r["name"]: r["ratio"] for r in res["rows"]},
            "tflops": {r["name"]: r["tflops"] for r in res["rows"]},
            **best_config(res["rows"]), "dropped": res["dropped"]}


def best_config(rows) -> dict:
    """The fastest flashscope config of a cell's rows (peers left out) and the default's
    regret: the default's time over that config's (1.0 where the default is the fastest;
    the first row is the default, every ratio is a time over its time)."""
    configs = [r for r in rows if r.get("config") is not None]
    if not configs:
        return {"configs": [], "best": None, "best_label": None, "regret": None}
    best = min(configs, key=lambda r: r["ratio"])
    return {"configs": [r["name"] for r in configs], "best": best["name"],
            "best_label": best.get("label"),
            "regret": round(1.0 / best["ratio"], 4) if best["ratio"] > 0 else None}


class FolderLock:
    """An exclusive lock on ``DIR/.lock`` for the life of a run (refused when held)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise FlashscopeError(f"--out {folder}: another flashscope tune run is writing "
                                  "into it") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


#: what a resumed cell must have been timed with, besides its variants
_SETTINGS = ("rounds", "reps", "flush", "seed")


def todo(plan: dict, out: Path, settings: Settings, *, resume: bool, force: bool) -> list:
    """The cells of ``plan`` ({cell name: (cell, specs)}) still to time in ``out``:
    refuses a folder holding results unless resuming (done cells with the same variants
    and settings are skipped) or forced (all timed again)."""
    held = {p.stem: p for p in result_paths(out)} if out.is_dir() else {}
    if held and not (resume or force):
        raise FlashscopeError(f"--out {out}: holds A/B results ({', '.join(sorted(held))}); "
                              "pass --resume to continue that run or --force to time again")
    left = []
    for name, (cell, specs) in plan.items():
        if resume and name in held:
            meta = read_result(held[name]).meta
            then = (meta["variants"], *(meta.get(k) for k in _SETTINGS))
            now = (join_variants(specs), *(getattr(settings, k) for k in _SETTINGS))
            if then == now:
                continue
            raise FlashscopeError(f"--resume: {held[name]} timed other variants or settings "
                                  f"({meta['variants']}; rounds {meta['rounds']}, reps "
                                  f"{meta['reps']}, flush {meta['flush']}); use another --out")
        left.append(name)
    return left


def run_cells(plan: dict, out, settings: Settings, *, target: "str | None" = None,
              devices=None, executor=None, device: str = "cuda", data_dir=None,
              resume: bool = False, force: bool = False, jobs: int = 0,
              log: Optional[Callable] = None) -> dict:
    """Time every cell of ``plan`` ({cell name: (cell, specs)}) into ``out`` (module
    docstring); returns the summary: each cell's ratios and TFLOP/s by variant. ``target``
    (the GPUs' target) enables the offline compiles first; ``jobs`` their processes."""
    from ..sweep.executors import GpuExecutor

    out = Path(out)
    with FolderLock(out):
        names = todo(plan, out, settings, resume=resume, force=force)
        if target is not None and names:
            _precompile([plan[n] for n in names], target, jobs)
        names.sort(key=lambda n: -_work(plan[n]))  # longest first: no long cell ends last
        items = [{"cell": n, "model": plan[n][0].case.name or None,
                  "dtype": plan[n][0].case.dtype, "specs": plan[n][1],
                  "settings": settings.__dict__, "device": device,
                  "data_dir": None if data_dir is None else str(data_dir),
                  "path": str(out / f"{n}.json")} for n in names]
        ex = executor or GpuExecutor(devices)
        rows = {}
        try:
            for _, row in ex.imap(time_cell, items):
                rows[row["cell"]] = row
                if log:
                    log(row)
        finally:
            if executor is None:
                ex.close()
        return {"cells": [rows.get(n) or _done_row(out / f"{n}.json") for n in plan],
                "settings": settings.__dict__}


def _work(entry: tuple) -> float:
    """A cell's timing work, for the order cells go to the workers: its FLOPs times the
    variants that time it."""
    from ..bench.suite import case_flops

    cell, specs = entry
    return case_flops(cell.case) * max(1, len(specs))


def _done_row(path: Path) -> dict:
    res = read_result(path)
    return {"cell": res.cell.name, "model": res.meta.get("model"),
            "gpu": res.meta.get("gpu"), "device": res.meta["device"],
            "ratios": {n: r["ratio"] for n, r in res.rows.items()},
            "tflops": {n: r["tflops"] for n, r in res.rows.items()},
            **best_config(list(res.rows.values())), "resumed": True}


def _compile_one(item: tuple) -> None:
    """Compile one config offline (into the caches); a config that cannot be built is left
    for its timing to report."""
    from ..families import family
    from ..isa import inspect_config

    kernel, config, target, kw = item
    try:
        inspect_config(family(kernel).Config.from_dict(config), target, occupancy=False, **kw)
    except FlashscopeError:
        pass


def _precompile(plan: list, target: str, jobs: int) -> None:
    """Compile every flashscope config of the cells offline for their shapes, in spawned
    local processes (this one may hold CUDA), as the sweep's GPU mode does."""
    from ..sweep.executors import LocalExecutor
    from .variants import resolve_all

    items = []
    for cell, specs in plan:
        c = cell.case
        kw = dict(head_dim=c.D, dtype=c.dtype, causal=c.causal,
                  problem=(c.B, c.H, c.Hkv, c.Nq, c.Nk))
        items += [(v.config.KERNEL, v.config.as_dict(), target, kw)
                  for v in resolve_all(specs, problem(cell, target)) if v.config is not None]
    pool = LocalExecutor(jobs, start="spawn")
    try:
        for _ in pool.imap(_compile_one, items):
            pass
    finally:
        pool.close()
