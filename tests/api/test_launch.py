"""flashscope.launch: the Gluon forward's direct launch path.

After the first launch of a specialization, :func:`flashscope.launch.launch_compiled`
calls the compiled kernel's launcher itself instead of Triton's ``kernel[grid]``. That is
only right if its key (:func:`flashscope.launch.launch_key`) changes whenever Triton's
binder would pick another kernel: checked offline against the binder itself, on CPU
tensors (the binder reads only dtypes, data pointers and values). On an sm_90 GPU:
repeated calls take the direct path and still match the float64 reference.
"""

import dataclasses
import inspect
import itertools

import pytest
import torch
import triton

from flashscope import compat, kernels, launch
from flashscope.compat import run_keywords
from flashscope.families import sm90_fwd
from flashscope.families.sm90_fwd import Sm90FwdConfig
from flashscope.masks import Mask
from flashscope.targets import get_target, gpu_target

from .test_forward import run_case

G = Sm90FwdConfig(BLOCK_M=128, BLOCK_N=128, num_stages=3, Q_IN_REGS=False)


def _call(q, k, v, out, lse, causal, scale, cfg):
    return sm90_fwd.call(q, k, v, out, lse, mask=Mask.of(causal), scale=scale, cfg=cfg)


def _binder():
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = kernels.load("attention_fwd_sm90")._attn_fwd_sm90
    return create_function_from_signature(fn.signature, fn.params,
                                          make_backend(gpu_target(get_target("sm90"))))


def _launch_args(B, H, Hkv, Nq, Nk, D, dtype, causal, lse_offset, cfg):
    q = torch.randn(B, H, Nq, D, dtype=dtype)
    k, v = (torch.randn(B, Hkv, Nk, D, dtype=dtype) for _ in range(2))
    out = torch.empty_like(q)
    lse = None
    if lse_offset is not None:  # a view that starts lse_offset floats into its buffer
        lse = torch.empty(B * H * Nq + 4)[lse_offset:lse_offset + B * H * Nq].view(B, H, Nq)
    grid, args, consts = _call(q, k, v, out, lse, causal, 0.125, cfg)
    return args, consts, launch.vendor_options(cfg, "nvidia")


def test_key_changes_exactly_when_the_binder_specializes_differently():
    binder = _binder()
    fn = kernels.load("attention_fwd_sm90")._attn_fwd_sm90
    seen = {}
    plain = launch.plain_params(fn)
    assert plain, "the division multipliers are declared do_not_specialize"
    problems = itertools.product(
        # B, H, Hkv: == 1, % 16 == 0, GQA; H and the group not powers of two
        [(1, 1, 1), (2, 4, 2), (3, 16, 16), (2, 6, 2), (1, 12, 4)],
        # Nq, Nk; the last two give 3 and 5 row blocks of 128, 2 and 4 of 192
        [(1, 1), (16, 32), (48, 64), (100, 77), (90, 77), (300, 200), (560, 333)],
        [64, 128], [torch.float16, torch.bfloat16], [False, True],
        [None, 0, 1],                                # no lse, aligned lse, 4-byte offset
        [G, G.replace(BLOCK_M=192, BLOCK_N=64, PINGPONG=True)])
    for (B, H, Hkv), (Nq, Nk), D, dtype, causal, lse_offset, cfg in problems:
        args, consts, opts = _launch_args(B, H, Hkv, Nq, Nk, D, dtype, causal, lse_offset,
                                          cfg)
        key = launch.launch_key(args, consts, opts, 0, plain)
        _, spec, options = binder(*args, **run_keywords(fn, {**consts, **opts}))
        spec = (tuple(spec), tuple(sorted(options.items())))
        assert seen.setdefault(key, spec) == spec, (B, H, Hkv, Nq, Nk, D, dtype, causal)
    specs = set(seen.values())
    assert len(specs) == len(seen), "two keys for one specialization: needless compiles"
    assert len(seen) < 5 * 7 * 2 * 2 * 2 * 3 * 2, "every problem its own key: a vacuous test"


def test_key_refuses_an_argument_it_cannot_specialize():
    with pytest.raises(TypeError, match="no specialization rule for object"):
        launch.launch_key((object(),), {}, {}, 0)


def test_descriptor_fields_match_the_constructor():
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    x = torch.randn(2, 1, 100, 64, dtype=torch.bfloat16)
    fast = sm90_fwd.tma_desc4(x, "query", 64)
    slow = TensorDescriptor(x, fast.shape, fast.strides, fast.block_shape, fast.layout)
    assert isinstance(fast, TensorDescriptor)
    # every field of this release's descriptor (3.7 adds round_f32_to_tf32), the ones the
    # constructor defaults included: the launcher reads them all
    names = [f.name for f in dataclasses.fields(TensorDescriptor) if f.name != "base"]
    assert {"shape", "strides", "block_shape", "layout", "padding"} <= set(names)
    for name in names:
        assert getattr(fast, name) == getattr(slow, name), name
    # the size-1 head dimension gets a stride TMA accepts; it is never stepped
    assert fast.base is x and fast.strides == [6400, 512, 64, 1]


def test_descriptor_rules_name_the_argument_and_the_rule():
    from flashscope.errors import ConfigError

    base = torch.randn(1, 2, 64, 72, dtype=torch.float16)
    ok = base[..., :64]  # rows 144 bytes apart: aligned
    every_third = torch.randn(1, 2, 60, 64, dtype=torch.float16)[:, :, ::3]  # 384-byte rows
    assert not sm90_fwd.tensors_problem(ok, ok, ok)
    assert not sm90_fwd.tensors_problem(every_third, ok, ok)
    assert sm90_fwd.tma_desc4(ok, "key", 128).strides == [512, 4608, 72, 1]  # B = 1: any
    refused = [
        (base[..., 4:68], "key: sm90-fwd needs a 16-byte aligned base and strides, got "
                          r"strides \(9216, 4608, 72, 1\) at base address % 16 = 8"),
        (torch.randn(1, 2, 64, 70, dtype=torch.float16)[..., :64],  # 140-byte rows
         r"16-byte aligned base and strides, got strides \(8960, 4480, 70, 1\)"),
        (base.transpose(2, 3)[..., :64], "key: sm90-fwd needs a contiguous last dimension")]
    for x, match in refused:
        assert sm90_fwd.tensors_problem(x, ok, ok)
        with pytest.raises(ConfigError, match=match):
            sm90_fwd.tma_desc4(x, "key", 128)


class _Compiled:
    """Stands in for a CompiledKernel: records the launcher calls."""
    function, packed_metadata = "fn", "meta"

    def __init__(self):
        self.calls = []

    def launch_metadata(self, grid, stream, *call):
        return ("metadata", grid, stream, call)

    def run(self, *call):
        self.calls.append(call)


class _Param:
    def __init__(self, name, default=inspect.Parameter.empty):
        self.name, self.default = name, default


class _Kernel:
    """Stands in for a JITFunction: ``kernel[grid](...)`` compiles once per call."""

    def __init__(self, names, defaults=None):
        self.params = [_Param(n, *([defaults[n]] if n in (defaults or {}) else []))
                       for n in names]
        self.jit_calls = []

    def __getitem__(self, grid):
        def call(*args, **kw):
            self.jit_calls.append((grid, args, kw))
            return _Compiled()
        return call


def test_first_launch_compiles_then_calls_the_launcher(monkeypatch):
    monkeypatch.setattr(launch, "_COMPILED", {})
    monkeypatch.setattr(launch, "_current_stream", lambda index: "stream")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    hooks = triton.knobs.runtime
    kernel = _Kernel(["x", "n", "A", "B"])
    x = torch.zeros(4)
    launch.launch_compiled(kernel, (7,), (x, 32), {"A": 1, "B": True}, {"num_warps": 4})
    assert len(kernel.jit_calls) == 1
    ((compiled, tail, direct),) = launch._COMPILED.values()
    assert tail == (1, True) and direct is None  # the shared cache launches through run
    launch.launch_compiled(kernel, (5,), (x, 48), {"A": 1, "B": True}, {"num_warps": 4})
    assert len(kernel.jit_calls) == 1
    # as JITFunction.run: grid, stream, handle, metadata, hooks, then every parameter in
    # signature order, constexprs included; hooks that call nothing pass as None
    args = (x, 48, 1, True)
    assert compiled.calls == [(5, 1, 1, "stream", "fn", "meta", None, None, None, *args)]
    seen = []
    monkeypatch.setattr(hooks, "launch_enter_hook", seen.append)
    launch.launch_compiled(kernel, (5,), (x, 48), {"A": 1, "B": True}, {"num_warps": 4})
    assert compiled.calls[-1] == (5, 1, 1, "stream", "fn", "meta",
                                  ("metadata", (5, 1, 1), "stream", args),
                                  seen.append, hooks.launch_exit_hook, *args)
    launch.launch_compiled(kernel, (5,), (x, 40), {"A": 1, "B": True}, {"num_warps": 4})
    assert len(kernel.jit_calls) == 2  # 40 % 16 != 0: another specialization
    assert len(launch._COMPILED) == 2


def test_a_constexpr_left_out_launches_with_its_default(monkeypatch):
    """A constexpr the caller does not pass takes its default on every launch, as Triton's
    binder gave it on the first; one without a default is named."""
    monkeypatch.setattr(launch, "_COMPILED", {})
    monkeypatch.setattr(launch, "_current_stream", lambda index: "stream")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kernel = _Kernel(["x", "A", "B"], defaults={"B": 240})
    x = torch.zeros(4)
    for _ in range(2):
        launch.launch_compiled(kernel, (3,), (x,), {"A": 1}, {})
    ((compiled, tail, _),) = launch._COMPILED.values()
    assert tail == (1, 240) and compiled.calls[0][-3:] == (x, 1, 240)
    with pytest.raises(TypeError, match="no value for A"):
        launch._constexpr_tail(kernel, 1, {})


def test_a_plan_cache_keeps_the_compiled_kernel_per_device(monkeypatch):
    """With a caller's cache (an Sm90Plan's), no key is built: the compiled kernel and the
    constexprs that follow the arguments are kept per device, and the global cache is
    left alone."""
    monkeypatch.setattr(launch, "_COMPILED", {})
    monkeypatch.setattr(launch, "_current_stream", lambda index: "stream")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "launch_key", None)  # would fail if called
    kernel = _Kernel(["x", "n", "A"])
    cache = {}
    for n in (32, 40):  # the plan's key decides what may share it, not this function
        launch.launch_compiled(kernel, (3,), (torch.zeros(2), n), {"A": 7}, {}, cache=cache)
    assert len(kernel.jit_calls) == 1 and list(cache) == [0] and launch._COMPILED == {}
    compiled, tail, direct = cache[0]
    assert tail == (7,) and compiled.calls[0][-2:] == (40, 7)
    assert direct is None  # this stand-in's run is not Triton's launcher


def test_plan_key_is_finer_than_the_launch_key():
    """sm90 launch plans (and the compiled kernels they keep) are looked up by
    :func:`flashscope.families.sm90_fwd.plan_key`. Two launches with one plan key must have one
    :func:`flashscope.launch.launch_key` (which the test above holds to Triton's binder),
    else a plan would run a kernel specialized for another problem."""
    plain = launch.plain_params(kernels.load("attention_fwd_sm90")._attn_fwd_sm90)
    seen = {}
    problems = itertools.product(
        [(1, 1, 1), (2, 4, 2), (3, 16, 16), (2, 6, 2)],
        [(1, 1), (16, 32), (100, 77), (90, 77), (300, 200)],
        [64, 128], [torch.float16, torch.bfloat16], [False, True], [None, 0, 1],
        [0.125, 0.3], [G, G.replace(BLOCK_M=192, BLOCK_N=64, PINGPONG=True),
                       G.replace(SPLIT_KV=True)])
    for (B, H, Hkv), (Nq, Nk), D, dtype, causal, lse_offset, scale, cfg in problems:
        q = torch.randn(B, H, Nq, D, dtype=dtype)
        k, v = (torch.randn(B, Hkv, Nk, D, dtype=dtype) for _ in range(2))
        out = torch.empty_like(q)
        lse = None
        if lse_offset is not None:
            lse = torch.empty(B * H * Nq + 4)[lse_offset:lse_offset + B * H * Nq].view(
                B, H, Nq)
        grid, args, consts = _call(q, k, v, out, lse, causal, scale, cfg)
        key = launch.launch_key(args, consts, launch.vendor_options(cfg, "nvidia"), 0, plain)
        pkey = sm90_fwd.plan_key(q, k, v, out, lse, causal, scale, cfg, 0)
        assert seen.setdefault(pkey, key) == key, (B, H, Hkv, Nq, Nk, D, dtype, causal)
    assert len(set(seen.values())) > 1


def test_plans_are_built_once_per_geometry(monkeypatch):
    """The second launch of a geometry reuses its plan: new tensors only change the
    descriptors' bases and the log-sum-exp slot; another stride or alignment is another
    plan."""
    monkeypatch.setattr(sm90_fwd, "_PLANS", {})
    q, k, v = (torch.randn(2, 4, 100, 64, dtype=torch.bfloat16) for _ in range(3))
    first = _call(q, k, v, torch.empty_like(q), None, True, 0.125, G)
    q2, k2, v2 = (torch.randn(2, 4, 100, 64, dtype=torch.bfloat16) for _ in range(3))
    out2, lse2 = torch.empty_like(q2), torch.empty(2, 4, 100)
    grid, args, consts = _call(q2, k2, v2, out2, lse2, True, 0.125, G)
    assert len(sm90_fwd._PLANS) == 2  # lse given: RETURN_LSE differs
    _call(q2, k2, v2, out2, None, True, 0.125, G)
    assert len(sm90_fwd._PLANS) == 2
    assert [d.base for d in args[:4]] == [q2, k2, v2, out2] and args[4] is lse2
    assert [d.strides for d in args[:4]] == [d.strides for d in first[1][:4]]
    assert grid == first[0] and consts == dict(first[2], RETURN_LSE=True)
    bnhd = torch.randn(2, 100, 4, 64, dtype=torch.bfloat16).transpose(1, 2)
    _call(bnhd, k, v, torch.empty_like(bnhd), None, True, 0.125, G)
    assert len(sm90_fwd._PLANS) == 3


@pytest.mark.gpu
def test_direct_launches_match_float64_reference(device):
    """Fresh tensors (new data pointers) on the second and third call of a shape take the
    direct path; a key length that is not a multiple of 16 compiles anew."""
    if device != "cuda" or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    before = dict(launch.LAUNCHES)
    for Nk in (96, 96, 96, 90, 90):
        run_case(device, B=2, H=4, Hkv=2, Nq=130, Nk=Nk, D=64, causal=True,
                 dtype=torch.bfloat16, bnhd=True, cfg=G, with_lse=True)
    after = launch.LAUNCHES
    assert after["direct"] + after["kept"] - before["direct"] - before["kept"] >= 3
    if compat.direct_launcher_supported():
        assert after["kept"] - before["kept"] >= 3


def _driver_or_skip():
    try:
        from triton.backends.nvidia import driver
    except ImportError as e:  # pragma: no cover - the wheel ships the NVIDIA backend
        pytest.skip(f"no NVIDIA backend: {e}")
    return driver


def test_direct_launcher_passes_what_tritons_launcher_passes(monkeypatch):
    """With Triton 3.6's launcher (its descriptor wrapper around the C launcher), the
    direct launcher hands the C launcher the same arguments as ``run`` does, while it
    encodes each descriptor once per (position, base address): a tensor at an address
    seen before reuses its encoding, another address is encoded anew, and the kept
    encodings start over past DESCRIPTORS_MAX. On other releases it declines (None)."""
    driver = _driver_or_skip()
    encoded = []

    def fake_encode(arg, meta):  # the real one asks the CUDA driver
        encoded.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), meta["m"]), *arg.shape, *arg.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", fake_encode, raising=False)
    seen = []
    signature = {"a": "tensordesc<bf16[1, 1, 64, 64]>", "n": "i32",
                 "b": "tensordesc<bf16[1, 1, 64, 64]>", "c": "constexpr"}
    inner = driver.wrap_handle_tensordesc(lambda *a: seen.append(a), signature,
                                          [{"m": 1}, {"m": 2}])
    run = type("Run", (), dict(launch=staticmethod(inner), global_scratch_size=0,
                               profile_scratch_size=0, launch_cooperative_grid=False,
                               launch_pdl=False))()
    compiled = type("Compiled", (), dict(run=run, packed_metadata=(4, 1, 0), function=99))()
    go = compat.direct_launcher(compiled)
    if not compat.direct_launcher_supported():
        assert go is None
        return
    xs = [torch.empty(1, 2, 64, 64, dtype=torch.bfloat16) for _ in range(3)]

    def call(x, y):
        return (sm90_fwd.tma_desc4(x, "a", 64), 7, sm90_fwd.tma_desc4(y, "b", 64), None)

    for x, y in ((xs[0], xs[1]), (xs[2], xs[1]), (xs[0], xs[1]), (xs[1], xs[0])):
        c = call(x, y)
        go((3, 1, 1), 5, c, "md", "enter", "exit")
        inner(3, 1, 1, 5, 99, False, False, None, None, (4, 1, 0), "md", "enter", "exit", *c)
        assert seen[-1] == seen[-2] and seen[-1][13] == ("map", x.data_ptr(), 1)
    # run encodes 8 times; the direct launcher 5: (0, x0) (2, x1) (0, x2) (0, x1) (2, x0)
    assert len(encoded) == 8 + 5
    monkeypatch.setattr(compat, "DESCRIPTORS_MAX", 2)
    go = compat.direct_launcher(compiled)
    for x in xs:
        go((1, 1, 1), 0, call(x, x), None, None, None)
    assert len(encoded) == 13 + 6  # no kept encoding reused: each call starts over


def test_divider_is_exact_below_2_31():
    """n // d = (n (m + 2^31)) >> k for the Hopper kernel's work-tile divisions: every
    divisor up to 4096 and random ones to 2^31 - 1, at the ends of the range and at
    random numerators; m + 2^31 must fit 32 bits (the kernel's 32 x 32 -> 64 multiply)."""
    import random

    rng = random.Random()
    divisors = list(range(1, 4097)) + [rng.randrange(1, 2 ** 31) for _ in range(500)]
    for d in divisors:
        m, k = launch.divider(d)
        assert 0 <= m < 2 ** 31 and 31 <= k <= 62, d
        for n in [0, 1, d - 1, d, d + 1, 2 * d - 1, 2 ** 31 - 1, 2 ** 31 - 1 - d] + \
                [rng.randrange(0, 2 ** 31) for _ in range(50)]:
            if 0 <= n < 2 ** 31:
                assert (n * (m + 2 ** 31)) >> k == n // d, (n, d)
    with pytest.raises(ValueError, match="divider: d must be >= 1"):
        launch.divider(0)


def test_backward_plan_key_is_finer_than_its_launch_keys():
    """The backward's three launches keep their compiled kernels per
    :func:`flashscope.families.triton_bwd.plan_key`: two calls with one plan key must give
    each launch one :func:`flashscope.launch.launch_key`, else a cached kernel would run a
    specialization built for another problem."""
    from flashscope.families import triton_bwd
    from flashscope.families.triton_bwd import TritonBwdConfig

    mod = kernels.load(triton_bwd.MODULE)
    seen = {}
    cfgs = [TritonBwdConfig(), TritonBwdConfig(16, 32, 32, 16, 4, 1, PRE_BLOCK=16)]
    problems = itertools.product(
        [(1, 1, 1), (2, 4, 2), (3, 16, 16)], [(1, 1), (16, 32), (100, 77), (90, 77)],
        [64, 80], [torch.float16, torch.bfloat16], [Mask.of(False), Mask.of(True)],
        [0.125, 0.3], [False, True], cfgs)
    for (B, H, Hkv), (Nq, Nk), D, dtype, mask, scale, bnhd, cfg in problems:
        if bnhd:  # (B, N, H, D) storage seen as (B, H, N, D)
            q = torch.randn(B, Nq, H, D, dtype=dtype).transpose(1, 2)
        else:
            q = torch.randn(B, H, Nq, D, dtype=dtype)
        k, v = (torch.randn(B, Hkv, Nk, D, dtype=dtype) for _ in range(2))
        dout, out, dq = (torch.randn_like(q) for _ in range(3))
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        lse = torch.empty(B, H, Nq)
        delta = torch.empty(B, H, Nq)
        pkey = triton_bwd.plan_key(dout, q, k, v, out, lse, dq, dk, dv, mask=mask,
                                   scale=scale, cfg=cfg)
        keys = tuple(
            launch.launch_key(args, consts, launch.vendor_options(cfg, "nvidia"), 0,
                              launch.plain_params(getattr(mod, name)))
            for name, _, args, consts, _ in triton_bwd.calls(
                dout, q, k, v, out, lse, delta, dq, dk, dv, mask=mask, scale=scale,
                cfg=cfg).values())
        assert seen.setdefault(pkey, keys) == keys, (B, H, Hkv, Nq, Nk, D, dtype, bnhd)
    assert len(set(seen.values())) > 1


def _outcome(q, k, v, is_causal, window, align, softcap, scale, enable_gqa):
    """What attention's checks make of a call: the refusal's type and text, or the mask,
    scale and problem its launch is configured from."""
    from flashscope import api

    try:
        api._check_inputs(q, k, v, enable_gqa, scale)
        mask = api.check_mask_args(is_causal, window, align, softcap)
    except (TypeError, ValueError) as e:
        return type(e).__name__, str(e)
    sc = launch.default_scale(q.shape[-1]) if scale is None else float(scale)
    return mask, sc, api.problem_of(q, k, mask, "sm90"), \
        sm90_fwd.tensors_problem(q, k, v, sc)


def test_equal_call_keys_mean_equal_checks_and_configs(monkeypatch):
    """A bound launch is reused for calls whose :func:`flashscope.api._call_key` is equal,
    without the checks: so equal keys must mean the same refusal or the same mask, scale
    and problem. Calls that differ in one thing each (shapes of any tensor, strides, dtype,
    alignment, keywords of another type with equal values)."""
    from flashscope import api

    # CPU tensors stand for GPU ones here (the device is a key part of its own)
    monkeypatch.setattr(api, "check_device", lambda name, dev: None)
    bf, h = torch.bfloat16, torch.float16
    base = torch.randn(2, 4, 100, 64, dtype=bf)
    store = torch.randn(2 * 4 * 100 * 64 + 8, dtype=bf)
    tensors = {
        "plain": (base, base.clone(), base.clone()),
        "fresh": tuple(torch.randn(2, 4, 100, 64, dtype=bf) for _ in range(3)),
        "bnhd": tuple(torch.randn(2, 100, 4, 64, dtype=bf).transpose(1, 2) for _ in range(3)),
        # v of another shape with k's strides: only the shapes tell them apart
        "v-short": (base, base.clone(), base.clone()[:, :, :99]),
        "v-fp16": (base, base.clone(), base.to(h)),
        "k-gqa": (base, torch.randn(2, 2, 100, 64, dtype=bf), torch.randn(2, 2, 100, 64,
                                                                         dtype=bf)),
        "k-odd": (base, torch.randn(2, 3, 100, 64, dtype=bf), torch.randn(2, 3, 100, 64,
                                                                         dtype=bf)),
        "unaligned": (store[2:2 + base.numel()].view_as(base), base.clone(), base.clone()),
        "d-odd": tuple(torch.randn(2, 4, 100, 72, dtype=bf) for _ in range(3)),
        "v-d": (base, base.clone(), base.clone()[..., :32]),
    }
    keywords = [dict(), dict(is_causal=True), dict(is_causal=1), dict(scale=1), dict(scale=1.0),
                dict(scale=True), dict(scale=float("inf")), dict(window=(8, 0)),
                dict(window=[8, 0]), dict(window=(8.0, 0)), dict(window=(8, None)),
                dict(align="bottom_right"), dict(softcap=30), dict(softcap=30.0),
                dict(softcap=True), dict(enable_gqa=True)]
    seen = {}
    for (name, (q, k, v)), kw in itertools.product(tensors.items(), keywords):
        args = dict(is_causal=False, window=None, align="top_left", softcap=None,
                    scale=None, enable_gqa=False)
        args.update(kw)
        key = api._call_key(q, k, v, **args, config=None, return_lse=False)
        if key is None:
            continue
        got = _outcome(q, k, v, **args)
        if key in seen:
            assert seen[key][1] == got, f"{name} {kw} and {seen[key][0]}: one key"
        seen[key] = ((name, kw), got)
    # every call its own key but the fresh tensors of "plain"'s geometry
    assert len(seen) == (len(tensors) - 1) * len(keywords)
    refused = sum(isinstance(o[0], str) for _, o in seen.values())
    assert 0 < refused < len(seen), refused


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["default", "triton-fwd"])
def test_bound_launches_match_float64_reference(device, family):
    """Calls without gradients: the first call of a geometry is checked, configured and
    bound; later calls on fresh tensors of that geometry take the bound launch and
    still match the float64 reference with every element written (GQA, (B, N, H, D)
    views, causal and not, the log-sum-exp); a call the checks refuse is refused after
    one with the same tensors was bound."""
    import flashscope
    from flashscope import TritonFwdConfig, api
    from flashscope.testing.inputs import make_qkv, nan_allocations
    from flashscope.testing.reference import ERROR_BOUND, reference_attention, rel_error

    from .test_forward import reference_lse

    if device != "cuda":
        pytest.skip("bound launches are for GPU tensors")
    cfg = None if family == "default" else TritonFwdConfig(BLOCK_M=64, BLOCK_N=32,
                                                           num_warps=4, num_stages=2)
    for causal, with_lse in ((False, False), (True, True)):
        keys = set(api._BOUND)
        for call in range(3):
            q, k, v = make_qkv(device, 2, 4, 130, 96, 64, Hkv=2, dtype=torch.bfloat16,
                               bnhd=True)
            with nan_allocations():  # every element the launch leaves unwritten: NaN
                got = flashscope.attention(q, k, v, is_causal=causal, enable_gqa=True,
                                           config=cfg, return_lse=with_lse)
            out, lse = got if with_lse else (got, None)
            ref = reference_attention(q, k, v, is_causal=causal)
            assert not torch.isnan(out).any(), f"call {call}: unwritten output elements"
            assert out.stride() == q.stride()
            assert rel_error(out, ref) <= ERROR_BOUND[q.dtype], f"call {call}"
            if with_lse:
                ref_lse = reference_lse(q, k, is_causal=causal, scale=0.125)
                assert (lse.double().cpu() - ref_lse.cpu()).abs().max() < 2e-3
            assert len(set(api._BOUND) - keys) == 1, "one bound launch per geometry"
    with pytest.raises(TypeError, match="is_causal"):
        flashscope.attention(q, k, v, is_causal=1, enable_gqa=True, config=cfg)
    with pytest.raises(TypeError, match="scale"):
        flashscope.attention(q, k, v, scale=True, enable_gqa=True, config=cfg)
    with pytest.raises(ValueError, match="heads"):
        flashscope.attention(q, k, v, is_causal=True, config=cfg)


@pytest.mark.gpu
def test_bound_records_serve_differentiable_calls(device):
    """One call key serves calls with and without gradients: after an inference call has
    bound the key, differentiable calls on fresh tensors of its geometry (the forward
    with the log-sum-exp, then the backward with the record's config) match the float64
    gradients, and the record stays the one bound first."""
    import flashscope
    from flashscope import api
    from flashscope.testing.inputs import make_qkv

    from .test_backward import check_grads, reference_grads

    if device != "cuda":
        pytest.skip("bound records are for GPU tensors")
    q, k, v = make_qkv(device, 2, 4, 130, 96, 64, Hkv=2, dtype=torch.float16, bnhd=True)
    flashscope.attention(q, k, v, is_causal=True, enable_gqa=True)
    keys = set(api._BOUND)
    for call in range(3):
        q, k, v = (t.detach().requires_grad_() for t in make_qkv(
            device, 2, 4, 130, 96, 64, Hkv=2, dtype=torch.float16, bnhd=True))
        out = flashscope.attention(q, k, v, is_causal=True, enable_gqa=True)
        assert out.requires_grad
        dout = torch.randn_like(out)
        out.backward(dout)
        _, *ref = reference_grads(q, k, v, dout, is_causal=True, scale=1 / 8)
        check_grads(f"call {call}", (q.grad, k.grad, v.grad), ref, torch.float16)
        assert set(api._BOUND) == keys
