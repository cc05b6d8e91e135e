"""Test-suite switches.

``--device cpu`` (default) runs the kernels through Triton's CPU interpreter
(``TRITON_INTERPRET=1``, with the bf16 ``tl.dot`` fix of
:mod:`flashscope.testing.interpreter`); ``--device cuda`` runs the same tests on a GPU and
enables the ``gpu``-marked ones. ``FLASHSCOPE_TEST_DEVICE`` sets the default.

The suite runs in pytest-xdist workers (``-n auto --dist loadfile`` in pyproject.toml: a
file's tests share one worker, so module fixtures build once); ``-n 0`` runs it in one
process. With ``--device cuda`` on several GPUs each worker is pinned to one of them,
round robin (``CUDA_VISIBLE_DEVICES``), so the suite spreads over the host.
"""

import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--device", default=os.environ.get("FLASHSCOPE_TEST_DEVICE", "cpu"),
                     choices=("cpu", "cuda"),
                     help="where kernels run: cpu = Triton interpreter (default), cuda = GPU")


def _gpus() -> list:
    """The GPU ids the test run spreads over (``CUDA_VISIBLE_DEVICES``, else every one)."""
    if "FLASHSCOPE_TEST_GPUS" not in os.environ:
        from flashscope.sweep.executors import visible_devices

        os.environ["FLASHSCOPE_TEST_GPUS"] = ",".join(visible_devices())
    return [g for g in os.environ["FLASHSCOPE_TEST_GPUS"].split(",") if g]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown without the plugin
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the configured default): one worker per core, at most 4, on CPU (the
    interpreter runs one test on one core); 2 per GPU on GPUs, where two share a device."""
    if config.getoption("--device") == "cuda":
        return 2 * max(1, len(_gpus()))
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def pytest_configure(config):
    device = config.getoption("--device")
    os.environ["FLASHSCOPE_TEST_DEVICE"] = device
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if device == "cuda" and worker.startswith("gw"):
        # each worker on one GPU, round robin, pinned before anything starts CUDA here
        gpus = _gpus()
        if len(gpus) > 1:
            pin = gpus[int(worker[2:]) % len(gpus)]
            os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["HIP_VISIBLE_DEVICES"] = pin
    elif device == "cuda":
        _gpus()  # the controller's list, which its workers inherit
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        from flashscope.testing.interpreter import patch_bf16_dot

        patch_bf16_dot()
    else:
        os.environ.pop("TRITON_INTERPRET", None)


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need --device cuda; ``interpreter`` tests run kernels on CPU tensors,
    which needs Triton's interpreter chosen before Triton is imported (--device cpu)."""
    if config.getoption("--device") == "cuda":
        marker, why = "interpreter", "runs kernels on CPU tensors: needs --device cpu"
    else:
        marker, why = "gpu", "needs a GPU: run with --device cuda"
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """A fresh $FLASHSCOPE_CACHE for the session, inherited by compile workers, so tests
    neither read nor fill the user's cache (Triton's own cache still speeds builds up)."""
    saved = os.environ.get("FLASHSCOPE_CACHE")
    path = tmp_path_factory.mktemp("flashscope-cache")
    os.environ["FLASHSCOPE_CACHE"] = str(path)
    yield path
    if saved is None:
        os.environ.pop("FLASHSCOPE_CACHE", None)
    else:
        os.environ["FLASHSCOPE_CACHE"] = saved


@pytest.fixture(scope="session")
def device(pytestconfig):
    """'cpu' (interpreter) or 'cuda'."""
    return pytestconfig.getoption("--device")


@pytest.fixture(autouse=True)
def interpreter_flag(pytestconfig):
    """A command run with ``--device cpu`` sets TRITON_INTERPRET for its whole process (a
    CLI process runs one command); under ``--device cuda`` the flag is put back after each
    test, so a later test of the same worker that leaves ``--device`` out gets the GPU."""
    saved = os.environ.get("TRITON_INTERPRET")
    yield
    if pytestconfig.getoption("--device") == "cuda":
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
