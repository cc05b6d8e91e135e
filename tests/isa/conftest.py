"""The golden artifacts, built once per session (in the session's compile cache)."""

import pytest

from .golden import CASES, case_id


@pytest.fixture(scope="session")
def artifacts(compile_cache):
    """{case id: Artifact} for the golden cases, compiled in parallel (one batch of worker
    processes), then read back from the cache."""
    from flashscope.compile import _build_task, build, run_clean
    from flashscope import TritonFwdConfig

    run_clean(_build_task, [(TritonFwdConfig.parse(c[1]), c[0],
                             dict(head_dim=c[2], causal=c[3])) for c in CASES], jobs=2)
    return {case_id(c): build(TritonFwdConfig.parse(c[1]), c[0], head_dim=c[2], causal=c[3])
            for c in CASES}


@pytest.fixture(scope="session")
def cubin(artifacts):
    return artifacts[case_id(CASES[0])].binary


@pytest.fixture(scope="session")
def hsaco(artifacts):
    return artifacts[case_id(CASES[3])]
