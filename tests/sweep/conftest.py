"""Sweep tests: a session-wide compile cache, tiny spaces, and fake GPU records."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def sweep_cache(tmp_path_factory):
    """A fresh $FLASHSCOPE_CACHE for the session (workers inherit it)."""
    saved = os.environ.get("FLASHSCOPE_CACHE")
    path = tmp_path_factory.mktemp("fs-cache")
    os.environ["FLASHSCOPE_CACHE"] = str(path)
    yield path
    if saved is None:
        os.environ.pop("FLASHSCOPE_CACHE", None)
    else:
        os.environ["FLASHSCOPE_CACHE"] = saved


#: Two NVIDIA points at head dim 16: each compiles in about a second.
TINY = {"targets": ["sm90"], "dtypes": ["bfloat16"], "head_dims": [16], "causal": [False],
        "BLOCK_M": [16, 32], "BLOCK_N": [16], "num_warps": [1], "num_stages": [1]}
