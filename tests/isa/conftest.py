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


KERNELS = __import__("pathlib").Path(__file__).with_name("kernels")

#: (file, kernel, signature, constexprs, num_warps, targets) of the kernels written for
#: the tests: tutorial-style attention on every target, a matmul and a softmax on NVIDIA,
#: a vector add (no shared memory at all) on sm90 and gfx942.
USER_BUILDS = (
    ("tutorial_attention.py", "attention",
     "Q=*bf16,K=*bf16,V=*bf16,Out=*bf16,stride_h=i32:16,stride_n=i32:16,N_CTX=i32:16,"
     "qk_scale=fp32", ("BLOCK_M=128", "BLOCK_N=64", "HEAD_DIM=64"), 8,
     ("sm90", "sm80", "gfx942", "gfx1100")),
    ("small.py", "matmul", "*fp16,*fp16,*fp16,i32,i32,i32:16,i32:16,i32:16,i32:16",
     ("BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=32"), 4, ("sm90", "sm80")),
    ("small.py", "softmax", "X=*fp32,Out=*fp32,stride=i32:16,N=i32", ("BLOCK=1024",), 4,
     ("sm90",)),
    ("small.py", "add", "*fp32,*fp32,*fp32,i32", ("BLOCK=1024",), 4, ("sm90", "gfx942")),
)


@pytest.fixture(scope="session")
def user_builds(compile_cache):
    """Artifacts of :data:`USER_BUILDS`, compiled in clean worker processes."""
    from flashscope.compile import run_clean
    from flashscope.isa import user_kernel as uk

    items = []
    for fname, kernel, sig, consts, warps, targets in USER_BUILDS:
        src = uk.KernelSource(str(KERNELS / fname), kernel, sig, uk.parse_constexprs(consts),
                              num_warps=warps)
        items += [(src, t) for t in targets]
    out = run_clean(uk._task, items, jobs=2)
    for o in out:
        if isinstance(o, Exception):
            raise o
    return out


@pytest.fixture(scope="session")
def spilling_255(compile_cache):
    """A forward that uses all 255 registers on sm80 (nvdisasm refuses its life ranges)."""
    from flashscope.compile import _build_task, run_clean
    from flashscope import TritonFwdConfig

    (art,) = run_clean(_build_task, [(TritonFwdConfig.parse(
        "BLOCK_M=128,BLOCK_N=64,num_warps=4,num_stages=3"), "sm80", dict(head_dim=64))])
    if isinstance(art, Exception):
        raise art
    return art
