"""Spearman's rank correlation, and which counters predict speed.

rho = Pearson correlation of the ranks of x and y, ties given their average rank (so a
gate's pass/fail column is a valid input). With n pairs and no ties this equals
1 - 6 * sum(d_i^2) / (n (n^2 - 1)). rho is undefined (None) for n < 3 or when either
column is constant. No p-values: with the few configs a sweep profiles, n is reported so
the reader can judge.
"""

from __future__ import annotations

import math


def average_ranks(values) -> list:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x, y):
    """(rho, n) over the pairs where both values are present and finite."""
    pairs = [(float(a), float(b)) for a, b in zip(x, y)
             if a is not None and b is not None and math.isfinite(float(a))
             and math.isfinite(float(b))]
    n = len(pairs)
    if n < 3:
        return None, n
    rx = average_ranks([p[0] for p in pairs])
    ry = average_ranks([p[1] for p in pairs])
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None, n
    return sxy / math.sqrt(sxx * syy), n


def predictive_power(rows, speed_key: str, metrics, gates=()) -> list:
    """For each metric (and each gate, as 1 = pass / 0 = fail): Spearman's rho between it
    and ``row[speed_key]`` (higher = faster, e.g. TFLOP/s) over ``rows``.

    Returns ``[{"predictor", "rho", "n"}]``; rho > 0 means "more of it, faster"."""
    speed = [r.get(speed_key) for r in rows]
    out = []
    for m in metrics:
        rho, n = spearman([r.get(m) for r in rows], speed)
        out.append({"predictor": m, "rho": rho, "n": n})
    for g in gates:
        passed = [None if g.check(r.get(g.metric)) is None else float(g.check(r.get(g.metric)))
                  for r in rows]
        rho, n = spearman(passed, speed)
        out.append({"predictor": f"gate {g}", "rho": rho, "n": n})
    return out
