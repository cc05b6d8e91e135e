"""Launching: allocation, dispatch to the kernel family of a config, and what every family's
launch shares (launch options, the direct launch of compiled kernels, the device's SM
count and L2 size, per-geometry caches). No validation here (see :mod:`flashscope.api`), no
autograd; inputs are assumed checked.

Kernels are imported lazily so that ``TRITON_INTERPRET=1`` set by a caller before the
first launch still selects Triton's CPU interpreter.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch

from .compat import CODEGEN_OPTIONS, direct_launcher
from .families import family_of
from .masks import Mask
from .targets import get_target

LOG2E = 1.4426950408889634


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def launch_options(cfg, device: torch.device) -> dict:
    """Triton launch keywords for a config; vendor-specific knobs only where they apply."""
    if interpreting() or device.type != "cuda":
        return vendor_options(cfg, None)
    return vendor_options(cfg, "amd" if torch.version.hip else "nvidia")


def vendor_options(cfg, vendor: "str | None") -> dict:
    """num_warps/num_stages, plus ``maxnreg`` for "nvidia" or ``waves_per_eu`` for "amd"
    when the config sets them (``vendor=None``: neither, as for the interpreter). Shared by
    the launchers and offline compilation (:mod:`flashscope.compile`); compiled launches
    add :data:`flashscope.compat.CODEGEN_OPTIONS`."""
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    maxnreg, waves = getattr(cfg, "maxnreg", None), getattr(cfg, "waves_per_eu", None)
    if vendor is not None:
        opts.update(CODEGEN_OPTIONS)
    if vendor == "amd":
        if waves is not None:
            opts["waves_per_eu"] = waves
    elif vendor == "nvidia" and maxnreg is not None:
        opts["maxnreg"] = maxnreg
    return opts


class Packed(NamedTuple):
    """How a packed (variable-length) batch lies along the N axis of its tensors:
    ``cu_seqlens_q``/``cu_seqlens_k`` (B + 1,) int32 prefix sums on the tensors' device
    (sequence b holds rows cu[b] .. cu[b + 1]) and the longest sequence of each, which
    sizes the grid (the host never reads the prefix sums)."""

    cu_seqlens_q: "torch.Tensor"
    cu_seqlens_k: "torch.Tensor"
    max_seqlen_q: int
    max_seqlen_k: int
    #: (B,) int32 or None: sequence b's keys are its first seqused_k[b] + added_k (a KV
    #: cache, FlashAttention's ``seqused_k``); cu_seqlens_k then gives the room each has
    seqused_k: "torch.Tensor | None" = None
    added_k: int = 0
    #: query rows a position: a decoding call packs the G query heads of a kv head
    #: token by token, row r holding token r // G (1: every row its own position)
    row_group: int = 1
    #: a paged KV cache's (B, max pages) int32 block table (rows one apart) and keys a
    #: page: key i of sequence b is row block_table[b, i // page] page + i % page of the
    #: key tensors (None, 0: the keys lie where cu_seqlens_k says)
    block_table: "torch.Tensor | None" = None
    page: int = 0

    @property
    def batch(self) -> int:
        return self.cu_seqlens_q.shape[0] - 1


def lse_for(q, shape: tuple, return_lse: bool) -> "torch.Tensor | None":
    """The float32 log-sum-exp a forward launch writes beside its output, ``shape`` on
    ``q``'s device, or None without ``return_lse``."""
    return torch.empty(shape, device=q.device, dtype=torch.float32) if return_lse else None


def forward(q, k, v, *, mask: Mask, scale: float, cfg, return_lse: bool,
            out: "torch.Tensor | None" = None, packed: "Packed | None" = None):
    """Run the forward kernel of ``cfg``'s family. q (B, H, Nq, D); k, v (B, Hkv, Nk, D);
    any strides. Returns (out, lse): out like q, lse (B, H, Nq) fp32 or None. ``packed``:
    q (1, H, total_q, D), k, v (1, Hkv, total_k, D) hold the sequences of a packed batch
    one after another (lse (1, H, total_q)); only families with packed support run it."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if out is None:
        out = torch.empty_like(q)
    lse = lse_for(q, (B, H, Nq), return_lse)
    if out.numel() == 0:
        return out, lse
    if Nk == 0:  # no keys: SDPA returns zeros (an empty sum of values); lse = log(0)
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse
    if interpreting() and q.dtype == torch.bfloat16:
        from .testing.interpreter import patch_bf16_dot

        patch_bf16_dot()
    if packed is None:
        family_of(cfg).run(q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg)
    else:
        family_of(cfg).run(q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg, packed=packed)
    return out, lse


class BoundForward:
    """:func:`forward` for every call on tensors of one geometry (the shapes, strides,
    dtypes, devices and 16-byte alignments that fix a launch's specialization), with
    what depends on the geometry alone done once: the family's checks, the grid, the
    scalar arguments, the work list and the compiled kernel's lookup. A call then
    allocates the output, fills in the addresses and launches: on an H100 host the
    layers between ``attention`` and the launcher cost more host time than the kernel
    of a BERT-sized problem runs on the GPU. Families that keep no such state (no
    ``bind``) and empty problems run :func:`forward` each call."""

    __slots__ = ("mask", "scale", "cfg", "return_lse", "lse_shape", "go")

    def __init__(self, q, k, *, mask: Mask, scale: float, cfg, return_lse: bool):
        self.mask, self.scale, self.cfg, self.return_lse = mask, scale, cfg, return_lse
        B, H, Nq, _ = q.shape
        self.lse_shape = (B, H, Nq)
        plain = q.numel() == 0 or k.shape[2] == 0 or q.device.type != "cuda" or \
            interpreting()
        fam = family_of(cfg)
        #: None: not bound yet (on the first call, with its tensors); False: no binding
        self.go = False if plain or not hasattr(fam, "bind") else None

    def __call__(self, q, k, v):
        if self.go is False:
            return forward(q, k, v, mask=self.mask, scale=self.scale, cfg=self.cfg,
                           return_lse=self.return_lse)
        out, lse = torch.empty_like(q), lse_for(q, self.lse_shape, self.return_lse)
        if self.go is None:
            self.go = family_of(self.cfg).bind(q, k, v, out, lse, mask=self.mask,
                                               scale=self.scale, cfg=self.cfg)
        self.go(q, k, v, out, lse)
        return out, lse


def backward(dout, q, k, v, out, lse, *, mask: Mask, scale: float, cfg,
             dq: "torch.Tensor | None" = None, dk: "torch.Tensor | None" = None,
             dv: "torch.Tensor | None" = None, packed: "Packed | None" = None):
    """Run the backward of ``cfg``'s family. dout, q, out (B, H, Nq, D); k, v (B, Hkv, Nk,
    D); lse (B, H, Nq) fp32, the natural-log log-sum-exp the forward returned. Any strides
    for the tensors. Returns (dq, dk, dv) laid out like q, k, v (or written into the given
    buffers); dk, dv summed over each GQA group. ``packed``: a packed batch, as in
    :func:`forward`."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    if B * H == 0:
        return dq, dk, dv
    if Nq == 0 or Nk == 0:  # no query sees a key: every gradient is zero
        dq.zero_(), dk.zero_(), dv.zero_()
        return dq, dk, dv
    if interpreting() and q.dtype == torch.bfloat16:
        from .testing.interpreter import patch_bf16_dot

        patch_bf16_dot()
    family_of(cfg).run(dout, q, k, v, out, lse.contiguous(), dq, dk, dv, mask=mask,
                       scale=scale, cfg=cfg, packed=packed)
    return dq, dk, dv


class BoundBackward:
    """:func:`backward` for the calls of one forward geometry (one
    :class:`BoundForward`'s): what depends on the tensors' geometry alone (the
    launches' argument lists but the addresses, and their compiled kernels) is found on
    the first call for each layout of the incoming gradient and reused. The backward of
    a short problem otherwise spends more host time building its launches than its
    kernels run. Empty problems, CPU tensors and the interpreter run :func:`backward`."""

    __slots__ = ("mask", "scale", "cfg", "plans")

    def __init__(self, mask: Mask, scale: float, cfg):
        self.mask, self.scale, self.cfg = mask, scale, cfg
        #: by the incoming gradient's strides and 16-byte alignment; False: no binding
        self.plans = {}

    def __call__(self, dout, q, k, v, out, lse):
        key = (dout.stride(), lse.stride(), dout.data_ptr() % 16, q.data_ptr() % 16,
               k.data_ptr() % 16, v.data_ptr() % 16, out.data_ptr() % 16,
               lse.data_ptr() % 16)
        go = remembered(self.plans, key, lambda: self._bind(dout, q, k, v, out, lse), 16)
        if go is False:
            return backward(dout, q, k, v, out, lse, mask=self.mask, scale=self.scale,
                            cfg=self.cfg)
        return go(dout, q, k, v, out, lse)

    def _bind(self, dout, q, k, v, out, lse):
        """The family's bound backward for these tensors' geometry, or False where the
        plain :func:`backward` runs."""
        plain = q.device.type != "cuda" or interpreting() or q.numel() == 0 or \
            k.numel() == 0 or not lse.is_contiguous() or dout.shape != out.shape
        fam = family_of(self.cfg)
        if plain or not hasattr(fam, "bind"):
            return False
        return fam.bind(dout, q, k, v, out, lse, mask=self.mask, scale=self.scale,
                        cfg=self.cfg)


#: Compiled kernels (with the constexprs that follow the arguments) by :func:`launch_key`,
#: filled by the first launch of each specialization; emptied when it reaches
#: :data:`_COMPILED_MAX` keys. sm90 launch plans keep their own
#: (:class:`~flashscope.families.sm90_fwd.Sm90Plan`).
_COMPILED: dict = {}
_COMPILED_MAX = 256
#: How :func:`launch_compiled` launched: ``jit`` through Triton's ``kernel[grid]``,
#: ``direct`` through a compiled handle's ``run``, ``kept`` through a
#: :func:`~flashscope.compat.direct_launcher` with its encoded descriptors.
LAUNCHES = {"jit": 0, "direct": 0, "kept": 0}


def _arg_spec(a, plain: bool = False):
    """What Triton's binder specializes an argument on: a tensor's dtype and 16-byte
    alignment; an integer's == 1, % 16 == 0 and 32-bit range (only the range for a
    ``plain`` one, a parameter the kernel declares ``do_not_specialize``); a
    descriptor's type; None is a constexpr of its own."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool):
        return ("b", a)
    if isinstance(a, int):
        if plain:
            return ("i", -2 ** 31 <= a < 2 ** 31)
        return ("i", a == 1, a % 16 == 0, -2 ** 31 <= a < 2 ** 31)
    if isinstance(a, float):
        return ("f",)
    if hasattr(a, "block_shape"):
        return (a.base.dtype, tuple(a.block_shape), a.layout)
    if a is None:  # a constexpr None (an sm90 launch's tail descriptors without a tail)
        return (None,)
    raise TypeError(f"launch_key: no specialization rule for {type(a).__name__}")


def launch_key(args, consts: dict, options: dict, device_index: int,
               plain: frozenset = frozenset()) -> tuple:
    """A key that changes whenever Triton 3.6's ``JITFunction.run`` would pick another
    compiled kernel for these launch arguments: the device, the constexprs and options,
    and :func:`_arg_spec` of every runtime argument (``plain``: the positions of those
    the kernel does not specialize, :func:`plain_params`). Values inside a descriptor
    (base, shape, strides) are launch arguments, not part of the type."""
    return (device_index, tuple(_arg_spec(a, i in plain) for i, a in enumerate(args)),
            tuple(consts.items()), tuple(options.items()))


@functools.lru_cache(maxsize=None)
def plain_params(kernel) -> frozenset:
    """Positions of a jitted kernel's parameters declared ``do_not_specialize``."""
    return frozenset(i for i, p in enumerate(kernel.params)
                     if getattr(p, "do_not_specialize", False))


def launch_compiled(kernel, grid, args, consts: dict, options: dict, cache=None) -> None:
    """Launch a Triton or Gluon kernel on a GPU: the first time for a :func:`launch_key`, through
    ``kernel[grid]`` (Triton binds, specializes, compiles or loads the kernel); then as
    ``JITFunction.run`` ends, straight through the compiled kernel's launcher, with the
    launch metadata and hooks that profilers read. The binding and specialization skipped
    cost 30-45 us per call on an H100 host.

    ``cache``: a dict the caller keeps for launches that share one specialization (an
    :class:`~flashscope.families.sm90_fwd.Sm90Plan`'s, whose key is finer than
    :func:`launch_key`); it then holds the compiled kernel per device, and no key is built
    per call. Else :data:`_COMPILED`. Launches of a caller's cache share one geometry, so
    they go through :func:`flashscope.compat.direct_launcher`, which keeps the encoded TMA
    descriptors (``LAUNCHES["kept"]`` counts them)."""
    from triton import knobs

    index = torch.cuda.current_device()
    own = cache is not None
    if cache is None:
        cache, key = _COMPILED, launch_key(args, consts, options, index, plain_params(kernel))
    else:
        key = index
    hit = cache.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **consts, **options)
        LAUNCHES["jit"] += 1
        if compiled is not None and not hasattr(compiled, "result"):  # not an async future
            if len(cache) >= _COMPILED_MAX:
                cache.clear()
            cache[key] = (compiled, _constexpr_tail(kernel, len(args), consts),
                          direct_launcher(compiled) if own else None)
        return
    compiled, tail, direct = hit
    call = (*args, *tail)  # the launcher takes the constexprs too, and skips them
    grid = tuple(grid) + (1, 1)
    stream = _current_stream(index)
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if _silent(enter) and _silent(leave):
        metadata = enter = leave = None
    else:
        metadata = compiled.launch_metadata(grid, stream, *call)
    if direct is not None:
        direct(grid[:3], stream, call, metadata, enter, leave)
        LAUNCHES["kept"] += 1
        return
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function,
                 compiled.packed_metadata, metadata, enter, leave, *call)
    LAUNCHES["direct"] += 1


def _constexpr_tail(kernel, n_args: int, consts: dict) -> tuple:
    """The values of the parameters that follow the arguments (the constexprs), in
    signature order, as the launcher takes them: one the caller left out has its default,
    which ``kernel[grid]`` gave it on the first launch."""
    import inspect

    tail = []
    for p in kernel.params[n_args:]:
        if p.name in consts:
            tail.append(consts[p.name])
            continue
        default = getattr(p, "default", inspect.Parameter.empty)
        if default is inspect.Parameter.empty:
            raise TypeError(f"{getattr(kernel, '__name__', kernel)}: no value for {p.name}")
        tail.append(default)
    return tuple(tail)


def _silent(hook) -> bool:
    """Whether a launch hook calls nothing: None, or an empty chain (Triton 3.6 keeps its
    hooks as chains, empty unless a profiler adds one, and builds the launch metadata
    for them on every launch; the launcher skips None)."""
    return hook is None or getattr(hook, "calls", None) == []


def launch_jit(kernel, grid, args, consts: dict, options: dict, device, cache=None) -> None:
    """Launch a Triton kernel: through :func:`launch_compiled` on a GPU (Triton's own
    binding costs about as much host time as a short kernel runs, three times over in the
    backward; ``cache`` as there), through ``kernel[grid]`` under the interpreter."""
    if device.type == "cuda" and not interpreting():
        launch_compiled(kernel, grid, args, consts, options, cache=cache)
    else:
        kernel[grid](*args, **consts, **options)


def _current_stream(index: int):
    from triton.runtime import driver

    return driver.active.get_current_stream(index)


def device_target(device) -> "str | None":
    """The target record's name (``sm90``, ``gfx942``) of a CUDA/ROCm device, or None (CPU,
    meta, the interpreter, or a GPU missing from the tables)."""
    if device.type != "cuda" or interpreting():
        return None
    return _gpu_target(device_index(device))


def device_name(device) -> str:
    """The name the driver gives a CUDA/ROCm device ("NVIDIA H200"), "" where there is
    none (CPU, meta, the interpreter): rules that differ between products of one target
    (:attr:`~flashscope.families.base.Problem.device`) read it."""
    if device.type != "cuda" or interpreting():
        return ""
    return _gpu_name(device_index(device))


@functools.lru_cache(maxsize=None)
def _gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=None)
def _gpu_target(index: int) -> "str | None":
    """device_target of CUDA/ROCm device ``index``, asked of the driver once per process
    (it is on every default-config call)."""
    from .errors import UnknownTargetError

    if torch.version.hip:
        name = torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    else:
        major, minor = torch.cuda.get_device_capability(index)
        name = f"sm{major}{minor}"
    try:
        return get_target(name).name
    except UnknownTargetError:
        return None


#: the target whose table answers for devices that are not GPUs (meta tensors only compile)
DEFAULT_TARGET = "sm90"


def sm_count(device) -> int:
    """Streaming multiprocessors (CUs on AMD) of a device: the persistent grid's size. For
    meta tensors, which only compile, the target table's product (an H100 SXM for sm90)."""
    if device.type != "cuda":
        return get_target(DEFAULT_TARGET).units
    return _properties(device_index(device)).multi_processor_count


def early_launch(device) -> bool:
    """Whether kernels on ``device`` may be launched with programmatic stream
    serialization (Triton's ``launch_pdl``; their EARLY builds wait for the kernel before
    them in their first instruction): an NVIDIA GPU of compute capability 9.0 or more,
    not the interpreter."""
    if device.type != "cuda" or interpreting() or torch.version.hip:
        return False
    return _properties(device_index(device)).major >= 9


def device_index(device) -> int:
    """The ordinal of a CUDA device (``cuda`` alone: the current one); the key of the
    per-device caches here and in :mod:`flashscope.api`."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _properties(index: int):
    """torch's properties of CUDA device ``index``, asked of the driver once per process."""
    return torch.cuda.get_device_properties(index)


def l2_bytes(device) -> int:
    """L2 cache size of a device; for meta tensors the target table's."""
    if device.type != "cuda":
        return get_target(DEFAULT_TARGET).l2_bytes
    return _properties(device_index(device)).L2_cache_size


@functools.lru_cache(maxsize=1024)
def divider(d: int) -> tuple:
    """(m - 2^31, k) with n // d = (n m) >> k for every 0 <= n < 2^31: the Hopper
    kernel's divisions of work-tile indices by values fixed per launch, as a multiply
    (Granlund and Montgomery, 1994). With l = ceil(log2 d), m = floor(2^(31 + l) / d) + 1
    and k = 31 + l: m d exceeds 2^k by at most d <= 2^l, which keeps the quotient exact
    below 2^31, and 2^31 <= m < 2^32, so m - 2^31 is an int32 argument."""
    if d < 1:
        raise ValueError(f"divider: d must be >= 1, got {d}")
    k = 31 + (d - 1).bit_length()
    return (1 << k) // d + 1 - (1 << 31), k


def geometry_key(q, k, v) -> tuple:
    """The device, dtype, shapes, strides and 16-byte alignments of Q, K and V: what the
    kernel choice and a launch's specialization read of them besides values."""
    return (q.device, q.dtype, q.shape, k.shape, q.stride(), k.stride(), v.stride(),
            q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16)


def remembered(cache: dict, key, build, most: int = 256):
    """``cache[key]``, built by ``build()`` on a miss; the cache is emptied when it holds
    ``most`` keys (a long-running process meets few geometries, a sweep many)."""
    hit = cache.get(key)
    if hit is None:
        if len(cache) >= most:
            cache.clear()
        hit = cache[key] = build()
    return hit


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
