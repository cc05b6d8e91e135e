"""A sweep whose points take 0.1 s each (no compiler), for the kill/resume and durability
tests.

Run as ``python slow_sweep.py OUT_JSONL [JOBS]`` (JOBS > 1: a local pool of forked
workers); importable for the same space and evaluator."""

import sys
import time

from flashscope.sweep import evaluate as ev
from flashscope.sweep.run import SweepRequest, run_sweep
from flashscope.sweep.space import parse_space

#: 2 x 3 x 2 x 2 = 24 feasible points at head dim 64 on sm90.
SPACE = {"targets": ["sm90"], "dtypes": ["bfloat16"], "head_dims": [64], "causal": [False],
         "BLOCK_M": [32, 64], "BLOCK_N": [16, 32, 64], "num_warps": [2, 4],
         "num_stages": [1, 2]}


def slow_eval(item):
    time.sleep(0.1)
    rec = ev.base_record(item)
    c = item["config"]
    rec.update(status="ok", registers=c["BLOCK_M"] + c["BLOCK_N"], occupancy=1 / c["num_warps"],
               spill_stores=0, spill_loads=0, local_bytes=0)
    return rec


def request(out, **kw):
    return SweepRequest(space=parse_space(SPACE), out=out, jobs=kw.pop("jobs", 1),
                        progress=False, evaluator=kw.pop("evaluator", slow_eval), **kw)


if __name__ == "__main__":
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    run_sweep(request(sys.argv[1], jobs=jobs))
