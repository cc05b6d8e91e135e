"""The adoption rule: when an A/B says a variant is faster than the default, by how much, and
how sure.

Every number here is a ratio taken inside one round of one A/B run: the variant's time
over the default's in the same round, so both saw the same clock (and, with several GPUs,
the same GPU: an A/B never spreads its variants over devices). Ratios of different runs
may then be pooled, times never.

Per reading (one A/B run): the median ratio over its rounds, and the first and third
quartiles (the values at ranks n/4 and 3n/4 of the sorted ratios). The rule
(:func:`per_reading`): the median is at most ``max_ratio`` (0.995) and the third quartile
is below ``q3_below`` (1: the variant won at least three rounds of four), in the main
reading and in every confirmation reading. One 12-round reading of a noisy cell passes by
chance: D = 64 non-causal 16k with BALANCE read 0.958 once, between readings of 1.018 and
1.022; a second A/B of 30 rounds is the confirmation. ``q3_below`` above 1 (with two or
more confirmations) is for a cell whose rounds spread wider than the effect: D = 64 causal
16k with PINGPONG read medians 0.982-0.993 in six A/Bs, third quartiles 1.006-1.016.

Pooled (:func:`pooled`): the rounds of every reading in one list; the variant is adopted
when their median is at most ``max_ratio``, it was faster in more rounds than chance
allows (one-sided sign test, p <= ``alpha``, 0.01), and no reading's own median is above
1. The wide cell above passes it (112 rounds, median 0.990, faster in 72, p = 0.002), the
chance reading does not (42 rounds, 1.012).

Variants are matched across readings by what they run (kernel and config), not by name
or spec, and only configs of the default's kernel other than the default are candidates:
peers (cuDNN, FlashAttention-4) and the default itself never are.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Stat:
    """Ratios to the base over rounds: median, quartiles, rounds, rounds won (ratio < 1)."""

    ratio: float
    q1: float
    q3: float
    rounds: int
    wins: int


def stat(ratios: list) -> Stat:
    """:class:`Stat` of a list of per-round ratios (module docstring)."""
    s = sorted(ratios)
    n = len(s)
    return Stat(statistics.median(s), s[n // 4], s[(3 * n) // 4], n, sum(r < 1 for r in s))


def round_ratios(times: dict, name: str, base: str) -> list:
    """Each round's time of ``name`` over ``base``'s in the same round."""
    return [t / b for t, b in zip(times[name], times[base])]


@dataclass(frozen=True)
class Reading:
    """One A/B run of a cell as the rule sees it: the base's name, each candidate's
    identity by name, and every variant's times per round."""

    base: str
    ids: dict
    times: dict

    def name(self, identity: str) -> Optional[str]:
        """The variant that runs this identity (the one with the lowest median ratio, if
        several names run it); None if this reading has none."""
        names = [n for n, i in self.ids.items() if i == identity]
        if not names:
            return None
        return min(names, key=lambda n: statistics.median(round_ratios(self.times, n,
                                                                       self.base)))

    def ratios(self, identity: str) -> Optional[list]:
        """The per-round ratios of :meth:`name`'s variant; None if there is none."""
        name = self.name(identity)
        return None if name is None else round_ratios(self.times, name, self.base)


@dataclass(frozen=True)
class Decision:
    """The adopted variant: its identity, its name in the main reading, the statistics
    it won by (the main reading's, or the pooled rounds'), the sign test's p (pooled)."""

    identity: str
    name: str
    stat: Stat
    readings: int
    p: Optional[float] = None


def passes(s: Stat, max_ratio: float, q3_below: float = 1.0) -> bool:
    """The rule for one reading: median at most ``max_ratio``, third quartile below
    ``q3_below``."""
    return s.ratio <= max_ratio and s.q3 < q3_below


def _candidates(readings: list) -> list:
    return list(dict.fromkeys(readings[0].ids.values()))


def per_reading(readings: list, max_ratio: float, q3_below: float = 1.0) -> Optional[Decision]:
    """The candidate that passes :func:`passes` in every reading with the lowest median in
    the first, or None."""
    best = None
    for ident in _candidates(readings):
        per = [r.ratios(ident) for r in readings]
        if any(rs is None for rs in per):
            continue
        stats = [stat(rs) for rs in per]
        if all(passes(s, max_ratio, q3_below) for s in stats) and (
                best is None or stats[0].ratio < best.stat.ratio):
            best = Decision(ident, readings[0].name(ident), stats[0], len(readings))
    return best


def sign_test(wins: int, n: int) -> float:
    """One-sided sign test: the chance of ``wins`` or more rounds of ``n`` going to the
    variant if each were a coin toss."""
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def pooled(readings: list, max_ratio: float, alpha: float = 0.01) -> Optional[Decision]:
    """The candidate the pooled rule adopts (module docstring) with the lowest pooled
    median, or None; it must be in every reading."""
    best = None
    for ident in _candidates(readings):
        per = [r.ratios(ident) for r in readings]
        if any(not rs for rs in per):
            continue
        s = stat([x for rs in per for x in rs])
        p = sign_test(s.wins, s.rounds)
        if (s.ratio <= max_ratio and p <= alpha
                and all(statistics.median(rs) <= 1 for rs in per)
                and (best is None or s.ratio < best.stat.ratio)):
            best = Decision(ident, readings[0].name(ident), s, len(readings), p)
    return best
