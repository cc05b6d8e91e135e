"""Every reader of a file a user hands flashscope, fed 1,000 damaged copies of a valid file
each (tests/fuzz/damage.py: wrong types, missing keys, deep nesting, impossible values,
truncation, binary junk; seed i is case i). Each case must either read, with every number
it returns finite and in range, or end in a FlashscopeError (one line on the CLI, exit 2).
Any other exception is a failure naming the seed. A few seconds per reader."""

import json
import math
import random
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from flashscope.errors import FlashscopeError

from .damage import damage_csv, damage_json, read_csv_rows

CASES = 1000
DATA = Path(__file__).parents[1] / "data"
#: reader -> outcome counts, for the summary the last test prints
COUNTS = {}


def _finite(x, lo=0.0) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) \
        and x >= lo


def fuzz(name, make, read, check=None, suffix=".json"):
    """Feed ``read`` CASES damaged files from ``make(rng)``; see the module docstring."""
    counts = Counter()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"input{suffix}"
        for seed in range(CASES):
            data = make(random.Random(seed))
            path.write_bytes(data)
            try:
                out = read(path)
            except FlashscopeError:
                counts["clean error"] += 1
                continue
            except Exception as e:  # noqa: BLE001  (what the test is for)
                pytest.fail(f"{name}, seed {seed}: {type(e).__name__}: {str(e)[:300]} "
                            f"(input starts {data[:120]!r})")
            if check is not None:
                problem = check(out)
                assert problem is None, f"{name}, seed {seed}: {problem}"
            counts["read"] += 1
    COUNTS[name] = counts
    # the damage reaches the checks: most cases are refused, some still read
    assert counts["clean error"] >= CASES // 4, counts


# --- sweep stores -------------------------------------------------------------------------

STORE = [
    {"key": "offline|sm90|bfloat16|64|full|m64n32w4s2q1", "kind": "offline", "status": "ok",
     "target": "sm90", "dtype": "bfloat16", "head_dim": 64, "causal": False,
     "config": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2,
                "Q_IN_REGS": True, "maxnreg": None, "waves_per_eu": None},
     "config_key": "m64n32w4s2q1", "registers": 128, "spill_stores": 0, "spill_loads": 0,
     "local_bytes": 0, "shared_bytes": 24576, "threads": 128, "occupancy": 0.25,
     "limiter": ["registers"], "active_warps": 16, "seconds": 1.2, "search": "exhaustive"},
    {"key": "offline|sm90|bfloat16|64|full|m256n32w4s2q1", "kind": "offline",
     "status": "pruned", "target": "sm90", "dtype": "bfloat16", "head_dim": 64,
     "causal": False, "config": {"BLOCK_M": 256, "BLOCK_N": 32, "num_warps": 4},
     "config_key": "m256n32w4s2q1", "reason": "too many registers", "search": "exhaustive"},
    {"key": "gpu|sm90|bfloat16|64|causal|m64n32w4s2q1|4,32,4096,64", "kind": "gpu",
     "status": "ok", "target": "sm90", "dtype": "bfloat16", "head_dim": 64, "causal": True,
     "config": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
     "config_key": "m64n32w4s2q1", "shape": "4,32,4096,64", "ms": 0.5, "tflops": 275.0,
     "max_rel_error": 0.004, "registers": 128, "occupancy": 0.25, "search": "evolve",
     "validated_shapes": ["2,3,127,64", "4,32,4096,64"]},
    {"key": "gpu|sm90|bfloat16|64|causal|m128n32w4s2q1|4,32,4096,64", "kind": "gpu",
     "status": "failed", "target": "sm90", "dtype": "bfloat16", "head_dim": 64,
     "causal": True, "config": {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4},
     "config_key": "m128n32w4s2q1", "shape": "4,32,4096,64", "reason": "validation"},
]


def _store_bytes(rng) -> bytes:
    lines = [json.dumps(r).encode() for r in STORE]
    if rng.random() < 0.7:
        i = rng.randrange(len(lines))
        lines[i] = damage_json(STORE[i], rng).replace(b"\n", b" ")
        return b"\n".join(lines) + b"\n"
    return damage_json(STORE, rng).replace(b"\n", b" ") + b"\n"


def _read_store(path):
    from flashscope.sweep.run import compare_searches
    from flashscope.sweep.store import ResultStore, read_records
    from flashscope.sweep.tuned import best_entries

    recs = read_records(path)
    compare_searches(recs, recs)
    best_entries(recs)
    with ResultStore(path, resume=True) as s:  # the lock, the repair of a torn line
        s.append(STORE[0])
    return read_records(path)


def _check_records(recs):
    for r in recs:
        for k in ("ms", "tflops", "occupancy", "registers", "shared_bytes", "seconds"):
            if r.get(k) is not None and not _finite(r[k]):
                return f"record {r['key']}: {k} = {r[k]!r}"
    return None


def test_sweep_stores():
    fuzz("sweep store (results.jsonl)", _store_bytes, _read_store, _check_records,
         suffix=".jsonl")


# --- --configs, --space --------------------------------------------------------------------

CONFIGS = [{"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2,
            "Q_IN_REGS": True, "maxnreg": None}, "BLOCK_M=64,BLOCK_N=32,num_warps=4",
           {"BLOCK_M": 64, "key": "m64n64w4s3q1"}]


def test_configs_files():
    from flashscope.commands.common import read_configs
    from flashscope import TritonFwdConfig

    def check(cfgs):
        for c in cfgs:
            for v in c.as_dict().values():
                if isinstance(v, float):
                    return f"{c}: a float knob"
        return None

    fuzz("--configs JSON", lambda rng: damage_json(CONFIGS, rng),
         lambda p: read_configs(p, TritonFwdConfig), check)


SPACE = {"spaces": [{"targets": ["sm90"], "dtypes": ["bfloat16"], "head_dims": [64],
                     "causal": [False, True], "BLOCK_M": [64, 128], "BLOCK_N": [32, 64],
                     "num_warps": [4, 8], "num_stages": [2], "maxnreg": [None, 168]},
                    {"targets": ["gfx942"], "dtypes": ["float16"], "head_dims": [128],
                     "causal": [False], "BLOCK_M": [64], "waves_per_eu": [None, 2]}]}


def _read_space(path):
    from flashscope.commands.sweep import _read_space

    space = _read_space(path, "fwd")
    for p in space.problems():
        space.axes_for(p)
    if sum(len(v) for b in space.blocks for v in b.axes.values()) < 64:
        space.points()
    return space


def test_space_files():
    fuzz("--space JSON", lambda rng: damage_json(SPACE, rng), _read_space)


# --- --speed (JSON and CSV), profile JSON ----------------------------------------------------

SPEED = {"rows": [
    {"D": 128, "N": 4096, "causal": False, "provider": "flashscope", "config": "m64n64w4s3q1",
     "ms": 1.0},
    {"D": 128, "N": 4096, "causal": False, "provider": "flashscope",
     "config": "m128n64w8s3q1", "tflops": 420.5},
    {"provider": "cudnn", "D": 128, "N": 4096, "causal": False, "ms": 0.8},
    {"provider": "flashscope", "config": "m128n64w4s3q1", "error": "out of resources"}]}


def _check_speed(speed):
    bad = {k: v for k, v in speed.items() if not _finite(v)}
    return f"speeds {bad}" if bad else None


def test_speed_json():
    from flashscope.profile.session import load_speed

    fuzz("--speed JSON", lambda rng: damage_json(SPEED, rng),
         lambda p: load_speed(p, (4, 16, 4096, 128), False), _check_speed)


def test_speed_csv():
    from flashscope.profile.session import load_speed

    cols = ["provider", "config", "N", "D", "causal", "ms", "tflops"]
    rows = [cols] + [[str(r.get(c, "")) for c in cols] for r in SPEED["rows"]]
    fuzz("--speed CSV", lambda rng: damage_csv(rows, rng),
         lambda p: load_speed(p, (4, 16, 4096, 128), False), _check_speed, suffix=".csv")


PROFILE = {"kernels": [
    {"provider": "cudnn", "kernel": "cudnn_sdpa", "config": "", "config_key": "",
     "duration": 0.831968, "dram_throughput": 9.4, "tensor_pipe": 75.9, "issue_active": 44.0,
     "achieved_occupancy": 14.06, "registers": 168, "tflops": 660.8},
    {"provider": "flashscope", "kernel": "_attn_fwd", "config": "BLOCK_M=128",
     "config_key": "m128n64w4s3q1", "duration": 1.09, "dram_bandwidth": 2.1e11}]}


def _read_counters(path):
    from flashscope.commands.roofline import _counter_rows
    from flashscope.roofline import CEILINGS, Point, verdict

    rows = _counter_rows(path)
    for r in rows:
        ms = r.get("duration")
        verdict(Point("k", 5e11, 2.7e8, ms * 1e-3 if ms else None), CEILINGS[0], r)
    return rows


def test_profile_json_as_roofline_counters():
    fuzz("roofline --counters (profile JSON)", lambda rng: damage_json(PROFILE, rng),
         _read_counters)


# --- torch.profiler traces -------------------------------------------------------------------

TRACE = json.loads((DATA / "breakdown" / "torch_gpu_sample.json").read_text())


def test_torch_traces():
    from flashscope.breakdown import summarize
    from flashscope.breakdown.torch_trace import read_trace

    def read(path):
        events, _ = read_trace(path)
        return events, summarize(events)

    def check(out):
        events, summary = out
        bad = [e for e in events if not _finite(e[1])]
        return f"events {bad[:3]}" if bad else None

    fuzz("torch.profiler trace", lambda rng: damage_json(TRACE, rng), read, check)


# --- ncu CSVs ---------------------------------------------------------------------------------

def _ncu_seed(name):
    text = (DATA / "profile" / name).read_text()
    lines = text.splitlines(keepends=True)
    start = next(i for i, x in enumerate(lines) if x.startswith('"ID"'))
    body = [x for x in lines[start:] if not x.startswith("==")]
    import csv

    return "".join(lines[:start]), list(csv.reader(body))


def test_ncu_csv():
    from flashscope.breakdown.ncu_export import read_ncu_events
    from flashscope.profile.ncu_csv import read_ncu_csv

    preamble, rows = _ncu_seed("ncu_03_flashscope.csv")

    def read(path):
        ks = [k.as_dict() for k in read_ncu_csv(path)]
        try:
            read_ncu_events(path)
        except FlashscopeError:
            pass
        return ks

    def check(ks):
        for k in ks:
            for m, v in k.items():
                if m not in ("id", "kernel", "block", "grid") and v is not None \
                        and not _finite(v):
                    return f"kernel {k['id']}: {m} = {v!r}"
        return None

    fuzz("ncu CSV", lambda rng: damage_csv(rows, rng, preamble), read, check, suffix=".csv")


# --- rocprofv3 CSVs ---------------------------------------------------------------------------

def test_rocprof_kernel_trace():
    from flashscope.breakdown.rocprof import kernel_occupancy, read_kernel_trace

    rows = read_csv_rows(DATA / "breakdown" / "rocprof_kernel_trace.csv")

    def read(path):
        d = read_kernel_trace(path)
        kernel_occupancy(d, "gfx942")
        kernel_occupancy(d, "gfx1100")
        return d

    def check(ds):
        for d in ds:
            if not _finite(d["seconds"]) or not _finite(d["threads"], 1):
                return f"dispatch {d}"
        return None

    fuzz("rocprofv3 kernel trace", lambda rng: damage_csv(rows, rng), read, check,
         suffix=".csv")


def test_rocprof_stats():
    from flashscope.breakdown.rocprof import read_stats

    rows = read_csv_rows(DATA / "breakdown" / "rocprof_kernel_stats.csv")

    def check(events):
        bad = [e for e in events if not _finite(e[1]) or not _finite(e[2])]
        return f"events {bad[:3]}" if bad else None

    fuzz("rocprofv3 kernel stats", lambda rng: damage_csv(rows, rng), read_stats, check,
         suffix=".csv")


def test_rocprof_agent_info():
    from flashscope.breakdown.rocprof import read_agent_target
    from flashscope.targets import get_target

    rows = read_csv_rows(DATA / "breakdown" / "rocprof_agent_info.csv")

    def read(path):
        t = read_agent_target(path)
        return t if t is None else get_target(t).name

    fuzz("rocprofv3 agent info", lambda rng: damage_csv(rows, rng), read, suffix=".csv")


def test_zz_counts(capsys):
    """The outcome of every reader's cases (run with -s to see them)."""
    with capsys.disabled():
        for name, c in COUNTS.items():
            print(f"\n  {name}: {sum(c.values())} cases, {c['clean error']} clean errors, "
                  f"{c['read']} read", end="")
        print()
