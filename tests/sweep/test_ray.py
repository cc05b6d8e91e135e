"""The Ray executor against a local Ray instance this test starts (about 20 s)."""

import math

import pytest

ray = pytest.importorskip("ray")

from flashscope.sweep.executors import RayExecutor  # noqa: E402
from flashscope.sweep.run import SweepRequest, run_sweep  # noqa: E402
from flashscope.sweep.space import parse_space  # noqa: E402
from flashscope.sweep.store import read_records  # noqa: E402

from .conftest import TINY  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_executor_maps(local_ray):
    got = dict(RayExecutor().imap(math.sqrt, [1.0, 4.0, 9.0]))
    assert got == {0: 1.0, 1: 2.0, 2: 3.0}


def test_offline_sweep_on_ray(local_ray, tmp_path):
    out = tmp_path / "results.jsonl"
    summary = run_sweep(SweepRequest(space=parse_space(TINY), out=out, executor="ray",
                                     progress=False))
    recs = read_records(out)
    assert summary["new_records"] == 2 and len(recs) == 2
    assert all(r["status"] == "ok" and r["registers"] > 0 and 0 < r["occupancy"] <= 1
               for r in recs)
