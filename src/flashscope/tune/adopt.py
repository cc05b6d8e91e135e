"""Adoption: the rule of :mod:`.rule` applied to a folder of A/B results, and the winners
written into the tuned files through their one writer.

For each cell's result (``<cell>.json``, :mod:`.results`) whose first variant is the
default (``+``):

1. the default must still be the config the A/B timed as its base (the cell's tuned entry
   or rule, read now); if the tuned file has changed since, the cell is skipped: its
   ratios are to a config that no longer runs;
2. with ``confirm`` folders, the same cell must be in each, timed against the same base;
3. the rule picks the winner among the configs of the base's kernel (per reading, or
   pooled);
4. the winner becomes the entry for the cell's kernel, dtype, head dim, mask and key-length
   class (:func:`flashscope.tuned.make_entry`, the config exactly as timed), with a
   ``source`` that states the measurement: the spec, ratio and IQR against the entry it
   replaces, rounds, launches, flush, confirmations or the pooled test, device and date.

All cells are decided before anything is written; then each target's entries go to
:func:`flashscope.tuned.write_entries` (merged by key, checked, atomic). Two cells that
would decide the same entry are refused. ``dry_run`` decides and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import FlashscopeError
from ..tuned import entry_key, lookup, make_entry, seq_class, write_entries
from .cells import mask_suffix, problem
from .results import ABResult, read_result, result_paths
from .rule import Decision, per_reading, pooled


@dataclass(frozen=True)
class Rule:
    """The adoption rule's parameters (:mod:`.rule`); ``alpha`` set: the pooled rule."""

    max_ratio: float = 0.995
    q3_below: float = 1.0
    alpha: Optional[float] = None
    confirm: tuple = ()

    def __post_init__(self):
        if not 0 < self.max_ratio < 1:
            raise FlashscopeError(f"--max-ratio {self.max_ratio}: expected a ratio in (0, 1)")
        if self.q3_below < 1:
            raise FlashscopeError(f"--q3-below {self.q3_below}: expected 1 or more")
        if self.q3_below > 1 and len(self.confirm) < 2:
            raise FlashscopeError("--q3-below above 1 needs at least two --confirm runs")
        if self.alpha is not None:
            if not self.confirm or self.q3_below != 1:
                raise FlashscopeError("--pooled needs --confirm runs and replaces --q3-below")
            if not 0 < self.alpha < 1:
                raise FlashscopeError(f"--alpha {self.alpha}: expected a level in (0, 1)")


@dataclass
class Verdict:
    """What became of one cell: ``adopted`` (with the entry), ``kept`` or ``skipped``."""

    cell: str
    action: str
    line: str
    target: Optional[str] = None
    entry: Optional[dict] = None
    replaced: Optional[str] = None  # the replaced config as a spec, to time it again
    stats: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, {})}


def adopt(ab_dir, rule: Rule = Rule(), *, data_dir=None, dry_run: bool = False) -> list:
    """The verdict of every cell in ``ab_dir`` (module docstring); writes the adopted
    entries unless ``dry_run``."""
    paths = result_paths(ab_dir)
    if not paths:
        raise FlashscopeError(f"{ab_dir}: no A/B results (<cell>.json) in it")
    for d in rule.confirm:
        result_paths(d)
    verdicts = [_decide(read_result(p), rule, data_dir) for p in paths]
    chosen = {}
    for v in verdicts:
        if v.entry is None:
            continue
        e = v.entry
        key = (v.target, entry_key(e["kernel"], e["dtype"], e["head_dim"], e["causal"],
                                   e["seq_class"]))
        if key in chosen:
            raise FlashscopeError(f"cells {chosen[key].cell} and {v.cell} both decide the "
                                  f"tuned entry {key[1]} of {v.target}: adopt one of them")
        chosen[key] = v
    if not dry_run:
        for target in sorted({t for t, _ in chosen}):
            write_entries(target, [v.entry for (t, _), v in chosen.items() if t == target],
                          data_dir)
    return verdicts


def _decide(res: ABResult, rule: Rule, data_dir) -> Verdict:
    cell = res.cell.name
    base = res.base
    if res.target is None:
        return Verdict(cell, "skipped", f"{cell}: skipped (timed on Triton's interpreter, "
                                        "not on a GPU)")
    if mask_suffix(res.cell.case):
        return Verdict(cell, "skipped", f"{cell}: skipped (a window, bottom-right alignment or "
                                        "cap: the tuned entries are for problems without)")
    if base.spec != "+" or base.config is None:
        return Verdict(cell, "skipped", f"{cell}: skipped (its first variant, "
                                        f"{base.name}={base.spec}, is not the default +)")
    prob = problem(res.cell, res.target)
    now = lookup(prob, base.config.KERNEL, data_dir)[0]
    if now != base.config:
        return Verdict(cell, "skipped", f"{cell}: skipped (the default is now {now.label}; "
                                        f"the A/B timed {base.config.label}: time it again)")
    others = []
    for d in rule.confirm:
        path = Path(d) / f"{cell}.json"
        if not path.exists():
            return Verdict(cell, "kept", f"{cell}: kept the default (not in every --confirm "
                                         "run)")
        other = read_result(path)
        if other.base.config != base.config or other.cell.case != res.cell.case:
            return Verdict(cell, "kept", f"{cell}: kept the default ({path} timed another "
                                         "base or shape)")
        others.append(other)
    readings = [r.reading() for r in (res, *others)]
    if rule.alpha is not None:
        won = pooled(readings, rule.max_ratio, rule.alpha)
        why = (f"no variant at a pooled median <= {rule.max_ratio} faster in more rounds "
               f"than chance, p <= {rule.alpha:g}, over {len(readings)} A/B runs")
    else:
        won = per_reading(readings, rule.max_ratio, rule.q3_below)
        also = f" here and in the {len(others)} --confirm run(s)" if others else ""
        why = f"no variant <= {rule.max_ratio} with Q3 < {rule.q3_below:g}{also}"
    if won is None:
        return Verdict(cell, "kept", f"{cell}: kept the default ({why})")
    return _adopted(res, won, base.config, others)


def _adopted(res: ABResult, won: Decision, old, others: list) -> Verdict:
    cell, case, meta = res.cell.name, res.cell.case, res.meta
    v = res.variant(won.identity)
    row = res.rows[v.name]
    s = won.stat
    if won.p is not None:
        how = (f", pooled over {s.rounds} rounds of {won.readings} A/B runs, faster in "
               f"{s.wins} (sign test p = {won.p:.2g})")
    else:
        how = f", confirmed by {len(others)} more A/B run(s)" if others else ""
    source = (f"flashscope tune A/B: {v.spec} at {s.ratio:.3f} (IQR {s.q1:.3f}-{s.q3:.3f}) "
              f"of the time of the entry before it ({old.label}), {meta['rounds']} "
              f"interleaved rounds of {meta['reps']} launches, "
              f"{'L2 flushed before each' if meta['flush'] else 'no L2 flush'}{how}, "
              f"{meta['device']}, {meta['date'][:10]}")
    entry = make_entry(v.config, case.dtype, case.D, case.causal, seq_class(case.Nk),
                       ms=row["ms"], tflops=row["tflops"], shape=case.shape, search="ab",
                       source=source)
    line = (f"{cell}: {old.label} -> {v.config.label} ({v.name} {v.spec}: {s.ratio:.3f}, "
            f"IQR {s.q1:.3f}-{s.q3:.3f})")
    return Verdict(cell, "adopted", line, res.target, entry, f"{old.KERNEL}:{old.text}",
                   {"ratio": s.ratio, "ratio_q1": s.q1, "ratio_q3": s.q3, "rounds": s.rounds,
                    "wins": s.wins, **({"p": won.p} if won.p is not None else {})})
