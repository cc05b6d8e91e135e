"""flashscope.compat: the one place that names what differs between Triton releases,
checked against the Triton that is running (CI runs the oldest and the newest)."""

import types

import pytest
import triton

from flashscope import compat, kernels


def test_the_running_triton_is_a_supported_release():
    assert compat.supported(), (triton.__version__, compat.SUPPORTED)


@pytest.mark.parametrize("text,version,ok", [
    ("3.5.1", (3, 5), False), ("3.6.0", (3, 6), True), ("3.7.1", (3, 7), True),
    ("3.9.0+git1a2b3c", (3, 9), True), ("3.10.0", (3, 10), False), ("4.0.0", (4, 0), False)])
def test_versions_parse_and_bound(text, version, ok):
    assert compat.triton_version(text) == version
    assert compat.supported(text) is ok


def test_a_version_that_is_not_one_says_so():
    with pytest.raises(ValueError, match="expected MAJOR.MINOR"):
        compat.triton_version("main")


def test_tma_copies_are_this_gluons_builtins():
    """The names that exist in this release, the newer where both do (3.8); each a Gluon
    builtin (what the kernels call), and the load the one that takes a barrier."""
    from triton.experimental.gluon.language.nvidia.hopper import tma

    load, store = compat.tma_load, compat.tma_store
    if hasattr(tma, "async_load"):
        assert (load, store) == (tma.async_load, tma.async_store)
    else:
        assert (load, store) == (tma.async_copy_global_to_shared,
                                 tma.async_copy_shared_to_global)
    for fn in (load, store):
        assert getattr(fn, "__triton_builtin__", False), fn
    with pytest.raises(AttributeError, match="no attribute 'tma_copy'"):
        compat.tma_copy  # noqa: B018


def test_tma_reduction_and_barrier_build_on_this_triton():
    """``tma_reduce_add``, ``cta_barrier`` and ``smem_reinterpret`` are this release's Gluon
    builtins, and the Hopper backward that calls them builds for sm90, dense and packed,
    with its dQ reduction (UTMAREDG) and no serialized wgmma (3.9 has
    ``async_atomic_add``, ``barrier`` and ``reinterpret``, 3.6 none of them)."""
    from flashscope.families.sm90_bwd import Sm90BwdConfig
    from flashscope.isa import inspect_config

    for fn in (compat.tma_reduce_add, compat.cta_barrier, compat.smem_reinterpret):
        assert getattr(fn, "__triton_builtin__", False), fn
    for varlen in (False, True):  # dense and packed builds
        rec = inspect_config(Sm90BwdConfig(), "sm90", kernel="sm90-bwd", head_dim=64,
                             causal=True, problem=(1, 2, 2, 256, 256), occupancy=False,
                             varlen=varlen)
        assert "UTMAREDG" in rec.opcodes and rec.wgmma_serialized == 0, varlen


def test_run_keywords_are_what_jit_run_binds(monkeypatch):
    """JITFunction.run's own keywords, caught by a pre-run hook (it runs them after adding
    its keywords and before binding) with the device query stubbed: compat must add the
    same set, with the same values, or offline builds would specialize differently."""
    from triton.runtime import jit

    fn = kernels.load("attention_merge")._merge_parts
    seen = {}

    class Stop(Exception):
        pass

    def hook(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    active = types.SimpleNamespace(get_current_device=lambda: 0,
                                   get_current_stream=lambda device: 0)
    monkeypatch.setattr(jit, "driver", types.SimpleNamespace(active=active))
    monkeypatch.setattr(fn, "pre_run_hooks", [hook])
    with pytest.raises(Stop):
        fn.run(grid=(1,), warmup=True, num_warps=4, **compat.CODEGEN_OPTIONS)
    assert compat.run_keywords(fn, {"num_warps": 4, **compat.CODEGEN_OPTIONS}) == seen


def test_ptxas_is_the_one_triton_runs():
    from triton.backends.nvidia.compiler import get_ptxas

    for arch in (80, 90, 100):
        tool = compat.ptxas(arch)
        assert tool.path == get_ptxas(arch).path and tool.version
