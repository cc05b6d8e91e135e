"""Time `flashscope inspect` on 24 configs x 2 targets (sm90, gfx942), cold and warm, next
to raw `triton.compile` of the same 48 kernels in the same run with the same worker count.

Cold runs use fresh, empty Triton and flashscope caches and are repeated in pairs with
alternating order (``--repeat``, median pair reported); "raw" binds each kernel exactly as
inspect does and calls triton.compile, nothing else (no ELF reading, no disassembly, no
cache writes). Warm is a separate `flashscope inspect --json` process over the filled cache
(process start-up included). Writes OUTDIR/bench_inspect.json.

The kernel is the portable forward (``triton-fwd``), whose 24 configs build for both
targets. No command does this: it measures inspect itself.

Usage: PYTHONPATH=src python scripts/bench_inspect.py OUTDIR [--jobs N] [--head-dim D]
       [--repeat R]
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flashscope import TritonFwdConfig, family
from flashscope import compile as fc
from flashscope.errors import FlashscopeError
from flashscope.isa import inspect_configs
from flashscope.targets import get_target

KERNEL = "triton-fwd"


def configs():
    return [TritonFwdConfig(m, n, w, s) for m, n, w, s in
            itertools.product((64, 128), (32, 64), (4, 8), (1, 2, 3))]


def _raw(item):
    import contextlib
    import io

    import torch  # noqa: F401  (both runs fork workers from a parent that has it loaded)
    import triton

    cfg, target, head_dim = item
    t = get_target(target)
    src, gpu, options, _ = fc._bind(fc.KERNELS[KERNEL], cfg, t, head_dim, "bfloat16", False,
                                    fc.DEFAULT_PROBLEM, {})
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            triton.compile(src, target=gpu, options=options.__dict__)
        return True
    except Exception:
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3, help="cold pairs (median reported)")
    a = ap.parse_args(argv)
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    targets = ["sm90", "gfx942"]
    cfgs = configs()
    work = Path(tempfile.mkdtemp(prefix="bench-inspect-"))

    import torch  # noqa: F401  (both runs fork workers from a parent that has it loaded)
    import triton

    # Cold runs, repeated in alternating order (raw first, then inspect first, ...), each
    # with fresh caches: a shared 2-core machine drifts by 10-20% between runs, so the
    # ratio is taken per pair and the median pair is reported.
    # The same work on both sides: kernels over a target's limits (inspect rejects them
    # before compiling, e.g. shared memory over gfx942's 64 KB) are left out of both.
    feasible = []
    for c in cfgs:
        for t in targets:
            try:
                family(KERNEL).check(c, t, a.head_dim, "bfloat16")
                feasible.append((c, t))
            except FlashscopeError:
                pass
    # Inspect compiles cubins first (nvdisasm then runs while the AMD kernels compile); raw
    # takes the same order, so that scheduling is not counted for or against either side.
    items = sorted(((c, t, a.head_dim) for c, t in feasible),
                   key=lambda it: get_target(it[1]).vendor != "nvidia")
    pairs = []
    for rep in range(a.repeat):
        rdir = work / f"rep{rep}"

        def raw():
            os.environ["TRITON_CACHE_DIR"] = str(rdir / "triton-raw")
            t0 = time.perf_counter()
            ok = fc.run_clean(_raw, items, a.jobs)
            return time.perf_counter() - t0, ok

        def cold():
            os.environ["TRITON_CACHE_DIR"] = str(rdir / "triton-inspect")
            os.environ["FLASHSCOPE_CACHE"] = str(rdir / "flashscope")
            t0 = time.perf_counter()
            recs = inspect_configs(cfgs, targets, jobs=a.jobs, head_dim=a.head_dim,
                                   kernel=KERNEL)
            return time.perf_counter() - t0, recs

        if rep % 2 == 0:
            (raw_s, ok), (cold_s, recs) = raw(), cold()
        else:
            (cold_s, recs), (raw_s, ok) = cold(), raw()
        pairs.append({"raw_s": round(raw_s, 2), "inspect_s": round(cold_s, 2),
                      "overhead": round(cold_s / raw_s - 1, 4),
                      "order": "raw first" if rep % 2 == 0 else "inspect first"})
    mid = sorted(pairs, key=lambda p: p["overhead"])[len(pairs) // 2]
    raw_s, cold_s = mid["raw_s"], mid["inspect_s"]

    # warm: a new process over the filled cache
    cfg_file = work / "configs.json"
    cfg_file.write_text(json.dumps([c.as_dict() for c in cfgs]))
    cmd = [sys.executable, "-m", "flashscope.cli", "inspect", "--kernel", KERNEL,
           "--configs", str(cfg_file),
           "--target", ",".join(targets), "--head-dim", str(a.head_dim), "--json"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
    warm_s = time.perf_counter() - t0
    warm_in_process = time.perf_counter()
    inspect_configs(cfgs, targets, jobs=a.jobs, head_dim=a.head_dim, kernel=KERNEL)
    warm_in_process = time.perf_counter() - warm_in_process

    result = {
        "triton": triton.__version__, "cpus": os.cpu_count(), "jobs": a.jobs,
        "head_dim": a.head_dim, "targets": targets, "configs": len(cfgs),
        "kernels": len(cfgs) * len(targets), "compiled_by_both": len(items),
        "raw_compiled": sum(ok),
        "inspect_records": sum(1 for r in recs if not isinstance(r, Exception)),
        "inspect_errors": [str(r) for r in recs if isinstance(r, Exception)],
        "raw_triton_compile_s": round(raw_s, 2), "inspect_cold_s": round(cold_s, 2),
        "cold_overhead": round(cold_s / raw_s - 1, 4), "cold_pairs": pairs,
        "inspect_warm_cli_s": round(warm_s, 3), "warm_cli_exit": p.returncode,
        "inspect_warm_in_process_s": round(warm_in_process, 3),
    }
    (out / "bench_inspect.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "inspect_errors"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
