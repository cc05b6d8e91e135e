"""Sweep orchestration: space -> pruned points -> executor -> JSONL records -> fronts.

:func:`run_sweep` does, in order:

1. checks the request (shapes, search, budget) before any work;
2. lists the jobs: each problem of the space (offline), or each (problem, shape) pair whose
   head dims agree (GPU);
3. appends one "pruned" record per infeasible point (with its family rule's reason);
4. exhaustive: evaluates every feasible point not finished yet; evolve: runs
   :class:`~flashscope.sweep.evolve.Evolution` per job with ``budget`` new evaluations,
   seeded with the tuned and default configs and knowing the scores of ``history`` files
   and of this file's own records;
5. appends each record the moment it arrives (:class:`~flashscope.sweep.store.ResultStore`),
   under a progress bar with ETA on a terminal (:class:`~flashscope.progress.Progress`);
6. returns a summary (counts, best per job, Pareto fronts, evolve traces) that the command
   writes as ``summary.json`` next to ``results.jsonl`` and plots as ``pareto.png``.

Backward kernels (a space built with ``kernel="bwd_dkdv"`` or ``"bwd_dq"``) sweep offline
and exhaustively only: GPU timing and evolve are the forward's.

GPU sweeps compile every point first, offline and in parallel on the local cores (the
binaries land in flashscope's and Triton's caches), then time them one at a time per GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..errors import FlashscopeError
from ..families import Problem as FamilyProblem
from ..families import family
from ..progress import Progress
from . import evaluate as ev
from .evolve import Evolution, objective
from .executors import LocalExecutor, make_executor
from .pareto import FRONTS, pareto_front
from .space import KERNELS, Problem, Space, is_forward, kernel_axes
from .store import ResultStore, read_records, work_key

SEARCHES = ("exhaustive", "evolve")


@dataclass
class SweepRequest:
    space: Space
    out: Path
    gpu: bool = False
    shapes: tuple = ()  # "B,H,N,D" strings (GPU)
    search: str = "exhaustive"
    budget: int = 0  # new evaluations per job (evolve)
    seed: int = 0
    resume: bool = False
    executor: str = "local"
    jobs: int = 0
    address: Optional[str] = None
    devices: Optional[list] = None
    history: tuple = ()  # earlier results.jsonl files (evolve)
    batch: int = 0  # evolve generation size (0: the executor's parallelism, at least 4)
    progress: bool = True
    precompile: bool = True  # GPU: compile all points offline first
    odd_shapes: bool = True  # GPU: validate each config on the harness' odd shapes too
    device: str = "cuda"  # GPU sweeps: "cpu" runs through Triton's interpreter (tests)
    evaluator: Optional[Callable] = None  # replaces evaluate.EVALUATORS[kind] (tests)
    tuned_dir: Optional[str] = None  # where seeds' tuned configs are read from
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    problem: Problem
    shape: Optional[str] = None
    kernel: str = "fwd"

    @property
    def label(self) -> str:
        return (("" if self.kernel == "fwd" else f"{self.kernel} ") + self.problem.label
                + (f" [{self.shape}]" if self.shape else ""))

    def matches(self, rec: dict) -> bool:
        p = self.problem
        return (rec.get("kernel", "fwd") == self.kernel and rec.get("target") == p.target
                and rec.get("dtype") == p.dtype and rec.get("head_dim") == p.head_dim
                and rec.get("causal") == p.causal and rec.get("shape") == self.shape)


def list_jobs(req: SweepRequest) -> list:
    problems = req.space.problems()
    kernel = req.space.kernel
    if not req.gpu:
        if req.shapes:
            raise FlashscopeError("--shapes applies to GPU sweeps; add --gpu")
        return [Job(p, None, kernel) for p in problems]
    if not req.shapes:
        raise FlashscopeError("--gpu needs --shapes B,H,N,D[;...] (e.g. 4,32,4096,64)")
    jobs = []
    for s in req.shapes:
        D = ev.parse_gpu_shape(s)[3]
        mine = [Job(p, s, kernel) for p in problems if p.head_dim == D]
        if not mine:
            dims = sorted({p.head_dim for p in problems})
            raise FlashscopeError(f"--shapes {s}: head dim {D} is not among the space's "
                                  f"head dims ({', '.join(map(str, dims))})")
        jobs.extend(mine)
    return jobs


def check_request(req: SweepRequest) -> list:
    if req.search not in SEARCHES:
        raise FlashscopeError(f"--search {req.search!r}: expected one of {', '.join(SEARCHES)}")
    if not is_forward(req.space.kernel) and req.gpu:
        raise FlashscopeError(f"--gpu with --kernel {req.space.kernel}: GPU sweeps time the "
                              "forward kernels; read backward configs offline")
    if not is_forward(req.space.kernel) and req.search != "exhaustive":
        raise FlashscopeError(f"--search {req.search} with --kernel {req.space.kernel}: "
                              "evolve searches the forward's axes; use --search exhaustive")
    if req.search == "evolve" and (isinstance(req.budget, bool) or not isinstance(
            req.budget, int) or req.budget < 1):
        raise FlashscopeError(f"--budget {req.budget!r}: evolve needs a positive number of "
                              "evaluations per problem")
    if req.search == "exhaustive" and req.budget:
        raise FlashscopeError("--budget applies to --search evolve")
    for h in req.history:
        if not Path(h).is_file():
            raise FlashscopeError(f"--history {h}: no such file")
    return list_jobs(req)


class _Runner:
    def __init__(self, req: SweepRequest, store: ResultStore):
        self.req = req
        self.store = store
        self.kind = "gpu" if req.gpu else "offline"
        self.fn = req.evaluator or ev.EVALUATORS[self.kind]
        self.executor = make_executor(req.executor, jobs=req.jobs, devices=req.devices,
                                      address=req.address, gpu=req.gpu)
        self.progress = None
        self.new = 0

    def item(self, job: Job, cfg) -> dict:
        it = ev.make_item(self.kind, work_key(self.kind, job.problem, cfg, job.shape,
                                              job.kernel),
                          job.problem, cfg, job.shape, job.kernel)
        if self.req.gpu:
            it.update(device=self.req.device, odd_shapes=self.req.odd_shapes)
        return it

    def evaluate(self, items: list, search: str) -> list:
        """Run ``items`` (not yet done), append each record on arrival; records in order."""
        if self.req.gpu and self.req.precompile and self.req.evaluator is None:
            self._precompile(items)
        out = [None] * len(items)
        for i, rec in self.executor.imap(self.fn, items):
            rec["search"] = search
            rec["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            self.store.append(rec)
            self.new += 1
            out[i] = rec
            if self.progress:
                self.progress.advance()
        return out

    def _precompile(self, items: list) -> None:
        todo = [dict(it, kind="offline") for it in items]
        pool = LocalExecutor(self.req.jobs, start="spawn")  # the parent may hold CUDA
        try:
            for _ in pool.imap(_compile_for_shape, todo):
                pass
        finally:
            pool.close()

    def close(self):
        self.executor.close()


def _compile_for_shape(item: dict) -> None:
    """Compile (and read) one point for its GPU shape, into the caches."""
    try:
        B, H, N, _ = ev.parse_gpu_shape(item["shape"])
        ev._resources(item, problem_shape=(B, H, H, N, N))
    except FlashscopeError:
        pass


def _seeds(job: Job, tuned_dir) -> list:
    """The family's rule default for the job's problem, and its tuned entry first where
    the target's data file has one."""
    from ..tuned import lookup

    p = job.problem
    N = ev.parse_gpu_shape(job.shape)[2] if job.shape else 4096
    fam = family(KERNELS[job.kernel][0])
    problem = FamilyProblem(p.target, p.dtype, p.head_dim, p.causal, N, N)
    try:
        out = [fam.select(problem)]
        cfg, tuned, _ = lookup(problem, fam.KERNEL, tuned_dir)
    except FlashscopeError:
        return []
    if tuned and cfg not in out:
        out.insert(0, cfg)
    return out


def run_sweep(req: SweepRequest) -> dict:
    jobs = check_request(req)
    history = [r for h in req.history for r in read_records(h)]
    store = ResultStore(Path(req.out), resume=req.resume)
    runner = None
    t0 = time.perf_counter()
    summary = {"kind": "gpu" if req.gpu else "offline", "search": req.search,
               "out": str(req.out), "jobs": [], "skipped_done": 0}
    if req.space.kernel != "fwd":
        summary["kernel"] = req.space.kernel
    try:
        runner = _Runner(req, store)
        plan = []
        for job in jobs:
            feasible, pruned = req.space.points(job.problem)
            for _, cfg, reason in pruned:
                it = runner.item(job, cfg)
                if it["key"] not in store.done:
                    store.append({**ev.base_record(it), "status": "pruned", "reason": reason,
                                  "search": req.search})
            plan.append((job, [c for _, c in feasible], len(pruned)))
        if req.search == "exhaustive":
            items = []
            for job, cfgs, _ in plan:
                for c in cfgs:
                    it = runner.item(job, c)
                    if it["key"] in store.done:
                        summary["skipped_done"] += 1
                    else:
                        items.append(it)
            with Progress(f"{runner.kind} sweep", len(items), req.progress) as bar:
                runner.progress = bar
                runner.evaluate(items, "exhaustive")
        else:
            with Progress("evolve", req.budget * len(plan), req.progress) as bar:
                runner.progress = bar
                for job, _, _ in plan:
                    summary.setdefault("evolve", {})[job.label] = _evolve_job(
                        req, runner, store, job, history)
        for job, cfgs, n_pruned in plan:
            summary["jobs"].append(job_summary(job, store.records, runner.kind, len(cfgs),
                                              n_pruned))
    finally:
        if runner is not None:
            runner.close()
        store.close()
    summary["new_records"] = runner.new if runner else 0
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    return summary


def _evolve_job(req, runner: _Runner, store: ResultStore, job: Job, history: list) -> dict:
    p = job.problem
    axes = req.space.axes_for(p)
    batch = req.batch or max(4, getattr(runner.executor, "jobs", 0) or
                             len(getattr(runner.executor, "devices", []) or []) or 4)

    def on_pruned(cfg, reason):
        it = runner.item(job, cfg)
        if it["key"] not in store.done:
            store.append({**ev.base_record(it), "status": "pruned", "reason": reason,
                          "search": "evolve"})

    record = kernel_axes(job.kernel)[1]
    evo = Evolution(axes, p, seed=req.seed, batch=batch, on_pruned=on_pruned, record=record)
    known = [r for r in history + store.records
             if r.get("kind") == runner.kind and job.matches(r) and r.get("status") != "pruned"]
    for r in known:
        evo.know(record.from_dict(r["config"]), objective(r))
    spent = sum(1 for r in store.records if r.get("search") == "evolve"
                and r.get("kind") == runner.kind and job.matches(r)
                and r.get("status") != "pruned")
    if runner.progress:
        runner.progress.advance(min(spent, req.budget))

    def evaluate(cfgs):
        items = [runner.item(job, c) for c in cfgs]
        return runner.evaluate(items, "evolve")

    new = evo.run(evaluate, max(0, req.budget - spent), seeds=_seeds(job, req.tuned_dir))
    best = evo.best()
    return {"budget": req.budget, "evaluated": spent + len(new), "known_before": len(known),
            "trace": evo.trace, "best": None if best is None else
            {"score": list(best[0]), "config_key": best[1].key}}


def job_summary(job: Job, records: list, kind: str, n_feasible: int, n_pruned: int) -> dict:
    mine = [r for r in records if r.get("kind") == kind and job.matches(r)]
    ok = [r for r in mine if r.get("status") == "ok"]
    scored = [(objective(r), r["config_key"], r) for r in ok if objective(r) is not None]
    best = min(scored, key=lambda t: t[:2])[2] if scored else None
    fronts = ("offline",) if kind == "offline" else ("gpu_registers", "gpu_occupancy")
    out = {"job": job.label, **job.problem.as_dict(), "shape": job.shape,
           **({} if job.kernel == "fwd" else {"kernel": job.kernel}),
           "feasible": n_feasible, "pruned": n_pruned, "ok": len(ok),
           "failed": sum(1 for r in mine if r.get("status") == "failed"),
           "best": None if best is None else _brief(best),
           "fronts": {f: [_brief(r) for r in pareto_front(ok, FRONTS[f])] for f in fronts}}
    return out


def _brief(r: dict) -> dict:
    keys = ("config_key", "label", "registers", "occupancy", "limiter", "spill_stores",
            "spill_loads", "wgmma_serialized", "shared_bytes", "ms", "tflops", "search")
    return {k: r.get(k) for k in keys if r.get(k) is not None}


def compare_searches(exhaustive: list, evolved: list) -> list:
    """Per job (problem + shape): exhaustive optimum vs evolve's best, and the fraction of
    the exhaustive evaluations evolve used. Scores are GPU latency (or the offline
    objective)."""
    def jobs_of(recs):
        out = {}
        for r in recs:
            if r.get("status") in ("ok", "failed"):
                k = (r["target"], r["dtype"], r["head_dim"], r["causal"], r.get("shape"))
                out.setdefault(k, []).append(r)
        return out

    ex, evo = jobs_of(exhaustive), jobs_of(evolved)
    rows = []
    for k in sorted(ex, key=str):
        e_scored = [(objective(r), r["config_key"]) for r in ex[k] if objective(r)]
        v_recs = evo.get(k, [])
        v_scored = [(objective(r), r["config_key"]) for r in v_recs if objective(r)]
        if not e_scored:
            continue
        e_best = min(e_scored)
        row = {"target": k[0], "dtype": k[1], "head_dim": k[2], "causal": k[3],
               "shape": k[4], "exhaustive_evaluations": len(ex[k]),
               "exhaustive_best": e_best[1], "exhaustive_best_score": list(e_best[0]),
               "evolve_evaluations": len(v_recs)}
        if v_scored:
            v_best = min(v_scored)
            in_table = dict((c, sc) for sc, c in e_scored).get(v_best[1])
            row.update(evolve_best=v_best[1], evolve_best_score=list(v_best[0]),
                       found_optimum=v_best[1] == e_best[1],
                       fraction_of_evaluations=round(len(v_recs) / len(ex[k]), 3))
            if in_table is not None:
                # rank of evolve's choice in the exhaustive table (1 = the optimum)
                row["evolve_choice_rank"] = 1 + sum(1 for sc, _ in e_scored if sc < in_table)
                row["ranked"] = len(e_scored)
            if len(e_best[0]) == 1 and e_best[0][0] > 0:
                row["evolve_measured_over_optimum"] = round(v_best[0][0] / e_best[0][0], 4)
                if in_table is not None:
                    row["evolve_choice_over_optimum"] = round(in_table[0] / e_best[0][0], 4)
        rows.append(row)
    return rows


def replay_evolve(exhaustive: list, budget: int, trials: int = 20, batch: int = 4) -> list:
    """Evolve replayed against an exhaustive table (no GPU): per job, ``trials`` searches
    with seeds 0.. whose evaluations read the table's scores. The axes are the values the
    table holds. Returns per job the ratio best-found / optimum over the trials."""
    by_job = {}
    for r in exhaustive:
        if r.get("status") in ("ok", "failed", "pruned"):
            k = (r["target"], r["dtype"], r["head_dim"], r["causal"], r.get("shape"),
                 r.get("kernel", "fwd"))
            by_job.setdefault(k, []).append(r)
    rows = []
    for k, recs in sorted(by_job.items(), key=lambda kv: str(kv[0])):
        names, record, _ = kernel_axes(k[5])
        table = {record.from_dict(r["config"]): r for r in recs
                 if r["status"] != "pruned"}
        scores = [objective(r) for r in table.values() if objective(r) is not None]
        if not scores:
            continue
        opt = min(scores)
        axes = {a: tuple(sorted({getattr(c, a) for c in table},
                                key=lambda v: (v is not None, v or 0))) for a in names}
        problem = Problem(k[0], k[1], k[2], k[3])
        seed_cfg = family(KERNELS[k[5]][0]).select(FamilyProblem(k[0], k[1], k[2], k[3]))
        ratios, hits = [], 0
        for seed in range(trials):
            evo = Evolution(axes, problem, seed=seed, batch=batch, record=record)

            def look(cfgs):
                return [table.get(c, {"status": "failed"}) for c in cfgs]

            evo.run(look, budget, seeds=[seed_cfg])
            best = evo.best()
            if best is not None and len(opt) == 1:
                ratios.append(best[0][0] / opt[0])
            hits += best is not None and best[0] == opt
        row = {"target": k[0], "dtype": k[1], "head_dim": k[2], "causal": k[3],
               "shape": k[4], "budget": budget, "table": len(table), "trials": trials,
               "found_optimum": hits}
        if ratios:
            row.update(ratio_mean=round(sum(ratios) / len(ratios), 4),
                       ratio_worst=round(max(ratios), 4))
        rows.append(row)
    return rows
