"""What differs between the Triton releases flashscope supports, in one place.

flashscope runs on Triton 3.6 through 3.9 (``SUPPORTED``): the releases that torch 2.11
to 2.15 pin (torch 2.11: 3.6.0; 2.12: 3.7.0, 2.12.1 and 2.13: 3.7.1; 2.14: ~=3.8.0;
2.15: ~=3.9.0). The rest of the package names Triton's API through this module wherever
the releases differ, never by testing a version itself:

- Gluon's TMA copies (``tma_load``, ``tma_store``): ``async_copy_global_to_shared``
  and ``async_copy_shared_to_global`` up to 3.7; 3.8 adds ``async_load`` and
  ``async_store``, and 3.9 keeps only those (the old names raise). Gluon's TMA
  reduction (``tma_reduce_add``, ``cp.reduce.async.bulk.tensor ... add``): 3.6 has the
  builder's ``create_async_tma_reduce`` but no function over it (wrapped here as a
  builtin); 3.9 names it ``async_atomic_add``. A barrier across a partition's warps
  (``cta_barrier``): ``gl.thread_barrier`` in 3.6, ``gl.barrier`` in 3.9. A shared-memory
  descriptor seen with another shape and layout (``smem_reinterpret``): the
  descriptor's ``_reinterpret`` in 3.6, ``reinterpret`` in 3.9.
- The keywords ``JITFunction.run`` adds before it binds a call (:func:`run_keywords`):
  ``debug`` and ``instrumentation_mode`` everywhere, ``fpsan_homomorphic_casts`` from 3.9.
  An offline build binds with the same ones, or its options would not be a launch's.
- Which ptxas builds for an architecture (:func:`ptxas`): 3.6 to 3.8 run the CUDA 12.x
  ptxas below sm_100 and ``ptxas-blackwell`` (CUDA 13.x) from sm_100; 3.9 runs
  ``ptxas-blackwell`` from sm_90 on, so its Hopper binaries come from CUDA 13.4's ptxas.
- Floating-point contraction (:data:`CODEGEN_OPTIONS`): on by default through 3.9, which
  warns that 3.10 turns it off. Every build and launch asks for it, so the kernels' mul-add
  pairs (the softmax's ``s * c - m``) stay single FMAs on every release.

Unchanged across the range and used directly: ``ASTSource``/``GluonASTSource``,
``make_backend``, ``create_function_from_signature``, ``JITFunction._pack_args``, the
compiled kernel's ``run`` (grid, stream, function, packed metadata, launch metadata, the
two hooks, then every parameter), the Gluon layouts, ``warp_specialize`` (3.7 makes the
register list optional), ``mbarrier``, ``warpgroup_mma``, the aggregate decorator
(``aggregate``: Triton's ``triton.language.core._aggregate``, private in every release
and what Gluon's own examples use to carry constexprs into partitions), ``store_wait``
(3.8 adds ``read_only``, default True: the ``.read`` wait 3.6 emits),
``knobs.runtime.interpret``, the interpreter's ``create_dot`` (whose bf16 fault
:mod:`flashscope.testing.interpreter` mends), and the tools under
``triton/backends/nvidia/bin``. TMA descriptors gain a ``round_f32_to_tf32`` field in
3.7, with a class default, which the launch's directly filled descriptors
(:func:`flashscope.launch._descriptor`) inherit.

numpy: Triton 3.6's interpreter turns one-element arrays into Python integers, which
numpy 2.4 refuses (deprecated since 1.25); 3.7 to 3.9 run on numpy 2.4. pip cannot make
one package's pin depend on another's version, so the package asks for ``numpy<2.4``.
"""

from __future__ import annotations

import functools
import re

#: (oldest, newest) supported Triton release, as (major, minor).
SUPPORTED = ((3, 6), (3, 9))

#: Compile options every build and launch passes (see the module docstring).
CODEGEN_OPTIONS = {"enable_fp_fusion": True}


def triton_version(text: "str | None" = None) -> tuple:
    """(major, minor) of Triton (or of a version string such as ``"3.9.0+git1a2b"``)."""
    if text is None:
        import triton

        text = triton.__version__
    m = re.match(r"(\d+)\.(\d+)", text)
    if not m:
        raise ValueError(f"Triton version {text!r}: expected MAJOR.MINOR...")
    return int(m.group(1)), int(m.group(2))


def supported(text: "str | None" = None) -> bool:
    """Whether this Triton (or ``text``) is in :data:`SUPPORTED`."""
    return SUPPORTED[0] <= triton_version(text) <= SUPPORTED[1]


def __getattr__(name):
    """``tma_load(desc, coord, barrier, dest, pred=True)``: a Gluon TMA copy of a tile from
    global to shared memory that signals ``barrier``; ``tma_store(desc, coord, src)``: the
    other way. Kernels import them from here and call them as Gluon builtins. Looked up on
    first use, so importing this module does not import Gluon (whose first import patches
    ``triton.language`` under the process's interpreter mode: :mod:`flashscope.kernels`)."""
    if name == "aggregate":
        from triton.language.core import _aggregate

        return _aggregate
    if name == "tma_reduce_add":
        return _tma_reduce_add()
    if name == "smem_reinterpret":
        return _smem_reinterpret()
    if name == "cta_barrier":
        from triton.experimental.gluon import language as gl

        return getattr(gl, "barrier", None) or gl.thread_barrier
    if name in ("tma_load", "tma_store"):
        from triton.experimental.gluon.language.nvidia.hopper import tma

        if hasattr(tma, "async_load"):
            return tma.async_load if name == "tma_load" else tma.async_store
        return (tma.async_copy_global_to_shared if name == "tma_load"
                else tma.async_copy_shared_to_global)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.lru_cache(maxsize=None)
def _tma_reduce_add():
    """``tma_reduce_add(desc, coord, src)``: add a shared-memory tile into global memory at
    ``coord`` through ``desc`` (asynchronous; ``store_wait`` waits for it)."""
    from triton.experimental.gluon.language.nvidia.hopper import tma

    if hasattr(tma, "async_atomic_add"):
        return tma.async_atomic_add
    from triton._C.libtriton import ir
    from triton.experimental.gluon.language._core import builtin

    @builtin
    def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD,
                                                  tensor_desc.handle, coord, src.handle)

    return tma_reduce_add


@functools.lru_cache(maxsize=None)
def _smem_reinterpret():
    """``smem_reinterpret(desc, dtype, shape, layout)``: the same shared memory as another
    dtype, shape and layout (no data moves)."""
    from triton.experimental.gluon.language._core import builtin, shared_memory_descriptor

    method = (getattr(shared_memory_descriptor, "reinterpret", None)
              or shared_memory_descriptor._reinterpret)

    @builtin
    def smem_reinterpret(desc, dtype, shape, layout, _semantic=None):
        return method(desc, dtype, shape, layout, _semantic=_semantic)

    return smem_reinterpret


def run_keywords(fn, kwargs: dict) -> dict:
    """``kwargs`` with the keywords ``JITFunction.run`` adds before binding a call of
    ``fn`` (see the module docstring), so an offline bind specializes as a launch does."""
    from triton import knobs

    out = dict(kwargs)
    out["debug"] = out.get("debug", fn.debug) or knobs.runtime.debug
    out["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
        out["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    return out


def ptxas(arch: int):
    """Triton's handle on the ptxas that builds for ``arch`` (an SM number such as 90):
    ``.path`` and ``.version`` (e.g. "12.8")."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(arch)


#: Descriptor expansions a direct launcher keeps (by argument position and base address)
#: before it starts over.
DESCRIPTORS_MAX = 64


def _encoder(namespace: dict):
    """The descriptor encoder (``make_tensordesc_arg``) of a launcher module's namespace
    where the module has the shape :func:`direct_launcher` reads (Triton 3.6: 13 launch
    arguments before the kernel's, an encoder of (descriptor, metadata)), else None."""
    make = namespace.get("make_tensordesc_arg")
    if namespace.get("_BASE_ARGS_FORMAT_LEN") != 13 or make is None or \
            make.__code__.co_argcount != 2:
        return None
    return make


def direct_launcher_supported() -> bool:
    """Whether Triton's NVIDIA launcher has the shape :func:`direct_launcher` reads (its
    3.6 descriptor wrapper; 3.7 passes the kernel's arguments as one tuple, 3.8 changes
    the encoder's arguments)."""
    try:
        from triton.backends.nvidia import driver
    except ImportError:
        return False
    return _encoder(vars(driver)) is not None


def direct_launcher(compiled):
    """A function ``go(grid3, stream, call, metadata, enter_hook, exit_hook)`` that
    launches ``compiled`` (a compiled kernel whose launches all share one geometry: an
    sm90 launch plan's, without scratch memory) as its ``run`` would, keeping each TMA
    descriptor argument's encoded form (``make_tensordesc_arg``: the CUtensorMap the
    driver encodes, then the shape and strides) by argument position and base address;
    or None where Triton's launcher is not the one this reads.

    The launcher a Gluon kernel with host descriptors gets (Triton 3.6:
    ``wrap_handle_tensordesc``'s ``inner``) encodes every descriptor on every launch,
    about as much host time as the rest of a bound call. A descriptor's encoding depends
    on its base address and on fields that the launch plan fixes, so one made for the
    same address serves again: a model's activations come back at the addresses the
    caching allocator hands out again. Triton 3.8 changes the encoder's arguments; there
    (and for any launcher of another shape) this returns None and launches go through
    ``run``."""
    run = getattr(compiled, "run", None)
    inner = getattr(run, "launch", None)
    code = getattr(inner, "__code__", None)
    if code is None or not inner.__closure__ or getattr(run, "global_scratch_size", 1) or \
            getattr(run, "profile_scratch_size", 1):
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in inner.__closure__)))
    make = _encoder(inner.__globals__)
    if make is None or not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys():
        return None
    launcher, metas = cells["launcher"], cells["tensordesc_meta"]
    order = sorted(cells["tensordesc_indices"])
    meta_of = {i: metas[n] for n, i in enumerate(order)}
    head = (run.launch_cooperative_grid, run.launch_pdl, None, None, compiled.packed_metadata)
    function = compiled.function
    kept: dict = {}

    def go(grid, stream, call, metadata, enter_hook, exit_hook):
        final = [*grid, stream, function, *head, metadata, enter_hook, exit_hook]
        for i, a in enumerate(call):
            meta = meta_of.get(i, False)
            if meta is False:
                final.append(a)
                continue
            key = (i, a.base.data_ptr())
            enc = kept.get(key)
            if enc is None:
                if len(kept) >= DESCRIPTORS_MAX:
                    kept.clear()
                enc = kept[key] = make(a, meta)
            final += enc
        launcher(*final)

    return go
