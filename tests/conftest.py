"""Test-suite switches.

``--device cpu`` (default) runs the kernels through Triton's CPU interpreter
(``TRITON_INTERPRET=1``, with the bf16 ``tl.dot`` fix of
:mod:`flashscope.testing.interpreter`); ``--device cuda`` runs the same tests on a GPU and
enables the ``gpu``-marked ones. ``FLASHSCOPE_TEST_DEVICE`` sets the default.

The suite runs in pytest-xdist workers (``-n auto --dist loadfile`` in pyproject.toml: a
file's tests share one worker, so module fixtures build once); ``-n 0`` runs it in one
process.
"""

import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--device", default=os.environ.get("FLASHSCOPE_TEST_DEVICE", "cpu"),
                     choices=("cpu", "cuda"),
                     help="where kernels run: cpu = Triton interpreter (default), cuda = GPU")


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the configured default): one worker per core, at most 4, on CPU (the
    interpreter runs one test on one core); 2 on a GPU, where the tests share the device."""
    if config.getoption("--device") == "cuda":
        return 2
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def pytest_configure(config):
    device = config.getoption("--device")
    os.environ["FLASHSCOPE_TEST_DEVICE"] = device
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
