"""Guided search: an evolutionary search over a space's axes, for one problem.

Start: the history (configs measured by earlier sweeps of the same problem and kind: known
scores, free; the best of them are the first parents) and the seeds (the tuned config and
the family's default for the problem), moved onto the space (each knob to
its nearest axis value) and evaluated first when not known yet. Then, until ``budget``
new evaluations are spent, generations of ``batch`` children:

- parents: the ``population`` best configs scored so far; a child's parent is the better of
  two drawn at random (tournament of 2);
- crossover (probability 0.3): each axis from the parent or from a second parent;
- mutation: one axis (two with probability 0.3) among those with several values moves to a
  neighbouring value in the axis' sorted list (probability 0.7) or to any value;
- children already scored, already in the batch, or infeasible (pruned by
  :func:`flashscope.sweep.space.infeasible`, reported, never counted in the budget) are
  drawn again; after 200 draws without a new child, a random unscored point of the space
  is taken instead; the search stops early when every feasible point is scored.

Selection is by :func:`objective` (lower is better): GPU latency; offline, configs without
spills/stack first, then higher occupancy, then fewer registers. A failed evaluation scores
None and never becomes a parent. The random generator is seeded, so a search is
reproducible given the same scores.
"""

from __future__ import annotations

import itertools
import random
from typing import Callable, Optional

from ..families.triton_fwd import TritonFwdConfig
from .space import Problem, infeasible


def objective(rec: dict) -> Optional[tuple]:
    """Score of a record, lower is better; None when it failed or lacks the measurement."""
    if rec.get("status") != "ok":
        return None
    if rec.get("kind") == "gpu":
        ms = rec.get("ms")
        return (float(ms),) if isinstance(ms, (int, float)) and ms == ms else None
    occ, regs = rec.get("occupancy"), rec.get("registers")
    if occ is None or regs is None:
        return None
    spills = (rec.get("spill_stores") or 0) + (rec.get("spill_loads") or 0) + \
        (rec.get("vgpr_spills") or 0) + (1 if rec.get("local_bytes") else 0)
    # a binary whose wgmma ptxas serialized runs each product's k-steps one at a time
    # (the backward with a serialized dK/dV read 0.84x the pipelined one, causal D = 128
    # on an H100): ranked with the spilling ones, after every binary that does neither
    serial = rec.get("wgmma_serialized") or 0
    return (int(spills > 0) + int(serial > 0), -float(occ), int(regs))


def _snap(value, values: tuple):
    """``value`` if it is on the axis, else the nearest axis value (None only to None)."""
    if value in values:
        return value
    nums = [v for v in values if v is not None and not isinstance(v, bool)]
    if value is None or isinstance(value, bool) or not nums:
        return values[0]
    return min(nums, key=lambda v: abs(v - value))


class Evolution:
    """State of one search (see the module docstring)."""

    def __init__(self, axes: dict, problem: Problem, *, seed: int = 0,
                 population: int = 8, batch: int = 4,
                 on_pruned: Optional[Callable] = None, record: type = TritonFwdConfig):
        self.record = record  # the config record of the kernel's family
        self.names = tuple(k for k in record.field_names() if k in axes)
        self.axes = {k: tuple(axes[k]) for k in self.names}
        self.problem = problem
        self.rng = random.Random(seed)
        self.population = population
        self.batch = max(1, batch)
        self.on_pruned = on_pruned or (lambda cfg, reason: None)
        self.scores = {}  # config -> score tuple or None
        self.pruned = set()
        self.trace = []  # best score after each new evaluation

    def know(self, cfg, score) -> None:
        self.scores[cfg] = score

    def best(self) -> Optional[tuple]:
        scored = [(s, c.key, c) for c, s in self.scores.items() if s is not None]
        return min(scored)[::2] if scored else None  # (score, cfg)

    def _feasible(self, cfg) -> bool:
        if cfg in self.pruned:
            return False
        reason = infeasible(cfg, self.problem)
        if reason is not None:
            self.pruned.add(cfg)
            self.on_pruned(cfg, reason)
            return False
        return True

    def _parents(self) -> list:
        scored = sorted(((s, c.key, c) for c, s in self.scores.items() if s is not None))
        return [c for _, _, c in scored[:self.population]]

    def _child(self, parents: list):
        rng = self.rng
        pick = lambda: min(rng.sample(parents, min(2, len(parents))),  # noqa: E731
                           key=parents.index)
        genes = {k: _snap(getattr(pick(), k), self.axes[k]) for k in self.names}
        if len(parents) > 1 and rng.random() < 0.3:
            other = pick()
            for k in self.names:
                if rng.random() < 0.5:
                    genes[k] = _snap(getattr(other, k), self.axes[k])
        movable = [k for k in self.names if len(self.axes[k]) > 1]
        if movable:
            n = 2 if len(movable) > 1 and rng.random() < 0.3 else 1
            for k in rng.sample(movable, n):
                vals = self.axes[k]
                i = vals.index(genes[k])
                if rng.random() < 0.7:
                    step = rng.choice([s for s in (-1, 1) if 0 <= i + s < len(vals)])
                    genes[k] = vals[i + step]
                else:
                    genes[k] = rng.choice([v for v in vals if v != genes[k]])
        return self.record(**genes)

    def _random_unscored(self, taken: set):
        rest = [self.record(**dict(zip(self.names, vals)))
                for vals in itertools.product(*(self.axes[k] for k in self.names))]
        rest = [c for c in rest if c not in self.scores and c not in taken
                and c not in self.pruned]
        self.rng.shuffle(rest)
        return next((c for c in rest if self._feasible(c)), None)

    def propose(self, n: int) -> list:
        """Up to ``n`` new feasible configs (fewer only when the space is exhausted)."""
        out = []
        parents = self._parents()
        while len(out) < n:
            child = None
            for _ in range(200 if parents else 0):
                c = self._child(parents)
                if c not in self.scores and c not in out and self._feasible(c):
                    child = c
                    break
            if child is None:
                child = self._random_unscored(set(out))
            if child is None:
                break
            out.append(child)
        return out

    def run(self, evaluate: Callable, budget: int, seeds=()) -> list:
        """Spend up to ``budget`` evaluations; ``evaluate(configs) -> records`` (same
        order). Returns the records evaluated here."""
        done = []

        def spend(cfgs):
            recs = evaluate(cfgs)
            for c, r in zip(cfgs, recs):
                self.scores[c] = objective(r)
                b = self.best()
                self.trace.append(None if b is None else list(b[0]))
            done.extend(recs)

        fresh = []
        for s in seeds:
            s = self.record(**{k: _snap(getattr(s, k), self.axes[k]) for k in self.names})
            if s not in self.scores and s not in fresh and self._feasible(s):
                fresh.append(s)
        fresh = fresh[:budget]
        for i in range(0, len(fresh), self.batch):
            spend(fresh[i:i + self.batch])
        while len(done) < budget:
            cfgs = self.propose(min(self.batch, budget - len(done)))
            if not cfgs:
                break
            spend(cfgs)
        return done
