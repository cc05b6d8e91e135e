"""Adopt the A/B winners of :mod:`ab_cells` into the sm90 tuned data file, by a fixed rule.

For each cell's ``<cell>.json`` (rows of :func:`ab.report`): among the flashscope
variants other than the default ``d`` (``+K=V,...`` specs on top of the default, or full
configs; not ``@`` kernel-constant overrides, not cuDNN or FA4), the one with the lowest
median time ratio to ``d`` is adopted when that median is at most ``--max-ratio`` (0.995)
and its third quartile is below 1 (it beat the default in at least three rounds of four).
Its entry replaces the one the default came from (same dtype, head dim, mask and
key-length class), with the measurement as its ``source``. Prints one line per cell.

``--confirm DIR`` (repeatable): other A/B runs of the same cells. A variant is then
adopted only if the rule holds for it in every one of them too (the same spec, under
any name), and the best of those is the one with the lowest median in AB_DIR. One
12-round reading of a noisy cell passes the rule by chance: D = 64 non-causal 16k +
BALANCE read 0.958 once between readings of 1.018 and 1.022 (runs 132, 139, 140 of the
performance record); a second A/B of 30 rounds is the confirmation.
``--q3-below B`` (> 1, with two or more ``--confirm`` runs) relaxes the quartile for a
cell whose rounds spread wider than the effect: D = 64 causal 16k + PINGPONG, OVERLAP=2
read medians 0.982-0.993 in six A/Bs with third quartiles 1.006-1.016 (runs 168-173).

``--pooled`` (with ``--confirm`` runs) replaces both per-reading bounds by one rule on the
rounds of every reading pooled (:func:`pooled_winner`): each round's time of the variant
over ``d``'s in the same round; the variant is adopted when the pooled median is at most
``--max-ratio``, it was faster in more rounds than chance allows (one-sided sign test,
p <= ``--alpha``, 0.01), and no reading's median is above 1. The cell that needed
``--q3-below`` passes it (runs 170-173: 112 rounds, 0.990, faster in 72, p = 0.002), the
12-round chance reading does not (runs 139-140: 42 rounds, 1.012).

Usage: python scripts/gpu/adopt_ab.py AB_DIR [--confirm DIR ..] [--tuned PATH]
       [--max-ratio 0.995] [--q3-below 1 | --pooled [--alpha 0.01]] [--run "run 90"]
       [--dry-run] [--recheck FILE]

``--recheck FILE`` writes each replaced entry as ``CELL:old=CONFIG`` items for
``ab_cells.py --extra``, so a second run can time every change against what it replaced
(with the new file in place, ``d`` is the new entry).
"""

import argparse
import glob
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "src"), HERE]

from ab_cells import variant_specs  # noqa: E402
from flashscope.api import config_text  # noqa: E402
from flashscope.config import AttentionConfig, check_config  # noqa: E402
from flashscope.tuned import lookup, seq_class, tuned_path  # noqa: E402


def passes(row: dict, max_ratio: float, q3_below: float = 1.0) -> bool:
    """The rule for one reading: median ratio to ``d`` at most max_ratio, third quartile
    below ``q3_below`` (1: the variant won at least three rounds of four)."""
    return row["ratio"] <= max_ratio and row["ratio_q3"] < q3_below


def _candidate(name: str, spec: "str | None") -> bool:
    """Whether a variant may be adopted: not the default ``d``, not a peer (cuDNN, FA4,
    by name or by spec)."""
    return name not in ("d", "n", "fa4", "cudnn") and spec not in ("cudnn", "fa4")


def winner(rows: list, max_ratio: float, specs: "dict | None" = None,
           confirms: "list | None" = None, q3_below: float = 1.0):
    """The adopted row of one cell, or None (module docstring). Peers (``cudnn``, ``fa4``,
    under any name given in ``specs``) and the default are never adopted. ``confirms``:
    (rows, specs) of the cell in other A/B runs, each of which must pass the variant
    (found by its spec) as well."""
    best = None
    specs = specs or {}
    for r in rows:
        if not _candidate(r["name"], specs.get(r["name"])):
            continue
        if not passes(r, max_ratio, q3_below):
            continue
        spec = specs.get(r["name"])
        if not all(any(passes(o, max_ratio, q3_below) for o in other_rows
                       if other_specs.get(o["name"]) == spec and o["name"] != "d")
                   for other_rows, other_specs in confirms or []):
            continue
        if best is None or r["ratio"] < best["ratio"]:
            best = r
    return best


def sign_test(wins: int, n: int) -> float:
    """One-sided sign test: the chance of ``wins`` or more rounds of ``n`` going to the
    variant if each were a coin toss."""
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def pooled_winner(readings: list, max_ratio: float, alpha: float = 0.01):
    """The adopted variant of one cell by the pooled rule (module docstring), or None.

    ``readings``: (specs, times) of each A/B reading of the cell, the main one first;
    ``times[name][i]`` is that provider's time in round i (rounds interleave the
    providers, so round i of two providers ran side by side). A variant is found in the
    other readings by its spec and must be in all of them; peers and ``d`` never win.
    Returns {name, spec, ratio, ratio_q1, ratio_q3, wins, rounds, p} (the ratios pooled,
    named as in a reading's rows), the lowest pooled median of those that pass."""
    best = None
    specs0 = readings[0][0]
    for name, spec in specs0.items():
        if not _candidate(name, spec):
            continue
        per = []
        for specs, times in readings:
            other = next((n for n, s in specs.items() if s == spec and n != "d"), None)
            if other is None or not times:
                break
            per.append([t / d for t, d in zip(times[other], times["d"])])
        else:
            pooled = [r for rs in per for r in rs]
            wins = sum(r < 1 for r in pooled)
            q1, med, q3 = statistics.quantiles(pooled, n=4)
            p = sign_test(wins, len(pooled))
            if (med <= max_ratio and p <= alpha
                    and all(statistics.median(rs) <= 1 for rs in per)
                    and (best is None or med < best["ratio"])):
                best = {"name": name, "spec": spec, "ratio": med, "ratio_q1": q1,
                        "ratio_q3": q3, "wins": wins, "rounds": len(pooled), "p": p}
    return best


def _cell_results(dirs: list, cell: str) -> "list | None":
    """The A/B result of ``cell`` in each of ``dirs``, or None if one of them has no A/B
    of it (then nothing of the cell is confirmed)."""
    out = []
    for d in dirs:
        path = os.path.join(d, cell + ".json")
        if not os.path.exists(path):
            return None
        out.append(json.load(open(path)))
    return out


def resolve(spec: str, base: AttentionConfig) -> AttentionConfig:
    """The config a ``+K=V,..`` spec (on ``base``, the default) or a ``K=V,..`` spec names."""
    if any(p.strip().lstrip("+").startswith("@") for p in spec.split(",")):
        raise ValueError(f"{spec!r}: kernel-constant overrides are not configs")
    if spec.startswith("+"):
        return AttentionConfig.parse(spec[1:], base=base)
    return AttentionConfig.parse(spec)


def adopt(ab_dir: str, tuned_file: str, max_ratio: float, run: str, dry: bool,
          replaced: "dict | None" = None, confirm: "list | None" = None,
          q3_below: float = 1.0, pooled_alpha: "float | None" = None) -> list:
    """Apply the rule to every cell in ``ab_dir`` (and, with ``confirm``, in each of those
    runs too); returns the printed lines. ``replaced`` (a dict) receives {cell: the
    replaced entry's config as K=V text}. ``pooled_alpha``: the pooled rule at that
    level instead of the per-reading bounds (:func:`pooled_winner`)."""
    data = json.load(open(tuned_file))
    lines = []
    for path in sorted(glob.glob(os.path.join(ab_dir, "*.json"))):
        res = json.load(open(path))
        meta, rows = res["meta"], res["rows"]
        B, H, N, D = map(int, meta["shape"].split(","))
        causal = bool(meta["causal"])
        cell = os.path.basename(path)[:-5]
        specs = variant_specs(meta["variants"])
        others = _cell_results(confirm or [], cell)
        if others is None:
            lines.append(f"{cell}: kept the default (not in every --confirm run)")
            continue
        if pooled_alpha is not None:
            best = pooled_winner([(specs, res.get("times"))]
                                 + [(variant_specs(o["meta"]["variants"]), o.get("times"))
                                    for o in others], max_ratio, pooled_alpha)
            if best is None:
                lines.append(f"{cell}: kept the default (no variant at a pooled median <= "
                             f"{max_ratio} faster in more rounds than chance, p <= "
                             f"{pooled_alpha:g}, over {len(others) + 1} A/B runs)")
                continue
            row = next(r for r in rows if r["name"] == best["name"])
            best.update(ms=row["ms"], tflops=row["tflops"])  # this reading's time
            how = (f"pooled over {best['rounds']} rounds of {len(others) + 1} A/B runs, "
                   f"faster in {best['wins']} (sign test p = {best['p']:.2g})")
        else:
            runs = [(o["rows"], variant_specs(o["meta"]["variants"])) for o in others]
            best = winner(rows, max_ratio, specs, runs, q3_below)
            if best is None:
                also = f" here and in the {len(confirm)} --confirm run(s)" if confirm else ""
                lines.append(f"{cell}: kept the default (no variant <= {max_ratio} with Q3 "
                             f"< {q3_below:g}{also})")
                continue
            how = f"confirmed by {len(confirm)} more A/B run(s)" if confirm else ""
        spec = specs[best["name"]]
        cls = seq_class(N)
        key = ("bfloat16", D, causal, cls)
        entry = next((e for e in data["entries"]
                      if (e["dtype"], e["head_dim"], e["causal"], e["seq_class"]) == key), None)
        if entry is None:
            entry = {"dtype": "bfloat16", "head_dim": D, "causal": causal, "seq_class": cls}
            data["entries"].append(entry)
            base = lookup("sm90", "bfloat16", D, causal, N)[0]
        else:
            base = AttentionConfig.from_dict(entry["config"])
        cfg = check_config(resolve(spec, base), "sm90", D)
        old = base.key
        if replaced is not None:
            replaced[cell] = config_text(base)
        entry.update({
            "config": cfg.as_dict(), "ms": best["ms"], "tflops": best["tflops"],
            "shape": meta["shape"], "search": "ab",
            "source": (f"scripts/gpu/ab_cells.py {run} ({meta['rounds']} interleaved rounds "
                       f"of {meta['reps']} launches, "
                       f"{'L2 flushed before each' if meta.get('flush') else 'no L2 flush'}"
                       f"): {spec} at "
                       f"{best['ratio']:.3f} (IQR {best['ratio_q1']:.3f}-"
                       f"{best['ratio_q3']:.3f}) of the time of {old}"
                       + (f", {how}" if how else "")
                       + f", {meta['device']}, {meta['date'][:10]}")})
        lines.append(f"{cell}: {old} -> {cfg.key} ({best['name']} {spec}: "
                     f"{best['ratio']:.3f}, IQR {best['ratio_q1']:.3f}-{best['ratio_q3']:.3f})")
    if not dry:
        text = json.dumps(data, indent=1) + "\n"
        tmp = tuned_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, tuned_file)
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ab_dir")
    ap.add_argument("--tuned", default=str(tuned_path("sm90")))
    ap.add_argument("--max-ratio", type=float, default=0.995)
    ap.add_argument("--q3-below", type=float, default=1.0,
                    help="bound on each reading's third quartile (default 1); above 1 only "
                         "with --confirm runs, for a cell whose rounds spread wider than "
                         "the effect")
    ap.add_argument("--pooled", action="store_true",
                    help="the rule on every reading's rounds pooled (a sign test) instead "
                         "of bounds per reading; needs --confirm runs")
    ap.add_argument("--alpha", type=float, default=0.01,
                    help="--pooled: the sign test's level (default 0.01)")
    ap.add_argument("--run", default="")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--confirm", action="append", default=[], metavar="DIR",
                    help="another A/B run of the same cells that must pass the variant too "
                         "(repeatable)")
    ap.add_argument("--recheck", default=None, metavar="FILE",
                    help="write CELL:old=CONFIG;... for ab_cells.py --extra: each replaced "
                         "entry, to time against its successor again")
    a = ap.parse_args()
    replaced = {}
    if a.q3_below > 1.0 and len(a.confirm) < 2:
        ap.error("--q3-below above 1 needs at least two --confirm runs")
    if a.pooled and (not a.confirm or a.q3_below != 1.0):
        ap.error("--pooled needs --confirm runs and replaces --q3-below")
    if not 0 < a.alpha < 1:
        ap.error(f"--alpha {a.alpha}: expected a level between 0 and 1")
    for line in adopt(a.ab_dir, a.tuned, a.max_ratio, a.run, a.dry_run, replaced,
                      a.confirm, a.q3_below, a.alpha if a.pooled else None):
        print(line)
    if a.recheck:
        with open(a.recheck, "w") as f:
            f.write(";".join(f"{c}:old={t}" for c, t in replaced.items()))


if __name__ == "__main__":
    main()
