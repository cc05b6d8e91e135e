"""The validation catches planted cheats, on CPU tensors with plain-torch providers.

Each bad provider must be shown as failed, with no speed number and a reason naming its
fault; an honest provider (fp32 maths, output cast) must pass with a time and a speedup.
"""

import pytest
import torch
import torch.nn.functional as F

from flashscope.bench.harness import run_bench
from flashscope.bench.providers import provider
from flashscope.bench.suite import Case
from flashscope.bench.timing import Timer


def honest(case):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                              is_causal=case.causal,
                                              enable_gqa=case.gqa).to(q.dtype)
    return fn


def cached(case):
    memo = {}

    def fn(q, k, v):
        if q.shape not in memo:
            memo[q.shape] = honest(case)(q, k, v)
        return memo[q.shape]
    return fn


def half_unwritten(case):
    def fn(q, k, v):
        out = torch.empty_like(q)
        n = q.shape[2] // 2
        out[:, :, :n] = honest(case)(q, k, v)[:, :, :n]
        return out
    return fn


def zeros(case):
    return lambda q, k, v: torch.zeros_like(q)


def writes_inputs(case):
    def fn(q, k, v):
        q.copy_(honest(case)(q, k, v))  # uses q as its output buffer
        return q
    return fn


FIRST = {}


def first_shape_only(case):
    def fn(q, k, v):
        FIRST.setdefault("shape", q.shape)
        if q.shape == FIRST["shape"]:
            return honest(case)(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, scale=1.0, enable_gqa=case.gqa)
    return fn


def less_work_when_timed(case):
    calls = {}

    def fn(q, k, v):
        calls[q.data_ptr()] = calls.get(q.data_ptr(), 0) + 1
        if calls[q.data_ptr()] <= 1:
            return honest(case)(q, k, v)
        out = torch.zeros_like(q)  # repeated calls on the same inputs: half the heads
        h = q.shape[1] // 2
        out[:, :h] = honest(case)(q[:, :h], k[:, :h], v[:, :h])
        return out
    return fn


def raises(case):
    def fn(q, k, v):
        raise RuntimeError("no kernel for this shape")
    return fn


CHEATS = {
    "cached": (cached, "stale result"),
    "unwritten": (half_unwritten, "unwritten"),
    "zeros": (zeros, "all zeros"),
    "writes-inputs": (writes_inputs, "modified its input q"),
    "first-shape-only": (first_shape_only, "relative error"),
    "less-work-timed": (less_work_when_timed, "last timed call"),
}


def registry(**extra):
    reg = {}
    provider("honest", description="fp32 SDPA math, cast", registry=reg)(
        lambda case, opts: honest(case))
    for name, (make, _) in CHEATS.items():
        provider(name, description=name, registry=reg)(lambda case, opts, m=make: m(case))
    for name, kw in extra.items():
        provider(name, description=name, registry=reg, **kw)(lambda case, opts: raises(case))
    return reg


CASE = Case(2, 4, 96, 96, 32, 4, causal=True, dtype="float16")


@pytest.fixture(scope="module")
def results():
    FIRST.clear()
    reg = registry(broken={}, absent={"available": lambda d: "needs a flux capacitor"})
    res, base = run_bench([CASE], list(reg.values()), device="cpu",
                          timer=Timer(device="cpu", cpu_reps=3), baseline="honest")
    return {r.provider: r for r in res}, base


def test_honest_provider_passes(results):
    res, base = results
    r = res["honest"]
    assert base == "honest"
    assert r.status == "ok", r.reason
    assert r.ms > 0 and r.tflops > 0 and r.speedup == pytest.approx(1.0)
    assert r.max_rel_error <= 2e-3
    assert CASE.shape in r.validated_shapes and len(r.validated_shapes) >= 4


@pytest.mark.parametrize("name", list(CHEATS))
def test_cheat_is_flagged_with_its_fault(results, name):
    r = results[0][name]
    assert r.status == "failed", (name, r.status, r.reason)
    assert CHEATS[name][1] in r.reason, r.reason
    assert r.ms is None and r.tflops is None and r.speedup is None


def test_first_shape_only_fails_on_a_later_shape(results):
    reason = results[0]["first-shape-only"].reason
    first = "2,3,127,32"
    assert "validation at" in reason and first not in reason, reason


def test_errors_and_unavailable_have_reasons(results):
    res = results[0]
    assert res["broken"].status == "error" and "no kernel for this shape" in res["broken"].reason
    assert res["absent"].status == "unavailable"
    assert res["absent"].reason == "needs a flux capacitor"


@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
def test_honest_backward_passes_and_grad_cheat_fails(mode):
    reg = {}
    provider("honest", description="", registry=reg)(lambda case, opts: honest(case))

    def detached_grads(case):
        def fn(q, k, v):  # gradient flows to q only through a wrong path
            return honest(case)(q, k.detach(), v.detach()) + 0 * k.sum()
        return fn

    provider("no-dk", description="", registry=reg)(lambda case, opts: detached_grads(case))
    case = Case(1, 4, 64, 80, 16, 2, causal=False, dtype="bfloat16", mode=mode)
    res, _ = run_bench([case], list(reg.values()), device="cpu",
                       timer=Timer(device="cpu", cpu_reps=2))
    got = {r.provider: r for r in res}
    assert got["honest"].status == "ok", got["honest"].reason
    assert got["no-dk"].status == "failed" and "dk: all zeros" in got["no-dk"].reason
