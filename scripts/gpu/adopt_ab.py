"""Adopt the A/B winners of :mod:`ab_cells` into the sm90 tuned data file, by a fixed rule.

For each cell's ``<cell>.json`` (rows of :func:`ab.report`): among the flashscope
variants other than the default ``d`` (``+K=V,...`` specs on top of the default, or full
configs; not ``@`` kernel-constant overrides, not cuDNN or FA4), the one with the lowest
median time ratio to ``d`` is adopted when that median is at most ``--max-ratio`` (0.995)
and its third quartile is below 1 (it beat the default in at least three rounds of four).
Its entry replaces the one the default came from (same dtype, head dim, mask and
key-length class), with the measurement as its ``source``. Prints one line per cell.

Usage: python scripts/gpu/adopt_ab.py AB_DIR [--tuned PATH] [--max-ratio 0.995]
       [--run "run 90"] [--dry-run] [--recheck FILE]

``--recheck FILE`` writes each replaced entry as ``CELL:old=CONFIG`` items for
``ab_cells.py --extra``, so a second run can time every change against what it replaced
(with the new file in place, ``d`` is the new entry).
"""

import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "src"), HERE]

from ab_cells import variant_specs  # noqa: E402
from flashscope.api import config_text  # noqa: E402
from flashscope.config import AttentionConfig, check_config  # noqa: E402
from flashscope.tuned import lookup, seq_class, tuned_path  # noqa: E402


def winner(rows: list, max_ratio: float, specs: "dict | None" = None):
    """The adopted row of one cell, or None (module docstring). Peers (``cudnn``, ``fa4``,
    under any name given in ``specs``) and the default are never adopted."""
    best = None
    specs = specs or {}
    for r in rows:
        if r["name"] in ("d", "n", "fa4", "cudnn") or specs.get(r["name"]) in ("cudnn", "fa4"):
            continue
        if r["ratio"] <= max_ratio and r["ratio_q3"] < 1.0:
            if best is None or r["ratio"] < best["ratio"]:
                best = r
    return best


def resolve(spec: str, base: AttentionConfig) -> AttentionConfig:
    """The config a ``+K=V,..`` spec (on ``base``, the default) or a ``K=V,..`` spec names."""
    if any(p.strip().lstrip("+").startswith("@") for p in spec.split(",")):
        raise ValueError(f"{spec!r}: kernel-constant overrides are not configs")
    if spec.startswith("+"):
        return AttentionConfig.parse(spec[1:], base=base)
    return AttentionConfig.parse(spec)


def adopt(ab_dir: str, tuned_file: str, max_ratio: float, run: str, dry: bool,
          replaced: "dict | None" = None) -> list:
    """Apply the rule to every cell in ``ab_dir``; returns the printed lines. ``replaced``
    (a dict) receives {cell: the replaced entry's config as K=V text}."""
    data = json.load(open(tuned_file))
    lines = []
    for path in sorted(glob.glob(os.path.join(ab_dir, "*.json"))):
        res = json.load(open(path))
        meta, rows = res["meta"], res["rows"]
        B, H, N, D = map(int, meta["shape"].split(","))
        causal = bool(meta["causal"])
        cell = os.path.basename(path)[:-5]
        specs = variant_specs(meta["variants"])
        best = winner(rows, max_ratio, specs)
        if best is None:
            lines.append(f"{cell}: kept the default (no variant <= {max_ratio} with Q3 < 1)")
            continue
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
                       f"{best['ratio_q3']:.3f}) of the time of {old}, "
                       f"{meta['device']}, {meta['date'][:10]}")})
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
    ap.add_argument("--run", default="")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--recheck", default=None, metavar="FILE",
                    help="write CELL:old=CONFIG;... for ab_cells.py --extra: each replaced "
                         "entry, to time against its successor again")
    a = ap.parse_args()
    replaced = {}
    for line in adopt(a.ab_dir, a.tuned, a.max_ratio, a.run, a.dry_run, replaced):
        print(line)
    if a.recheck:
        with open(a.recheck, "w") as f:
            f.write(";".join(f"{c}:old={t}" for c, t in replaced.items()))


if __name__ == "__main__":
    main()
