"""Kernel launchers: allocation, grid and launch options. No validation here (see
:mod:`flashscope.attention`), no autograd; inputs are assumed checked.

Kernels are imported lazily so that ``TRITON_INTERPRET=1`` set by a caller before the
first launch still selects Triton's CPU interpreter.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch

from . import kernels
from .compat import CODEGEN_OPTIONS
from .config import AttentionBwdConfig, AttentionConfig, head_dim_pad
from .errors import ConfigError
from .schedule import lpt_schedule, section_heads, split_schedule

LOG2E = 1.4426950408889634
#: setmaxnreg budgets of the Gluon Hopper variant by consumer warpgroups: with a
#: 24-register producer warpgroup, two 240-register consumers fill 64K registers
#: ((2 x 240 + 24) x 128 = 64512, as in FlashAttention-3); three take 160 each and the
#: producer, then in the default partition, the remaining 32 ((3 x 160 + 32) x 128 =
#: 65536, FlashAttention-4's split). One consumer runs in the default partition alone.
SM90_CONSUMER_REGS = {1: 240, 2: 240, 3: 160}
SM90_PRODUCER_REGS = 24


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def launch_options(cfg: AttentionConfig, device: torch.device) -> dict:
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
    if vendor is not None:
        opts.update(CODEGEN_OPTIONS)
    if vendor == "amd":
        if cfg.waves_per_eu is not None:
            opts["waves_per_eu"] = cfg.waves_per_eu
    elif vendor == "nvidia" and cfg.maxnreg is not None:
        opts["maxnreg"] = cfg.maxnreg
    return opts


def forward(q, k, v, *, causal: bool, scale: float, cfg: AttentionConfig,
            return_lse: bool, out: "torch.Tensor | None" = None):
    """Run the forward kernel. q (B, H, Nq, D); k, v (B, Hkv, Nk, D); any strides.

    Returns (out, lse): out like q, lse (B, H, Nq) fp32 or None."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32) if return_lse else None
    if out.numel() == 0:
        return out, lse
    if Nk == 0:  # no keys: SDPA returns zeros (an empty sum of values); lse = log(0)
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse
    if cfg.GLUON and (interpreting() or q.device.type != "cuda"):
        raise ConfigError("GLUON=1 runs on an sm_90 GPU only: Triton's interpreter cannot run "
                          "Gluon kernels (use GLUON=0 on CPU tensors)")
    if cfg.GLUON and scale <= 0:
        raise ConfigError(f"GLUON=1 needs scale > 0 (it folds the scale into the row "
                          f"maximum), got {scale} (use GLUON=0)")
    module, function = forward_kernel(cfg)
    if cfg.GLUON:
        plan = gluon_plan(q, k, v, out, lse, causal=causal, scale=scale, cfg=cfg)
        kernel = getattr(kernels.load(module), function)
        part = plan.workspace(q)
        launch_compiled(kernel, plan.grid, plan.args(q, k, v, out, lse, part), plan.consts,
                        launch_options(cfg, q.device), cache=plan.compiled)
        plan.merge(part, out, lse)
        return out, lse
    grid, args, consts = forward_call(q, k, v, out, lse, causal=causal, scale=scale, cfg=cfg)
    if cfg.TMA and q.device.type == "cuda":
        ensure_allocator()
    kernel = getattr(kernels.load(module, interpret=interpreting()), function)
    kernel[grid](*args, **consts, **launch_options(cfg, q.device))
    return out, lse


#: Compiled kernels (with the constexprs that follow the arguments) by :func:`launch_key`,
#: filled by the first launch of each specialization; emptied when it reaches
#: :data:`_COMPILED_MAX` keys. Gluon forward plans keep their own (:class:`GluonPlan`).
_COMPILED: dict = {}
_COMPILED_MAX = 256
#: How :func:`launch_compiled` launched: ``jit`` through Triton's ``kernel[grid]``,
#: ``direct`` through a compiled handle of :data:`_COMPILED`.
LAUNCHES = {"jit": 0, "direct": 0}


def _arg_spec(a, plain: bool = False):
    """What Triton's binder specializes an argument on: a tensor's dtype and 16-byte
    alignment; an integer's == 1, % 16 == 0 and 32-bit range (only the range for a
    ``plain`` one, a parameter the kernel declares ``do_not_specialize``); a
    descriptor's type."""
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
    """Launch a Gluon kernel: the first time for a :func:`launch_key`, through
    ``kernel[grid]`` (Triton binds, specializes, compiles or loads the kernel); then as
    ``JITFunction.run`` ends, straight through the compiled kernel's launcher, with the
    launch metadata and hooks that profilers read. The binding and specialization skipped
    cost 30-45 us per call on an H100 host (docs/performance.md, run 30).

    ``cache``: a dict the caller keeps for launches that share one specialization (a
    :class:`GluonPlan`'s, whose key is finer than :func:`launch_key`); it then holds the
    compiled kernel per device, and no key is built per call. Else :data:`_COMPILED`."""
    from triton import knobs

    index = torch.cuda.current_device()
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
            # every parameter in signature order: the constexprs follow the arguments
            cache[key] = (compiled, tuple(consts[p.name] for p in kernel.params[len(args):]))
        return
    compiled, tail = hit
    call = (*args, *tail)  # the launcher takes the constexprs too, and skips them
    grid = tuple(grid) + (1, 1)
    stream = _current_stream(index)
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function,
                 compiled.packed_metadata, compiled.launch_metadata(grid, stream, *call),
                 knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *call)
    LAUNCHES["direct"] += 1


def _current_stream(index: int):
    from triton.runtime import driver

    return driver.active.get_current_stream(index)


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (the persistent grid's size); 132 (an
    H100 SXM) for meta tensors, which only compile."""
    if device.type != "cuda":
        return 132
    return _properties(device_index(device)).multi_processor_count


def device_index(device) -> int:
    """The ordinal of a CUDA device (``cuda`` alone: the current one); the key of the
    per-device caches here and in :mod:`flashscope.api`."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _properties(index: int):
    """torch's properties of CUDA device ``index``, asked of the driver once per process."""
    return torch.cuda.get_device_properties(index)


def l2_bytes(device) -> int:
    """L2 cache size of a CUDA device; 50 MB (an H100 SXM) for meta tensors."""
    if device.type != "cuda":
        return 50 << 20
    return _properties(device_index(device)).L2_cache_size


def _list_args(q, n_k: int, cfg: AttentionConfig, programs: int) -> tuple:
    """(n_m, bh, block_m, block_n, n_k, programs, section): the arguments every work
    list of :mod:`flashscope.schedule` starts with, for q's shape and device."""
    B, H, Nq, D = q.shape
    section = section_heads(n_k, D, q.element_size(), l2_bytes(q.device), B * H)
    return (triton_cdiv(Nq, cfg.BLOCK_M), B * H, cfg.BLOCK_M, cfg.BLOCK_N, n_k, programs,
            section)


def lpt_tensor(q, n_k: int, cfg: AttentionConfig, programs: int, causal: bool = True):
    """The persistent grid's work list (:func:`flashscope.schedule.lpt_schedule`) for q's
    shape on q's device, built once per shape and device and kept there."""
    return _lpt_on_device(q.device, *_list_args(q, n_k, cfg, programs), causal,
                          q.shape[2] if cfg.BALANCE else None)


@functools.lru_cache(maxsize=256)
def _lpt_on_device(device, n_m, bh, block_m, block_n, n_k, programs, section, causal, n_q):
    host = lpt_schedule(n_m, bh, block_m, block_n, n_k, programs, section, causal, n_q)
    return _on_device(host, device)


def _on_device(host, device):
    if device.type == "meta":
        return torch.empty(host.shape, dtype=torch.int32, device="meta")
    return torch.from_numpy(host.copy()).to(device)


class SplitList(NamedTuple):
    """A SPLIT_KV work list on a device: the kernel's list, the merge table (one row per
    cut block) and the number of workspace slots."""
    sched: "torch.Tensor"
    merges: "torch.Tensor"
    slots: int


def split_tensors(q, n_k: int, cfg: AttentionConfig, programs: int, causal: bool) -> SplitList:
    """The SPLIT_KV work list (:func:`flashscope.schedule.split_schedule`) for q's shape
    on q's device, built once per shape and device."""
    return _split_on_device(q.device, *_list_args(q, n_k, cfg, programs), causal,
                            q.shape[2], bool(cfg.BALANCE), bool(cfg.MASKED_FIRST))


@functools.lru_cache(maxsize=256)
def _split_on_device(device, *args) -> SplitList:
    sched, merges, slots = split_schedule(*args)
    return SplitList(_on_device(sched, device), _on_device(merges, device), slots)


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


def forward_kernel(cfg: AttentionConfig) -> tuple:
    """(module under flashscope.kernels, function) of the forward kernel a config runs:
    the Gluon Hopper variant for ``GLUON``, else the one Triton body."""
    if cfg.GLUON:
        return "attention_fwd_sm90", "_attn_fwd_sm90"
    return "attention_fwd", "_attn_fwd"


def _desc4_problem(x) -> "str | None":
    """Why ``x`` (B, H, N, D) has no rank-4 TMA descriptor, or None."""
    strides = x.stride()
    if strides[3] != 1:
        return f"a contiguous last dimension (stride 1), got strides {tuple(strides)}"
    if x.data_ptr() % 16 or not _strides_aligned(strides, x.shape, x.element_size()):
        return (f"a 16-byte aligned base and strides, got strides {tuple(strides)} at base "
                f"address % 16 = {x.data_ptr() % 16}")
    return None


@functools.lru_cache(maxsize=4096)
def _strides_aligned(strides, shape, elt: int) -> bool:
    """16-byte strides on every dimension longer than 1 (cached: asked on every call)."""
    return not any(st * elt % 16 for st, n in zip(strides[:3], shape[:3]) if n > 1)


def gluon_ok(q, k, v, scale: "float | None" = None) -> bool:
    """True when the Gluon variant can run on these tensors: head dim 64 or 128, scale > 0,
    and a rank-4 TMA descriptor for each (:func:`tma_desc4`)."""
    return (q.shape[-1] in (64, 128) and (scale is None or scale > 0)
            and not any(_desc4_problem(x) for x in (q, k, v)))


def tma_desc4(x, name: str, rows: int):
    """A rank-4 Gluon TMA descriptor over ``x`` (B, H, N, D) with its own strides, block
    (1, 1, rows, D). TMA zero-fills rows past N of each head on loads and clips them on
    stores. Raises ConfigError (naming ``name``) when TMA's alignment rules fail."""
    why = _desc4_problem(x)
    if why:
        raise ConfigError(f"{name}: GLUON=1 needs {why} (pass .contiguous())")
    return _descriptor(x, _desc4_fields(x.shape, x.stride(), x.element_size(),
                                        x.dtype == torch.bfloat16, rows))


def _descriptor(base, fields: dict):
    """A TensorDescriptor over ``base`` with the other fields given. Its constructor
    re-checks in Python what :func:`tma_desc4` and the config rules check (rank,
    alignment, block shape): a few microseconds per descriptor, four per launch. The
    fields depend only on the geometry: they are filled directly."""
    desc = object.__new__(_descriptor_class())
    desc.__dict__.update(fields, base=base)
    return desc


@functools.lru_cache(maxsize=None)
def _descriptor_class():
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor


@functools.lru_cache(maxsize=4096)
def _desc4_fields(shape, strides, elt: int, bf16: bool, rows: int) -> dict:
    """TensorDescriptor fields but the base, for :func:`tma_desc4` (read-only: shared by
    every descriptor of this geometry). Size-1 dimensions never move: they get an aligned
    stride TMA accepts."""
    strides = [st if n > 1 else 16 // elt * max(1, shape[3]) for st, n in
               zip(strides[:3], shape[:3])] + [1]
    return dict(shape=list(shape), strides=strides, block_shape=[1, 1, rows, shape[3]],
                layout=_nvmma_layout(rows, shape[3], bf16), padding="zero")


@functools.lru_cache(maxsize=None)
def _nvmma_layout(rows: int, head_dim: int, bf16: bool):
    """The shared-memory layout of a (1, 1, rows, head_dim) TMA block: built once per
    block shape, not on every launch."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim],
                                                gl.bfloat16 if bf16 else gl.float16)


def tma_view(x, name: str):
    """``(rows, cols, ROW_B, ROW_H, COL_H)`` of a 2-D TMA view of ``x`` (B, H, N, D): row
    ``b * ROW_B + h * ROW_H + n``, column ``h * COL_H``, rows ``stride(2)`` apart. Raises
    ConfigError (naming ``name``) when no such view exists or TMA's alignment rules fail.

    Two layouts have one: heads-major, where (b, h, n) collapse into one row index (the
    contiguous (B, H, N, D)), and sequence-major, where rows are (b, n) and the heads sit
    side by side within a row ((B, N, H, D) transposed, or a slice of a fused QKV).
    Size-1 dimensions never constrain."""
    B, H, N, D = x.shape
    sb, sh, sn, sd = x.stride()
    elt = x.element_size()
    why = None
    if sd != 1 and D > 1:
        why = f"its last dimension has stride {sd}, TMA needs 1"
    elif (sn * elt) % 16 or x.data_ptr() % 16:
        why = (f"TMA needs 16-byte aligned rows and base (row stride {sn * elt} B, base "
               f"address % 16 = {x.data_ptr() % 16})")
    else:
        if (H == 1 or sh == N * sn) and (B == 1 or sb == H * N * sn):
            return B * H * N, D, H * N, N, 0  # heads-major
        if (B == 1 or sb == N * sn) and (H == 1 or (sh >= D and (H - 1) * sh + D <= sn)):
            return B * N, (H - 1) * sh + D if H > 1 else D, N, 0, sh  # sequence-major
        why = (f"strides {tuple(x.stride())} are neither heads-major nor sequence-major "
               "rows")
    raise ConfigError(f"{name}: TMA=1 cannot read this tensor: {why} (use TMA=0, or pass "
                      ".contiguous())")


def tma_ok(*tensors) -> bool:
    """True when every tensor has a TMA view (:func:`tma_view`)."""
    try:
        for t in tensors:
            tma_view(t, "tensor")
    except ConfigError:
        return False
    return True


def _scratch(size: int, alignment: int, stream):
    """Global memory for descriptors that kernels build on the device (Triton asks through
    ``triton.set_allocator``; 128 bytes per TMA descriptor per program)."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


def ensure_allocator() -> None:
    """Install :func:`_scratch` as Triton's allocator unless one is set already."""
    import triton
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


class GluonPlan(NamedTuple):
    """Everything of a Gluon forward launch but the tensors' addresses: the grid, the
    descriptors' fields but their base (q, k, v, out), the scalar arguments, the
    persistent causal work list (or None), the constexprs and, once launched, the
    compiled kernel."""
    grid: tuple
    fields: tuple
    scalars: tuple
    sched: "torch.Tensor | None"
    consts: dict
    compiled: dict  #: :func:`launch_compiled`'s cache: the compiled kernel by device
    split: "SplitList | None" = None  #: SPLIT_KV: the merge table and workspace size
    merge_compiled: "dict | None" = None  #: the merge kernel's :func:`launch_compiled` cache

    def workspace(self, q) -> "torch.Tensor | None":
        """A float32 workspace for the pieces of cut blocks (SPLIT_KV), else None."""
        if self.split is None:
            return None
        rec = self.consts["BLOCK_M"] * (self.consts["HEAD_DIM"] + 2)
        return torch.empty(max(1, self.split.slots) * rec, dtype=torch.float32,
                           device=q.device)

    def args(self, q, k, v, out, lse, part=None) -> tuple:
        """The positional arguments for these tensors (``lse=None``: ``out`` in its slot;
        ``part``: the workspace of :meth:`workspace`, unread without SPLIT_KV)."""
        descs = [_descriptor(x, f) for x, f in zip((q, k, v, out), self.fields)]
        lse_arg = lse if lse is not None else out
        sched = self.sched if self.sched is not None else lse_arg  # unread without LPT
        if part is None:
            part = self.workspace(q) if self.split is not None else lse_arg
        # Trace (last): unread unless a TRACE build (scripts/gpu/trace_fwd.py)
        return (*descs, lse_arg, sched, part, *self.scalars, sched)

    def merge(self, part, out, lse) -> None:
        """Combine the cut blocks' pieces in ``part`` into ``out`` (and ``lse``): the
        second kernel of a SPLIT_KV forward (:mod:`flashscope.kernels.attention_merge`)."""
        if self.split is None or self.split.slots == 0:
            return
        H, N_Q = self.scalars[0], self.scalars[2]
        block_m, d = self.consts["BLOCK_M"], self.consts["HEAD_DIM"]
        kernel = kernels.load("attention_merge")._merge_parts
        grid = (self.split.merges.shape[0], block_m // 64)
        args = (part, self.split.merges, out, lse if lse is not None else part, H, N_Q,
                triton_cdiv(N_Q, block_m), *out.stride())
        consts = dict(HEAD_DIM=d, BLOCK_M=block_m, ROWS=64, RETURN_LSE=lse is not None)
        launch_compiled(kernel, grid, args, consts, {"num_warps": 4, **CODEGEN_OPTIONS},
                        cache=self.merge_compiled)


#: Gluon forward plans by :func:`plan_key`; emptied when it reaches :data:`_PLANS_MAX`.
_PLANS: dict = {}
_PLANS_MAX = 256


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


def plan_key(q, k, v, out, lse, causal: bool, scale: float, cfg: AttentionConfig) -> tuple:
    """What a Gluon forward launch depends on besides data addresses: the device, dtype,
    shapes and strides, each tensor's 16-byte alignment, the mask, scale and config. It
    determines every runtime argument's specialization (:func:`launch_key`: integers
    are values here, a finer key) and every constexpr, so it also keys compiled kernels."""
    return (geometry_key(q, k, v), out.stride(), out.data_ptr() % 16,
            None if lse is None else lse.data_ptr() % 16, bool(causal), float(scale), cfg)


def gluon_plan(q, k, v, out, lse, *, causal: bool, scale: float,
               cfg: AttentionConfig) -> GluonPlan:
    """The :class:`GluonPlan` of a Gluon forward launch, built on the first call of its
    :func:`plan_key` and then looked up: on short rows the host builds a launch in about
    the time the GPU runs it (docs/performance.md, runs 90-95), and the descriptor checks,
    divisions and argument lists are the same every time."""
    return remembered(_PLANS, plan_key(q, k, v, out, lse, causal, scale, cfg),
                      lambda: _build_gluon_plan(q, k, v, out, lse, causal, scale, cfg),
                      _PLANS_MAX)


def _build_gluon_plan(q, k, v, out, lse, causal, scale, cfg) -> GluonPlan:
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    n_m = triton_cdiv(Nq, cfg.BLOCK_M)
    tiles = n_m * B * H
    # a host work list: persistent causal grids, and non-causal ones with BALANCE or
    # SPLIT_KV (whose pieces may outnumber the blocks: one program per SM)
    lpt = bool(cfg.PERSISTENT and (causal or cfg.BALANCE or cfg.SPLIT_KV))
    split = bool(lpt and cfg.SPLIT_KV)
    programs = sm_count(q.device) if split else min(tiles, sm_count(q.device))
    grid = (programs if cfg.PERSISTENT else tiles,)
    fields = tuple({n: v for n, v in d.__dict__.items() if n != "base"}
                   for d in (tma_desc4(q, "query", 64), tma_desc4(k, "key", cfg.BLOCK_N),
                             tma_desc4(v, "value", cfg.BLOCK_N), tma_desc4(out, "out", 64)))
    scalars = (H, H // Hkv, Nq, Nk, B * H, scale * LOG2E,
               *divider(n_m), *divider(H), *divider(H // Hkv))
    consts = dict(HEAD_DIM=D, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                  STAGES=cfg.num_stages, K_EARLY=bool(cfg.K_EARLY),
                  IS_CAUSAL=bool(causal),
                  RETURN_LSE=lse is not None, HEAVY_FIRST=bool(causal),
                  LPT=(2 if causal or cfg.BALANCE else 1) if lpt else 0,
                  PINGPONG=bool(cfg.PINGPONG),
                  OVERLAP=int(cfg.OVERLAP), EXP2_POLY=int(cfg.EXP2_POLY),
                  RESCALE_TAU=8 if cfg.LAZY_RESCALE else 0,
                  EARLY_Q=bool(cfg.EARLY_Q), MASKED_FIRST=bool(cfg.MASKED_FIRST),
                  TRACE=0, OUT_RCP=bool(cfg.OUT_RCP), Q_REGS=bool(cfg.Q_IN_REGS),
                  JOINT_KV=bool(cfg.JOINT_KV), SPLIT=split,
                  LEAN_RELEASE=bool(cfg.LEAN_RELEASE),
                  CONSUMER_REGS=SM90_CONSUMER_REGS[cfg.BLOCK_M // 64],
                  PRODUCER_REGS=SM90_PRODUCER_REGS)
    if split:
        lists = split_tensors(q, Nk, cfg, grid[0], causal)
        return GluonPlan(grid, fields, scalars, lists.sched, consts, {}, lists, {})
    sched = lpt_tensor(q, Nk, cfg, grid[0], causal) if lpt else None
    return GluonPlan(grid, fields, scalars, sched, consts, {})


def forward_call(q, k, v, out, lse, *, causal: bool, scale: float, cfg: AttentionConfig):
    """(grid, positional args, constexpr keywords) of one ``_attn_fwd`` launch.

    The one place the forward's argument list is built (for ``cfg.GLUON``, through
    :func:`gluon_plan`): :func:`forward` launches with it and :mod:`flashscope.compile`
    binds it (on meta tensors) to compile offline exactly what a launch would.
    ``lse=None``: no log-sum-exp (``out`` is passed in its slot). With ``cfg.TMA``, the
    kernel reads Q, K and V through the views of :func:`tma_view`."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    grid = (triton_cdiv(Nq, cfg.BLOCK_M), B * H)
    if cfg.GLUON:
        plan = gluon_plan(q, k, v, out, lse, causal=causal, scale=scale, cfg=cfg)
        return plan.grid, plan.args(q, k, v, out, lse), dict(plan.consts)
    if cfg.TMA:
        views = [tma_view(x, name) for x, name in ((q, "query"), (k, "key"), (v, "value"))]
        places = tuple(x for w in views for x in w[2:])
        sizes = tuple(x for w in views for x in w[:2])
    else:
        places, sizes = (0,) * 9, (0,) * 6
    args = (q, k, v, out, lse if lse is not None else out,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), *places, *sizes,
            H, H // Hkv, Nq, Nk, scale * LOG2E)
    consts = dict(HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad(D),
                  BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                  IS_CAUSAL=bool(causal), Q_IN_REGS=bool(cfg.Q_IN_REGS),
                  RETURN_LSE=lse is not None, EVEN_N=(Nk % cfg.BLOCK_N == 0),
                  SCALE_POS=scale > 0, USE_TMA=bool(cfg.TMA),
                  WARP_SPEC=bool(cfg.WARP_SPEC), EXP2_POLY=int(cfg.EXP2_POLY),
                  HEAVY_FIRST=bool(causal), OVERLAP=bool(cfg.OVERLAP))
    return grid, args, consts


def backward(dout, q, k, v, out, lse, *, causal: bool, scale: float, cfg: AttentionBwdConfig,
             dq: "torch.Tensor | None" = None, dk: "torch.Tensor | None" = None,
             dv: "torch.Tensor | None" = None):
    """Run the backward kernels: delta = rowsum(dO * O), then dK/dV, then dQ.

    dout, q, out (B, H, Nq, D); k, v (B, Hkv, Nk, D); lse (B, H, Nq) fp32, the natural-log
    log-sum-exp the forward returned. Any strides for the tensors, lse contiguous. Returns
    (dq, dk, dv) laid out like q, k, v (or written into the given buffers)."""
    mod = kernels.load("attention_bwd", interpret=interpreting())
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
    lse = lse.contiguous()
    delta = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)
    for fn_name, grid, args, consts, opts in backward_calls(
            dout, q, k, v, out, lse, delta, dq, dk, dv, causal=causal, scale=scale,
            cfg=cfg).values():
        getattr(mod, fn_name)[grid](*args, **consts, **opts)
    return dq, dk, dv


# The preprocess (delta = rowsum(dO * O)) reads two tiles and writes a vector: memory-bound.
_PRE_OPTIONS = {"num_warps": 4, "num_stages": 1, **CODEGEN_OPTIONS}


def backward_calls(dout, q, k, v, out, lse, delta, dq, dk, dv, *, causal: bool, scale: float,
                   cfg: AttentionBwdConfig) -> dict:
    """``{name: (jit function name, grid, positional args, constexpr keywords, launch
    options)}`` for the backward's three launches, in launch order: ``bwd_preprocess``,
    ``bwd_dkdv``, ``bwd_dq``.

    The one place their argument lists are built: :func:`backward` launches with them and
    offline compilation binds them (on meta tensors, see :func:`bwd_spec`). delta and lse
    are contiguous (B, H, Nq) fp32."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    common = {"HEAD_DIM": D, "HEAD_DIM_PAD": head_dim_pad(D)}
    opts = launch_options(cfg, q.device)
    return {
        "bwd_preprocess": (
            "_attn_bwd_preprocess", (triton_cdiv(Nq, cfg.PRE_BLOCK), B * H),
            (out, dout, delta, *out.stride(), *dout.stride(), H, Nq),
            {**common, "BLOCK_M": cfg.PRE_BLOCK}, dict(_PRE_OPTIONS)),
        "bwd_dkdv": (
            "_attn_bwd_dkdv", (triton_cdiv(Nk, cfg.BLOCK_N1), B * Hkv),
            (q, k, v, dout, lse, delta, dk, dv,
             *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(),
             H, Hkv, H // Hkv, Nq, Nk, float(scale), float(scale * LOG2E)),
            {**common, "BLOCK_M1": cfg.BLOCK_M1, "BLOCK_N1": cfg.BLOCK_N1,
             "IS_CAUSAL": bool(causal), "EVEN_M": Nq % cfg.BLOCK_M1 == 0}, opts),
        "bwd_dq": (
            "_attn_bwd_dq", (triton_cdiv(Nq, cfg.BLOCK_M2), B * H),
            (q, k, v, dout, lse, delta, dq,
             *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(),
             H, H // Hkv, Nq, Nk, float(scale), float(scale * LOG2E)),
            {**common, "BLOCK_M2": cfg.BLOCK_M2, "BLOCK_N2": cfg.BLOCK_N2,
             "IS_CAUSAL": bool(causal), "EVEN_N": Nk % cfg.BLOCK_N2 == 0}, opts),
    }


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
