"""Best configs of a GPU sweep -> the tuned data files :mod:`flashscope.tuned` reads.

For each (target, kernel, dtype, head dim, causal, sequence-length class of the shape's N)
the validated record with the lowest median latency wins. Only GPU records with status
"ok" count (offline records have no speed, and a tuned file must never hold an unmeasured
choice). Several shapes in one class: the one with the most evaluated configs decides,
then the largest N. An existing file keeps its other entries; entries for the same key are
replaced. The writing is :func:`flashscope.tuned.write_entries`'s, the one writer of tuned
files (the tuner's adoptions go through it too).
"""

from __future__ import annotations

from ..errors import FlashscopeError
from ..tuned import check_replacements, entry_key, make_entry, seq_class, write_entries
from .evaluate import item_config, parse_gpu_shape


def best_entries(records, source: str = "", check=None) -> dict:
    """{target: [entry, ...]} from GPU sweep records. ``check(record) -> reason or None``
    vets a winner (e.g. :func:`flashscope.sweep.evaluate.odd_shape_check`); a rejected
    one gives way to the next fastest."""
    groups = {}
    for r in records:
        if r.get("kind") != "gpu" or r.get("status") != "ok" or not r.get("ms"):
            continue
        _, _, N, _ = parse_gpu_shape(r["shape"])
        k = (r["target"], r.get("kernel", "fwd"), r["dtype"], r["head_dim"], r["causal"],
             seq_class(N), r["shape"])
        groups.setdefault(k, []).append(r)
    chosen = {}
    for (target, _, dtype, hd, causal, cls, shape), recs in groups.items():
        best = None
        for r in sorted(recs, key=lambda r: (r["ms"], r["config_key"])):
            if check is None or check(r) is None:
                best = r
                break
        if best is None:
            continue
        N = parse_gpu_shape(shape)[2]
        rank = (len({r["config_key"] for r in recs}), N)
        cfg = item_config(best)
        key = (target, entry_key(cfg.KERNEL, dtype, hd, causal, cls))
        if key not in chosen or rank > chosen[key][0]:
            entry = make_entry(cfg, dtype, hd, causal, cls, ms=best["ms"],
                               tflops=best.get("tflops"), shape=shape, evaluated=rank[0],
                               source=source or None, search=best.get("search"))
            chosen[key] = (rank, entry)
    out = {}
    for (target, _), (_, entry) in sorted(chosen.items(), key=lambda kv: str(kv[0])):
        out.setdefault(target, []).append(entry)
    return out


def write_tuned(records, data_dir=None, source: str = "", check=None,
                force: bool = False) -> list:
    """Merge the best entries into ``<data_dir>/<target>.json``; returns the paths. An
    entry already there for the same problem is replaced only with ``force`` (checked for
    every file before any is written)."""
    per_target = best_entries(records, source, check)
    if not per_target:
        raise FlashscopeError("--write-tuned: no validated GPU timings in these results "
                              "(tuned files hold measured configs only; run with --gpu)")
    for target, entries in per_target.items():  # every file checked before any is written
        check_replacements(target, entries, data_dir, force, "--write-tuned")
    return [write_entries(target, entries, data_dir) for target, entries in per_target.items()]
