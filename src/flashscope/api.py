"""The public attention op, mirroring ``torch.nn.functional.scaled_dot_product_attention``.

Validation lives here, at the boundary: every rejected input raises a ``TypeError`` or
``ValueError`` (a :class:`~flashscope.errors.FlashscopeError`) that names the argument and
what was expected. Launching is in :mod:`flashscope.launch`; kernels and their configs in
:mod:`flashscope.families`.

Autograd and ``torch.compile``: the kernels are registered as the custom ops
``flashscope::attention_fwd`` (returns out and the log-sum-exp) and
``flashscope::attention_bwd`` (returns dq, dk, dv), with fake implementations for tracing
and ``register_autograd`` linking them, so a compiled model calls them without graph breaks.
Configs and masks cross the op boundary as plain values (``kernel:KEY=VALUE,...`` text,
window bounds as integers with -1 for unbounded), since custom ops take only plain types.
Outside a compiler, calls skip the dispatcher and launch directly, through a
``torch.autograd.Function`` when gradients are needed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import torch

from . import launch, tuned
from .errors import ConfigError, FlashscopeError
from .families import (Knobs, Problem, default_config, family, family_of, forward_family,
                       sm90_fwd, triton_fwd)
from .families.base import check_head_dim
from .masks import ALIGNS, Mask

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def device_target(device: torch.device) -> Optional[str]:
    """Target name (``sm90``, ``gfx942``) of a CUDA/ROCm device, or None (CPU/interpreter
    or a GPU missing from the tables)."""
    return launch.device_target(device)


def check_tensors(tensors: dict, rank: int, axes: str) -> None:
    """Each of ``tensors`` ({argument name: value}) a torch.Tensor of ``rank`` (``axes``
    names its axes, e.g. "(B, H, N, D)") and dtype float16/bfloat16, all of one dtype and
    one device; else a TypeError/ValueError naming the argument."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise FlashscopeError(f"{name}: expected rank {rank} {axes}, got shape "
                                  f"{tuple(t.shape)} (rank {t.dim()})")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: expected dtype float16 or bfloat16, got {t.dtype}")
    names, ts = ", ".join(tensors), list(tensors.values())
    if len({t.dtype for t in ts}) > 1:
        raise TypeError(f"{names}: expected one dtype, got "
                        f"{', '.join(str(t.dtype) for t in ts)}")
    if len({t.device for t in ts}) > 1:
        raise FlashscopeError(f"{names}: expected one device, got "
                              f"{', '.join(str(t.device) for t in ts)}")


def check_same_shape(name_a: str, a, name_b: str, b) -> None:
    """``a`` and ``b`` of one shape (a key and its value tensor); else the error naming
    both."""
    if a.shape != b.shape:
        raise FlashscopeError(f"{name_a}, {name_b}: expected the same shape, got "
                              f"{tuple(a.shape)} and {tuple(b.shape)}")


def check_device(name: str, dev: torch.device) -> None:
    """A GPU (CUDA/ROCm), or the CPU under Triton's interpreter; else the error naming
    ``name``."""
    if dev.type == "cpu" and not launch.interpreting():
        raise FlashscopeError(
            f"{name}: CPU tensors run only under Triton's interpreter (set TRITON_INTERPRET=1 "
            "before importing flashscope); otherwise pass CUDA/ROCm tensors")
    if dev.type not in ("cpu", "cuda"):
        raise FlashscopeError(f"{name}: expected a CUDA/ROCm tensor, got device {dev}")


def check_head_dim_of(name: str, head_dim: int) -> None:
    """The head dim of argument ``name`` in the kernels' range; else the error naming it."""
    try:
        check_head_dim(head_dim)
    except ConfigError as e:
        raise FlashscopeError(f"{name}: {e}") from None


def check_scale(scale) -> None:
    """None, or a finite number; else the error naming ``scale``."""
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
        if not math.isfinite(scale):
            raise FlashscopeError(f"scale: expected a finite number, got {scale}")


def _check_inputs(query, key, value, enable_gqa: bool, scale):
    check_tensors({"query": query, "key": key, "value": value}, 4, "(B, H, N, D)")
    check_device("query", query.device)
    B, H, Nq, D = query.shape
    check_same_shape("key", key, "value", value)
    Bk, Hkv, Nk, Dk = key.shape
    if Bk != B:
        raise FlashscopeError(f"key: batch {Bk} does not match query's batch {B}")
    if Dk != D:
        raise FlashscopeError(f"key/value: head dim {Dk} does not match query's head dim {D}")
    if Hkv != H:
        if not enable_gqa:
            raise FlashscopeError(f"key: {Hkv} heads against query's {H}; pass enable_gqa=True "
                                  "for grouped-query attention")
        if Hkv == 0 or H % Hkv != 0:
            raise FlashscopeError(f"key: {Hkv} kv heads must divide query's {H} heads (GQA)")
    check_head_dim_of("query", D)
    check_scale(scale)


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return value


def check_mask_args(is_causal, window, align, softcap=None) -> Mask:
    """The :class:`~flashscope.masks.Mask` of ``attention``'s mask keywords, or a
    TypeError/ValueError naming the one that is wrong."""
    causal = _flag("is_causal", is_causal)
    if not isinstance(align, str) or align not in ALIGNS:
        raise FlashscopeError(f"align: expected one of {', '.join(map(repr, ALIGNS))}, got "
                              f"{align!r}")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(
            softcap, (int, float)) or not math.isfinite(softcap) or softcap <= 0):
        raise FlashscopeError(f"softcap: expected a finite number > 0 or None, got "
                              f"{softcap!r}")
    return Mask.of(causal, window, align, None if softcap is None else float(softcap))


def problem_of(q, k, mask: Mask, target: Optional[str]) -> Problem:
    """The :class:`~flashscope.families.base.Problem` these tensors and mask pose
    (``target`` None: the interpreter, answered with sm90's tables)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    return Problem(target or "sm90", _DTYPES[q.dtype], D, mask.causal, Nq, Nk, B * H,
                   group=max(1, H // max(1, k.shape[1])), **mask.problem_fields(Nq, Nk))


def resolve_config(config, head_dim: int, dtype: str, device: torch.device,
                   what: str = "config", kinds: tuple = ("triton-fwd", "sm90-fwd")) -> Knobs:
    """The caller's config, checked for the device's target (on the interpreter the
    vendor caps are ignored, the rest must hold for sm90). Never changed: honoured as
    given or refused with the limit it breaks."""
    if not isinstance(config, Knobs):
        raise TypeError(f"{what}: expected a kernel config record ("
                        f"{', '.join(family(k).Config.__name__ for k in kinds)}) or None, got "
                        f"{type(config).__name__}")
    if config.KERNEL not in kinds:
        raise FlashscopeError(f"{what}: a {config.KERNEL} config is not one of "
                              f"{', '.join(kinds)}")
    fam = family_of(config)
    target = device_target(device)
    if target is None:
        checked = config
        if hasattr(config, "maxnreg"):
            checked = config.replace(maxnreg=None, waves_per_eu=None)
        fam.check(checked, "sm90", head_dim, dtype)
    else:
        fam.check(config, target, head_dim, dtype)
    return config


#: Default configs by everything :func:`_default_config` reads: the target's tuned file
#: (its stamp), dtype, shapes, strides, alignment, mask and the scale's sign.
_DEFAULTS: dict = {}
_DEFAULTS_MAX = 256


def _default_config(q, k, v, mask: Mask, scale: float) -> Knobs:
    """The default for these tensors: the first forward family that accepts the problem
    (:func:`flashscope.families.forward_family`), its tuned entry or rule; the sm90 kernel
    gives way to the portable one on tensors it cannot read (no TMA descriptor, scale <= 0).
    Remembered per geometry (``_DEFAULTS``)."""
    target = device_target(q.device)
    key = (target and tuned.file_stamp(target), launch.geometry_key(q, k, v), mask,
           scale > 0)
    return launch.remembered(_DEFAULTS, key, lambda: _choose_default(q, k, v, mask, scale),
                             _DEFAULTS_MAX)


def _choose_default(q, k, v, mask: Mask, scale: float) -> Knobs:
    target = device_target(q.device)
    problem = problem_of(q, k, mask, target)
    if target is None:  # the interpreter runs the portable kernel only
        return triton_fwd.select(problem)
    return default_config(problem, tensors_family(problem, q, k, v, scale))


def tensors_family(problem: Problem, q, k, v, scale: float):
    """The forward family for ``problem`` on these (B, H, N, D) tensors: the first that
    accepts the problem (:func:`flashscope.families.forward_family`), the sm90 kernel
    giving way to the portable one on tensors it cannot read (no TMA descriptor, scale
    <= 0)."""
    fam = forward_family(problem)
    if fam is sm90_fwd and sm90_fwd.tensors_problem(q, k, v, scale):
        fam = triton_fwd
    return fam


_BACKWARD: dict = {}


def _backward_config(q, k, v, mask: Mask) -> Knobs:
    """The backward's default for these tensors (:func:`tensors_backward`), remembered
    per geometry and per PyTorch's deterministic setting (``torch.use_deterministic_
    algorithms``: the Hopper one pass sums dQ in a varying order, so it gives way to the
    two passes)."""
    target = device_target(q.device)
    exact = torch.are_deterministic_algorithms_enabled()
    return launch.remembered(
        _BACKWARD, (target, launch.geometry_key(q, k, v), mask, exact),
        lambda: tensors_backward(problem_of(q, k, mask, target), q, k, v), _DEFAULTS_MAX)


def tensors_backward(problem: Problem, q, k, v) -> Knobs:
    """The backward's default for ``problem`` on these (B, H, N, D) tensors under
    PyTorch's deterministic setting now: :func:`flashscope.families.default_backward`,
    the Hopper one pass giving way to the two passes off a GPU and on tensors it cannot
    read (no TMA descriptor)."""
    from .families import default_backward, sm90_bwd, triton_bwd

    problem = dataclasses.replace(problem,
                                  deterministic=torch.are_deterministic_algorithms_enabled())
    cfg = default_backward(problem)
    if cfg.KERNEL == sm90_bwd.KERNEL and (device_target(q.device) is None or
                                          sm90_fwd.tensors_problem(q, k, v)):
        cfg = triton_bwd.select(problem)
    return cfg


def config_text(cfg) -> str:
    """A config record as ``kernel:KEY=VALUE,...`` text (what the custom ops take)."""
    return f"{cfg.KERNEL}:{cfg.text}"


@functools.lru_cache(maxsize=256)
def parse_config_text(text: str) -> Knobs:
    kernel, _, body = text.partition(":")
    return family(kernel).Config.parse(body)


def _mask_of(is_causal: bool, left: int, right: int, bottom_right: bool,
             softcap: float) -> Mask:
    return Mask.of(is_causal, (left, right), "bottom_right" if bottom_right else "top_left",
                   softcap or None)


@torch.library.custom_op("flashscope::attention_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                   left: int, right: int, bottom_right: bool, softcap: float, scale: float,
                   config: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, Nq, D) like q, lse (B, H, Nq) fp32). ``left``/``right``: window bounds,
    -1 unbounded; ``softcap`` 0: none. ``config`` "" = the default for the device,
    resolved here, out of the compiler's sight (it may read tuned data files)."""
    mask = _mask_of(is_causal, left, right, bottom_right, softcap)
    cfg = parse_config_text(config) if config else _default_config(q, k, v, mask, scale)
    return launch.forward(q, k, v, mask=mask, scale=scale, cfg=cfg, return_lse=True)


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, is_causal, left, right, bottom_right, softcap, scale,
                        config):
    B, H, Nq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Nq), dtype=torch.float32)


@torch.library.custom_op("flashscope::attention_bwd", mutates_args=())
def _attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, is_causal: bool, left: int,
                   right: int, bottom_right: bool, softcap: float, scale: float,
                   config: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq like q, dk like k, dv like v); dk, dv summed over each GQA group."""
    mask = _mask_of(is_causal, left, right, bottom_right, softcap)
    cfg = parse_config_text(config) if config else _backward_config(q, k, v, mask)
    return launch.backward(dout, q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg)


@_attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, is_causal, left, right, bottom_right,
                        softcap, scale, config):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, is_causal, left, right, bottom_right, softcap, scale, _ = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mask_args = (is_causal, left, right, bottom_right, softcap)
    ctx.scale = scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = _attention_bwd(dout, q, k, v, out, lse, *ctx.mask_args, ctx.scale, "")
    return dq, dk, dv, None, None, None, None, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def saved_with_dout(ctx, dout) -> tuple:
    """(dout, q, k, v, out, lse) of an autograd context that saved (q, k, v, out, lse);
    a ``dout`` autograd leaves out (only the log-sum-exp was used) is zeros."""
    q, k, v, out, lse = ctx.saved_tensors
    return (torch.zeros_like(out) if dout is None else dout), q, k, v, out, lse


class _Eager(torch.autograd.Function):
    """The differentiable call outside a compiler: the launches of the two custom ops
    without the dispatcher around them (about 40-90 us of host time per op, as much as a
    short kernel runs), through the call's :class:`_Bound` record. A compiler sees the
    custom ops instead."""

    @staticmethod
    def forward(ctx, q, k, v, bound):
        out, lse = bound.forward(q, k, v, True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.bound = bound
        ctx.mark_non_differentiable(lse)
        # the log-sum-exp's gradient is never read: no zeros made and filled for it
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        dout, q, k, v, out, lse = saved_with_dout(ctx, dout)
        dq, dk, dv = ctx.bound.backward(dout, q, k, v, out, lse)
        return dq, dk, dv, None


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _window_ints(mask: Mask) -> tuple:
    return (-1 if mask.left is None else mask.left,
            -1 if mask.right is None or mask.causal else mask.right)


def attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: Optional[float] = None,
              enable_gqa: bool = False, *, window=None, align: str = "top_left",
              softcap: Optional[float] = None, config: Optional[Knobs] = None,
              return_lse: bool = False):
    """softmax(Q K^T * scale [+ mask]) V, like SDPA, with FlashAttention's memory.

    query (B, H, Nq, D); key, value (B, Hkv, Nk, D) with Hkv == H, or H % Hkv == 0 with
    ``enable_gqa``. fp16/bf16, any strides (e.g. a (B, N, H, D) tensor seen through
    ``.transpose(1, 2)``), D in 1..256. ``attn_mask`` must be None and ``dropout_p`` 0 (the
    same signature as SDPA, so the function replaces it by name; neither is computed).
    ``is_causal`` masks key j > query position p_i. ``window=(left, right)`` keeps keys
    p_i - left <= j <= p_i + right (None or a negative side: unbounded; causal clamps
    right to 0). ``align``: "top_left" (p_i = i, SDPA's) or "bottom_right" (p_i = i + Nk -
    Nq, FlashAttention's). A row that sees no key returns zeros and a log-sum-exp of -inf.
    ``softcap=c`` caps the scaled scores as c tanh(s / c) before the softmax (Gemma 2's
    logit softcapping), forward and backward.
    ``scale`` defaults to 1/sqrt(D). ``config``: a forward config record (default: chosen
    for the device and problem, :func:`flashscope.families.default_config`). Returns the
    output (B, H, Nq, D) laid out like ``query``; with ``return_lse`` also the
    natural-log row log-sum-exp (B, H, Nq) fp32.

    Differentiable in query, key and value (the log-sum-exp is marked non-differentiable);
    the backward runs the portable backward kernels with their default config.
    """
    if attn_mask is not None:
        raise FlashscopeError("attn_mask: flashscope computes masks from is_causal, window "
                              "and align; an explicit mask tensor is not supported (pass None)")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or dropout_p != 0:
        raise FlashscopeError(f"dropout_p: expected 0.0 (flashscope has no dropout), got "
                              f"{dropout_p!r}")
    _flag("enable_gqa", enable_gqa)
    _flag("return_lse", return_lse)
    compiling = torch.compiler.is_compiling()
    call_key = None
    if not compiling and _bindable(query):
        call_key = _call_key(query, key, value, is_causal, window, align, softcap, scale,
                             enable_gqa, config, return_lse)
        bound = None if call_key is None else _BOUND.get(call_key)
        if bound is not None:
            return bound(query, key, value)
    _check_inputs(query, key, value, enable_gqa, scale)
    mask = check_mask_args(is_causal, window, align, softcap)
    D = query.shape[-1]
    cfg = None if config is None else resolve_config(config, D, _DTYPES[query.dtype],
                                                     query.device)
    sc = launch.default_scale(D) if scale is None else float(scale)
    if compiling:  # the compiler sees the custom ops
        left, right = _window_ints(mask)
        text = "" if cfg is None else config_text(cfg)
        out, lse = _attention_fwd(query, key, value, mask.causal, left, right,
                                  mask.align == "bottom_right", mask.softcap or 0.0, sc, text)
        return (out, lse) if return_lse else out
    bound = _Bound(mask, sc, cfg or _default_config(query, key, value, mask, sc), return_lse)
    if call_key is not None:
        launch.remembered(_BOUND, call_key, lambda: bound, _BOUND_MAX)
    return bound(query, key, value)


class _Bound:
    """What :func:`attention` makes of the calls of one :func:`_call_key`: the mask, scale
    and config, and, built on first use, its bound forwards
    (:class:`flashscope.launch.BoundForward`; the one with the log-sum-exp also serves
    differentiable calls), the backward's default config and its bound backward
    (:class:`flashscope.launch.BoundBackward`)."""

    __slots__ = ("mask", "scale", "cfg", "return_lse", "_forwards", "_bwd_cfg", "_backward")

    def __init__(self, mask: Mask, scale: float, cfg, return_lse: bool):
        self.mask, self.scale, self.cfg, self.return_lse = mask, scale, cfg, return_lse
        self._forwards = {}  # by return_lse
        self._bwd_cfg = None
        self._backward = None

    def __call__(self, q, k, v):
        if _needs_grad(q, k, v):
            out, lse = _Eager.apply(q, k, v, self)
        else:
            out, lse = self.forward(q, k, v, self.return_lse)
        return (out, lse) if self.return_lse else out

    def forward(self, q, k, v, return_lse: bool):
        """(out, lse or None) of the forward alone."""
        bound = self._forwards.get(return_lse)
        if bound is None:
            bound = self._forwards[return_lse] = launch.BoundForward(
                q, k, mask=self.mask, scale=self.scale, cfg=self.cfg, return_lse=return_lse)
        return bound(q, k, v)

    def backward_config(self, q, k, v):
        exact = torch.are_deterministic_algorithms_enabled()
        if self._bwd_cfg is None or self._bwd_cfg[0] != exact:
            self._bwd_cfg = (exact, _backward_config(q, k, v, self.mask))
        return self._bwd_cfg[1]

    def backward(self, dout, q, k, v, out, lse):
        """(dq, dk, dv) of a differentiable call, through its bound backward
        (:class:`flashscope.launch.BoundBackward`)."""
        cfg = self.backward_config(q, k, v)
        if self._backward is None or self._backward.cfg is not cfg:
            self._backward = launch.BoundBackward(self.mask, self.scale, cfg)
        return self._backward(dout, q, k, v, out, lse)


#: :class:`_Bound` records by :func:`_call_key`: a call whose key is here was checked and
#: configured before.
_BOUND: dict = {}
_BOUND_MAX = 256


def _typed(x):
    """A key part that tells True from 1 and 1 from 1.0 (the checks refuse some of
    them)."""
    return x if x is None else (type(x), x)


def _bindable(q) -> bool:
    """Whether a call may look its record up by key: a plain CUDA tensor first (no
    subclass; the key refuses subclasses among the others)."""
    return type(q) is torch.Tensor and q.device.type == "cuda"


def call_key(tensors, window, *keywords):
    """A call's key: each tensor's device, dtype, shape, strides and 16-byte alignment
    (None for one not given), the window (a tuple or list of two, each side with its
    type) and the other parts as given; None for a tensor subclass or a part that cannot
    be a key (such calls take the whole path every time)."""
    parts = []
    for t in tensors:
        if t is None:
            parts.append(None)
            continue
        if type(t) is not torch.Tensor:
            return None
        parts.append((t.device, t.dtype, t.shape, t.stride(), t.data_ptr() % 16))
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            return None
        window = (type(window), *(_typed(w) for w in window))
    key = (*parts, window, *keywords)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _call_key(q, k, v, is_causal, window, align, softcap, scale, enable_gqa, config,
              return_lse):
    """Everything :func:`attention`'s checks and default config read
    (:func:`call_key`): the tensors' geometry, the keywords with their types, the config
    (or the tuned file its default comes from). Two calls with one key pass or fail the
    checks alike and launch alike."""
    stamp = None
    if config is None:
        target = device_target(q.device)
        stamp = target and tuned.file_stamp(target)
    return call_key((q, k, v), window, _typed(is_causal), _typed(align), _typed(softcap),
                    _typed(scale), enable_gqa, config, return_lse, stamp)
