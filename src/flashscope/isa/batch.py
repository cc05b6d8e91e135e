"""Inspect configs x targets: cache hits read in this process, misses compiled in parallel.

Work items are independent Triton compiles, so misses go to a pool of ``jobs`` worker
processes (:func:`flashscope.compile.run_clean_iter`), cubins first. Each artifact is read
by a :class:`~flashscope.isa.read.Reader` as it arrives, while the rest compile; the cubins
are disassembled together, one nvdisasm run per architecture started when the last cubin
is in (its start-up, not the work, is what a per-cubin run costs). A hit costs one JSON
read.
"""

from __future__ import annotations

import os

from .. import compile as fcompile
from ..errors import FlashscopeError
from ..families import family
from ..targets import get_target
from .read import Reader, attach_occupancy
from .record import READER_VERSION, KernelRecord


def _task(item):
    cfg, target, kw = item
    try:
        return fcompile.build(cfg, target, **kw)
    except FlashscopeError as e:
        return e


def _cached(cfg, target, kw):
    """The cached record dict for one item, or None. Limits are re-checked on hits."""
    import json

    key = fcompile.cache_key(kw.get("kernel", "fwd"), cfg, target, kw.get("head_dim", 128),
                             kw.get("dtype", "bfloat16"), kw.get("causal", False),
                             kw.get("problem", fcompile.DEFAULT_PROBLEM),
                             **{k: v for k, v in kw.items() if k not in
                                ("kernel", "head_dim", "dtype", "causal", "problem")})
    path = fcompile.cache_root() / key[:2] / key / f"record-v{READER_VERSION}.json"
    try:
        art_meta = json.loads((path.parent / "artifact.json").read_text())
    except (OSError, ValueError):
        return None
    art = fcompile.Artifact(binary=b"", asm="", **{
        k: v for k, v in art_meta.items() if k in fcompile.Artifact.__dataclass_fields__
        and k not in ("binary", "asm")})
    fcompile.check_limits(art)  # over a limit: the error, without compiling again
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def inspect_configs(configs, targets, *, jobs: int = 0, occupancy: bool = True,
                    progress=None, **kw) -> list:
    """One entry per (config, target), configs outer: a :class:`KernelRecord`, or the
    :class:`FlashscopeError` that config raised for that target (e.g. over the LDS limit).

    ``kw``: head_dim, dtype, causal, kernel, problem, and kernel extras (``return_lse``).
    ``jobs``: worker processes for compiles (0: one per CPU core). ``progress(done,
    total)``: called as compiles finish (cache hits count as done at once)."""
    return inspect_pairs([(c, t) for c in configs for t in targets], jobs=jobs,
                         occupancy=occupancy, progress=progress, **kw)


def inspect_pairs(pairs, *, jobs: int = 0, occupancy: bool = True, progress=None,
                  **kw) -> list:
    """:func:`inspect_configs` for a list of (config, target) pairs (each target with
    configs of its own), compiled in one pool."""
    items = [(c, t, kw) for c, t in pairs]
    results = [None] * len(items)
    misses = []
    for i, (c, t, k) in enumerate(items):
        try:
            spec = fcompile.kernel_spec(k.get("kernel", "fwd"), t, c)
            family(spec.family).check(c, t, k.get("head_dim", 128), k.get("dtype", "bfloat16"))
            d = _cached(c, t, k)
        except FlashscopeError as e:
            results[i] = e
            continue
        if d is None:
            misses.append(i)
        else:
            results[i] = d
    jobs = jobs or os.cpu_count() or 1
    # Cubins first: once the last one is in, nvdisasm runs while the AMD kernels compile.
    misses.sort(key=lambda i: get_target(items[i][1]).vendor != "nvidia")
    nv_left = sum(get_target(items[i][1]).vendor == "nvidia" for i in misses)
    if misses and (len(misses) > 1 and jobs > 1 or fcompile.interpreter_imported()):
        built = fcompile.run_clean_iter(_task, [items[i] for i in misses], jobs)
    else:
        built = ((j, _task(items[i])) for j, i in enumerate(misses))
    reader, slots = Reader(), []
    done = len(items) - len(misses)
    if progress is not None:
        progress(done, len(items))
    for j, art in built:  # each artifact is read as it arrives, while others compile
        i = misses[j]
        done += 1
        if progress is not None:
            progress(done, len(items))
        if isinstance(art, FlashscopeError):
            results[i] = art
        else:
            reader.add(art)
            slots.append(i)
        if get_target(items[i][1]).vendor == "nvidia":
            nv_left -= 1
            if nv_left == 0:
                reader.disassemble()
    for i, r in zip(slots, reader.records()):
        results[i] = r if isinstance(r, FlashscopeError) else r.as_dict()
    out = []
    for r in results:
        if isinstance(r, dict):
            r = KernelRecord.from_dict(r)
            if occupancy:
                attach_occupancy(r)
        out.append(r)
    return out
