"""The public attention op, mirroring ``torch.nn.functional.scaled_dot_product_attention``.

Validation lives here, at the boundary: every rejected input raises a ``TypeError`` or
``ValueError`` (a :class:`~flashscope.errors.FlashscopeError`) that names the argument and
what was expected. Launching is in :mod:`flashscope.launch`; kernels in
:mod:`flashscope.kernels`.

Autograd and ``torch.compile``: the kernels are registered as the custom ops
``flashscope::attention_fwd`` (returns out and the log-sum-exp) and
``flashscope::attention_bwd`` (returns dq, dk, dv), with fake implementations for tracing
and ``register_autograd`` linking them, so a compiled model calls them without graph breaks.
Configs cross the op boundary as ``KEY=VALUE,...`` text, since custom ops take only plain
types. Calls that need neither gradients nor tracing skip the dispatcher and launch directly.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from . import launch, tuned
from .config import (AttentionBwdConfig, AttentionConfig, check_config, check_head_dim,
                     select_bwd_config, select_config)
from .errors import ConfigError, FlashscopeError, UnknownTargetError
from .targets import get_target

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def device_target(device: torch.device) -> Optional[str]:
    """Target name (``sm90``, ``gfx942``) of a CUDA/ROCm device, or None (CPU/interpreter
    or a GPU missing from the tables)."""
    if device.type != "cuda" or launch.interpreting():
        return None
    return _gpu_target(launch.device_index(device))


@functools.lru_cache(maxsize=None)
def _gpu_target(index: int) -> Optional[str]:
    """device_target of CUDA/ROCm device ``index``, asked of the driver once per process
    (it is on every default-config call)."""
    device = torch.device("cuda", index)
    if torch.version.hip:
        name = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    else:
        major, minor = torch.cuda.get_device_capability(device)
        name = f"sm{major}{minor}"
    try:
        return get_target(name).name
    except UnknownTargetError:
        return None


def _check_inputs(query, key, value, enable_gqa: bool, scale):
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise FlashscopeError(f"{name}: expected rank 4 (B, H, N, D), got shape "
                                  f"{tuple(t.shape)} (rank {t.dim()})")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: expected dtype float16 or bfloat16, got {t.dtype}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key, value: expected one dtype, got {query.dtype}, "
                        f"{key.dtype}, {value.dtype}")
    if not (query.device == key.device == value.device):
        raise FlashscopeError(f"query, key, value: expected one device, got {query.device}, "
                              f"{key.device}, {value.device}")
    dev = query.device
    if dev.type == "cpu" and not launch.interpreting():
        raise FlashscopeError(
            "query: CPU tensors run only under Triton's interpreter (set TRITON_INTERPRET=1 "
            "before importing flashscope); otherwise pass CUDA/ROCm tensors")
    if dev.type not in ("cpu", "cuda"):
        raise FlashscopeError(f"query: expected a CUDA/ROCm tensor, got device {dev}")
    B, H, Nq, D = query.shape
    if key.shape != value.shape:
        raise FlashscopeError(f"key, value: expected the same shape, got {tuple(key.shape)} "
                              f"and {tuple(value.shape)}")
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
    try:
        check_head_dim(D)
    except ConfigError as e:
        raise FlashscopeError(f"query: {e}") from None
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
        if not math.isfinite(scale):
            raise FlashscopeError(f"scale: expected a finite number, got {scale}")


def resolve_config(config: Optional[AttentionConfig], head_dim: int, dtype: str,
                   causal: bool, device: torch.device, seq_len: int = 1) -> AttentionConfig:
    """The caller's config, checked for the device's target, or the default for it: the
    tuned entry for (target, dtype, head dim, causal, key-length class) when the sweep's
    data files have one (:func:`flashscope.tuned.lookup`), else :func:`select_config`."""
    target = device_target(device)
    if config is None:
        if target is None:
            return select_config(head_dim, dtype, causal, "sm90")
        return tuned.lookup(target, dtype, head_dim, causal, max(1, int(seq_len)))[0]
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"config: expected flashscope.AttentionConfig or None, got "
                        f"{type(config).__name__}")
    if target is None:  # interpreter: vendor knobs have no meaning, tiles still must be valid
        check_config(config.replace(maxnreg=None, waves_per_eu=None), "sm90", head_dim, dtype)
    else:
        check_config(config, target, head_dim, dtype)
    return config


#: Default configs by everything :func:`_default_config` reads: the target's tuned file
#: (its stamp), dtype, shapes, strides, alignment, mask and the scale's sign.
_DEFAULTS: dict = {}
_DEFAULTS_MAX = 256


def _default_config(q, k, v, causal: bool, scale: Optional[float] = None) -> AttentionConfig:
    """The default for these tensors: a Gluon default falls back to the target's built-in
    default where the Gluon variant cannot run (:func:`flashscope.launch.gluon_ok`), and a
    TMA default to pointer loads for layouts that have no TMA view
    (:func:`flashscope.launch.tma_view`). Remembered per geometry (``_DEFAULTS``)."""
    target = device_target(q.device)
    key = (target and tuned.file_stamp(target), launch.geometry_key(q, k, v), bool(causal),
           scale is None or scale > 0)
    return launch.remembered(_DEFAULTS, key, lambda: _choose_default(q, k, v, causal, scale),
                             _DEFAULTS_MAX)


def _choose_default(q, k, v, causal: bool, scale: Optional[float]) -> AttentionConfig:
    D, dtype = q.shape[-1], _DTYPES[q.dtype]
    cfg = resolve_config(None, D, dtype, causal, q.device, k.shape[2])
    if cfg.GLUON and not launch.gluon_ok(q, k, v, scale):
        cfg = select_config(D, dtype, causal, device_target(q.device) or "sm90")
    if cfg.TMA and not cfg.GLUON and not launch.tma_ok(q, k, v):
        cfg = cfg.replace(TMA=False, WARP_SPEC=False)
    return cfg


def config_text(cfg) -> str:
    """A config record as ``KEY=VALUE,...`` text (what the custom ops take)."""
    return ",".join(f"{k}={v}" for k, v in cfg.as_dict().items())


@functools.lru_cache(maxsize=256)
def _parse_fwd(text: str) -> AttentionConfig:
    return AttentionConfig.parse(text)


@functools.lru_cache(maxsize=256)
def _parse_bwd(text: str) -> AttentionBwdConfig:
    return AttentionBwdConfig.parse(text)


@torch.library.custom_op("flashscope::attention_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                   scale: float, config: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, Nq, D) like q, lse (B, H, Nq) fp32). ``config`` "" = the default for
    the device, resolved here, out of the compiler's sight (it may read tuned data files)."""
    cfg = _parse_fwd(config) if config else _default_config(q, k, v, is_causal, scale)
    return launch.forward(q, k, v, causal=is_causal, scale=scale, cfg=cfg, return_lse=True)


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, is_causal, scale, config):
    B, H, Nq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Nq), dtype=torch.float32)


@torch.library.custom_op("flashscope::attention_bwd", mutates_args=())
def _attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, is_causal: bool, scale: float,
                   config: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq like q, dk like k, dv like v); dk, dv summed over each GQA group."""
    return launch.backward(dout, q, k, v, out, lse, causal=is_causal, scale=scale,
                           cfg=_parse_bwd(config))


@_attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, is_causal, scale, config):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale, _ = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal, ctx.scale = is_causal, scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    D = q.shape[-1]
    cfg = select_bwd_config(D, _DTYPES[q.dtype], ctx.is_causal,
                            device_target(q.device) or "sm90")
    dq, dk, dv = _attention_bwd(dout, q, k, v, out, lse, ctx.is_causal, ctx.scale,
                                config_text(cfg))
    return dq, dk, dv, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def _through_op(*tensors) -> bool:
    """Go through the custom op when autograd or a compiler must see the call."""
    if torch.compiler.is_compiling():
        return True
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def attention(query, key, value, *, is_causal: bool = False, scale: Optional[float] = None,
              enable_gqa: bool = False, config: Optional[AttentionConfig] = None,
              return_lse: bool = False):
    """softmax(Q K^T * scale [+ causal mask]) V, like SDPA, with FlashAttention's memory.

    query (B, H, Nq, D); key, value (B, Hkv, Nk, D) with Hkv == H, or H % Hkv == 0 with
    ``enable_gqa``. fp16/bf16, any strides (e.g. a (B, N, H, D) tensor seen through
    ``.transpose(1, 2)``), D in 1..256. ``is_causal`` masks key j > query i (top-left
    aligned, as SDPA). ``scale`` defaults to 1/sqrt(D). Returns the output (B, H, Nq, D)
    laid out like ``query``; with ``return_lse`` also the natural-log row log-sum-exp
    (B, H, Nq) fp32.

    Differentiable in query, key and value (the log-sum-exp is not: it is marked
    non-differentiable). The backward uses :func:`flashscope.config.select_bwd_config`.
    """
    _check_inputs(query, key, value, enable_gqa, scale)
    D = query.shape[-1]
    causal = bool(is_causal)
    cfg = None if config is None else resolve_config(config, D, _DTYPES[query.dtype], causal,
                                                     query.device)
    sc = launch.default_scale(D) if scale is None else float(scale)
    if _through_op(query, key, value):
        text = "" if cfg is None else config_text(cfg)
        out, lse = _attention_fwd(query, key, value, causal, sc, text)
    else:
        out, lse = launch.forward(query, key, value, causal=causal, scale=sc,
                                  cfg=cfg or _default_config(query, key, value, causal, sc),
                                  return_lse=return_lse)
    return (out, lse) if return_lse else out
