"""Cells timed by two pinned workers, a second or so each, to be killed part-way, for the SIGKILL
test: ``python slow_cells.py OUT``; importable for the same plan."""

import sys

from flashscope.tune.ab import Settings
from flashscope.tune.batch import run_cells
from flashscope.tune.cells import shape_cell

#: SDPA's math backend only: no Triton
SPECS = {"d": "sdpa-math", "m": "sdpa-math"}
SETTINGS = Settings(rounds=20, reps=5)


def plan(n: int = 8) -> dict:
    cells = [shape_cell(f"1,2,{32 + 8 * i},16", False) for i in range(n)]
    return {c.name: (c, SPECS) for c in cells}


if __name__ == "__main__":
    run_cells(plan(), sys.argv[1], SETTINGS, devices=["0", "1"], device="cpu")
