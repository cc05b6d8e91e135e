"""Best configs of a GPU sweep -> the tuned data files :mod:`flashscope.tuned` reads.

For each (target, dtype, head dim, causal, sequence-length class of the shape's N) the
validated record with the lowest median latency wins. Only GPU records with status "ok"
count (offline records have no speed, and a tuned file must never hold an unmeasured
choice). Several shapes in one class: the one with the most evaluated configs decides,
then the largest N. An existing file keeps its other entries; entries for the same key are
replaced. Files are written atomically (temporary file + rename) and read back through
the strict reader before the rename, so a written file always loads.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..config import AttentionConfig
from ..errors import FlashscopeError
from ..tuned import DATA_DIR, FORMAT, entry_key, load_tuned, parse_tuned, seq_class, tuned_path
from .evaluate import parse_gpu_shape


def best_entries(records, source: str = "", check=None) -> dict:
    """{target: [entry, ...]} from GPU sweep records. ``check(record) -> reason or None``
    vets a winner (e.g. :func:`flashscope.sweep.evaluate.odd_shape_check`); a rejected
    one gives way to the next fastest."""
    groups = {}
    for r in records:
        if r.get("kind") != "gpu" or r.get("status") != "ok" or not r.get("ms"):
            continue
        _, _, N, _ = parse_gpu_shape(r["shape"])
        k = (r["target"], r["dtype"], r["head_dim"], r["causal"], seq_class(N), r["shape"])
        groups.setdefault(k, []).append(r)
    chosen = {}
    for (target, dtype, hd, causal, cls, shape), recs in groups.items():
        best = None
        for r in sorted(recs, key=lambda r: (r["ms"], r["config_key"])):
            if check is None or check(r) is None:
                best = r
                break
        if best is None:
            continue
        N = parse_gpu_shape(shape)[2]
        rank = (len({r["config_key"] for r in recs}), N)
        key = (target, entry_key(dtype, hd, causal, cls))
        if key not in chosen or rank > chosen[key][0]:
            entry = {"dtype": dtype, "head_dim": hd, "causal": causal, "seq_class": cls,
                     "config": AttentionConfig.from_dict(best["config"]).as_dict(),
                     "ms": best["ms"], "tflops": best.get("tflops"), "shape": shape,
                     "evaluated": rank[0], "source": source}
            if best.get("search"):
                entry["search"] = best["search"]
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
    d = Path(data_dir or DATA_DIR)
    d.mkdir(parents=True, exist_ok=True)
    merged = {}
    for target, entries in per_target.items():
        existing = {k: e for k, (_, e) in load_tuned(target, d).items()}
        for e in entries:
            k = entry_key(e["dtype"], e["head_dim"], e["causal"], e["seq_class"])
            if k in existing and existing[k]["config"] != e["config"] and not force:
                raise FlashscopeError(f"--write-tuned: {tuned_path(target, d)} already has "
                                      f"an entry for {k} with another config; pass --force "
                                      "to replace it (the results stay in results.jsonl: "
                                      "rerun with --resume)")
            existing[k] = e
        merged[target] = existing
    paths = []
    for target, existing in merged.items():
        data = {"format": FORMAT, "target": target,
                "entries": [existing[k] for k in sorted(existing)]}
        path = tuned_path(target, d)
        parse_tuned(data, target, str(path))
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        paths.append(path)
    return paths
