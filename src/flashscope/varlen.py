"""Packed variable-length batches: :func:`attention_varlen`, FlashAttention's varlen layout.

The B sequences of a batch lie one after another along the first axis: q (total_q, H, D),
k and v (total_k, Hkv, D), and ``cu_seqlens_q``/``cu_seqlens_k`` (B + 1,) int32 prefix
sums say where each starts (sequence b holds rows cu[b] .. cu[b + 1]); nothing is padded.
The kernels run it with their VARLEN switch and never wait for the host to read the
prefix sums. The portable ones (:mod:`flashscope.kernels.attention_fwd`,
``attention_bwd``) read each program's sequence bounds on the device: their grid covers
``max_seqlen_q`` rows (and ``max_seqlen_k`` keys) of every sequence, and programs past a
sequence's end leave at once. On Hopper the forward is the persistent Gluon kernel
(:mod:`flashscope.kernels.attention_fwd_sm90`), whose work list of the row blocks that
hold rows a small kernel builds on the device first
(:mod:`flashscope.kernels.packed_worklist`).

What is checked, and when. Always, without reading any tensor's values: types, ranks,
dtypes (int32 prefix sums, fp16/bf16 q, k, v), devices, shapes (both prefix sums B + 1
long, Hkv dividing H, equal head dims), the max lengths (integers >= 0) and the mask
keywords. The prefix sums' values (first 0, non-decreasing, last equal to the packed
length, no sequence longer than its max length) are checked when reading them costs no
device synchronization, i.e. on CPU tensors (Triton's interpreter), or when asked with
``validate=True`` (one host synchronization per call). Unchecked on a GPU, wrong prefix
sums read or write outside their sequences' rows, and rows past ``max_seqlen_q`` of a
longer sequence are never written.

Autograd and ``torch.compile``: the custom ops ``flashscope::attention_varlen_fwd`` and
``flashscope::attention_varlen_bwd``, registered like the dense ones in
:mod:`flashscope.api` (plain values across the op boundary, fake implementations,
``register_autograd``) are what a compiler sees; eager differentiable calls go through an
``autograd.Function`` without the dispatcher, and calls that need no gradient straight to
the kernels.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import launch, tuned
from .api import (_DTYPES, _flag, _mask_of, _needs_grad, _window_ints, check_device,
                  check_head_dim_of, check_mask_args, check_same_shape, check_scale,
                  check_tensors, config_text, device_target, parse_config_text,
                  resolve_config, saved_with_dout, tensors_backward, tensors_family)
from .errors import FlashscopeError
from .families import Knobs, Problem, default_config, sm90_fwd, triton_fwd
from .launch import Packed
from .masks import Mask


def _check_packed_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          scale) -> None:
    """Everything :func:`attention_varlen` can check without reading a tensor's values."""
    check_tensors({"q": q, "k": k, "v": v}, 3, "(total, heads, head_dim)")
    check_device("q", q.device)
    check_same_shape("k", k, "v", v)
    H, Hkv = q.shape[1], k.shape[1]
    if Hkv == 0 or H % Hkv:
        raise FlashscopeError(f"k: {Hkv} kv heads must divide q's {H} heads (GQA)")
    if k.shape[2] != q.shape[2]:
        raise FlashscopeError(f"k/v: head dim {k.shape[2]} does not match q's head dim "
                              f"{q.shape[2]}")
    check_head_dim_of("q", q.shape[2])
    check_scale(scale)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name}: expected dtype int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise FlashscopeError(f"{name}: expected shape (B + 1,) with B >= 1 sequences, "
                                  f"got {tuple(cu.shape)}")
        if cu.device != q.device:
            raise FlashscopeError(f"{name}: expected q's device {q.device}, got {cu.device}")
        if cu.stride(0) != 1:
            raise FlashscopeError(f"{name}: expected a contiguous tensor (stride 1), got "
                                  f"stride {cu.stride(0)} (pass .contiguous())")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise FlashscopeError(f"cu_seqlens_q, cu_seqlens_k: expected one length (B + 1), got "
                              f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, int):
            raise TypeError(f"{name}: expected an integer, got {type(m).__name__}")
        if m < 0:
            raise FlashscopeError(f"{name}: expected an integer >= 0, got {m}")


def check_seqlens(cu: torch.Tensor, total: int, max_seqlen: int, name: str,
                  max_name: str) -> None:
    """The values of prefix sums ``cu`` (B + 1,) over a packed axis of ``total`` rows: first
    0, non-decreasing, last ``total``, no sequence longer than ``max_seqlen``. Reads the
    tensor (a host synchronization on a GPU). Raises FlashscopeError naming ``name`` (or
    ``max_name``) and the first offending place."""
    vals = cu.tolist()
    if vals[0] != 0:
        raise FlashscopeError(f"{name}: expected prefix sums starting at 0, got {vals[0]}")
    for b in range(len(vals) - 1):
        if vals[b + 1] < vals[b]:
            raise FlashscopeError(f"{name}: expected non-decreasing prefix sums, got "
                                  f"{vals[b]} then {vals[b + 1]} at index {b}")
    if vals[-1] != total:
        raise FlashscopeError(f"{name}: expected the last prefix sum to equal the packed "
                              f"length {total}, got {vals[-1]}")
    for b in range(len(vals) - 1):
        if vals[b + 1] - vals[b] > max_seqlen:
            raise FlashscopeError(f"{max_name}: {max_seqlen} is shorter than sequence {b} "
                                  f"({vals[b + 1] - vals[b]} rows, from {name})")


def _view(t: torch.Tensor) -> torch.Tensor:
    """(total, H, D) -> the (1, H, total, D) view the kernels take (no copy)."""
    return t.transpose(0, 1).unsqueeze(0)


def problem_of(q, k, mask: Mask, packed: Packed, target: Optional[str]) -> Problem:
    """The :class:`~flashscope.families.base.Problem` of a packed batch: its longest
    sequences stand for the lengths."""
    return Problem(target or "sm90", _DTYPES[q.dtype], q.shape[-1], mask.causal,
                   packed.max_seqlen_q, packed.max_seqlen_k, packed.batch * q.shape[1],
                   varlen=True, group=max(1, q.shape[1] // max(1, k.shape[1])),
                   **mask.problem_fields())


def backward_problem(q, k, mask: Mask, packed: Packed, target: Optional[str]) -> Problem:
    """The packed problem the backward's default is chosen on: the sequences' mean
    lengths (total over count, known on the host) stand for the lengths, since the rule
    between one pass and two weighs the query tiles a program visits
    (:func:`flashscope.families.sm90_bwd.prefers`). A batch of 64-1024-token sequences
    (mean 350) ran 0.84-1.00x the two passes on the one pass, which its longest (1024)
    would have chosen; mixed 128-8192 (mean 2260) 1.38-1.52x at D = 128 (H200, bf16)."""
    n = max(1, packed.batch)
    return dataclasses.replace(problem_of(q, k, mask, packed, target),
                               n_q=-(-q.shape[0] // n), n_k=-(-k.shape[0] // n))


#: Default configs by target (its tuned file's stamp), dtype, head dim, mask, longest
#: lengths, (batch x heads) and whether the Hopper kernel can read the tensors
_DEFAULTS: dict = {}


def _default_config(q, k, v, mask: Mask, packed: Packed, scale: float) -> Knobs:
    """The default forward for the packed problem: the first family that accepts it
    (:func:`flashscope.families.forward_family`) with its rule (tuned entries are measured
    on dense rows); the sm90 kernel gives way to the portable one on tensors it cannot
    read (no TMA descriptor, scale <= 0)."""
    target = device_target(q.device)
    problem = problem_of(q, k, mask, packed, target)
    if target is None:  # the interpreter runs the portable kernel only
        return launch.remembered(_DEFAULTS, (None, problem),
                                 lambda: triton_fwd.select(problem))
    fam = tensors_family(problem, _view(q), _view(k), _view(v), scale)
    return launch.remembered(_DEFAULTS, (tuned.file_stamp(target), problem, fam.KERNEL),
                             lambda: default_config(problem, fam))


def _packed(cu_q, cu_k, max_q: int, max_k: int) -> Packed:
    return Packed(cu_q, cu_k, int(max_q), int(max_k))


def _forward(q, k, v, packed: Packed, mask: Mask, scale: float, cfg, return_lse: bool):
    """(out (total_q, H, D) like q, lse (H, total_q) fp32 or None)."""
    out = torch.empty_like(q)
    _, lse = launch.forward(_view(q), _view(k), _view(v), mask=mask, scale=scale, cfg=cfg,
                            return_lse=return_lse, out=_view(out), packed=packed)
    return out, None if lse is None else lse.squeeze(0)


#: Backward defaults by the packed problem (:func:`backward_problem`), PyTorch's
#: deterministic setting and the tensors' geometry
_BACKWARD: dict = {}


def _backward_packed(dout, q, k, v, out, lse, packed: Packed, mask: Mask, scale: float,
                     cfg=None):
    """(dq like q, dk like k, dv like v) of a packed batch; ``cfg`` None: the default
    for the packed problem on these tensors (:func:`flashscope.api.tensors_backward`),
    remembered."""
    qv, kv, vv = _view(q), _view(k), _view(v)
    if cfg is None:
        problem = backward_problem(q, k, mask, packed, device_target(q.device))
        exact = torch.are_deterministic_algorithms_enabled()
        cfg = launch.remembered(_BACKWARD, (problem, exact, launch.geometry_key(qv, kv, vv)),
                                lambda: tensors_backward(problem, qv, kv, vv))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    launch.backward(_view(dout), qv, kv, vv, _view(out), lse.unsqueeze(0), mask=mask,
                    scale=scale, cfg=cfg, dq=_view(dq), dk=_view(dk), dv=_view(dv),
                    packed=packed)
    return dq, dk, dv


@torch.library.custom_op("flashscope::attention_varlen_fwd", mutates_args=())
def _varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                is_causal: bool, left: int, right: int, bottom_right: bool, softcap: float,
                scale: float, config: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (total_q, H, D) like q, lse (H, total_q) fp32); mask values as in
    ``flashscope::attention_fwd``; ``config`` "" = the default for the device."""
    mask = _mask_of(is_causal, left, right, bottom_right, softcap)
    packed = _packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    cfg = parse_config_text(config) if config else _default_config(q, k, v, mask, packed,
                                                                   scale)
    return _forward(q, k, v, packed, mask, scale, cfg, True)


@_varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     is_causal, left, right, bottom_right, softcap, scale, config):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("flashscope::attention_varlen_bwd", mutates_args=())
def _varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                is_causal: bool, left: int, right: int, bottom_right: bool, softcap: float,
                scale: float, config: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq like q, dk like k, dv like v); dk, dv summed over each GQA group."""
    mask = _mask_of(is_causal, left, right, bottom_right, softcap)
    packed = _packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    cfg = parse_config_text(config) if config else None
    return _backward_packed(dout, q, k, v, out, lse, packed, mask, scale, cfg)


@_varlen_bwd.register_fake
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, is_causal, left, right, bottom_right, softcap, scale,
                     config):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, *mask_args, scale, _ = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.lengths = (max_q, max_k)
    ctx.mask_args = tuple(mask_args)
    ctx.scale = scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = _varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.lengths,
                             *ctx.mask_args, ctx.scale, "")
    return (dq, dk, dv) + (None,) * 11


_varlen_fwd.register_autograd(_backward, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """The differentiable call outside a compiler: the launches of the two custom ops
    without the dispatcher around them (as :class:`flashscope.api._Eager` does for dense
    batches). A compiler sees the custom ops instead."""

    @staticmethod
    def forward(ctx, q, k, v, packed: Packed, mask: Mask, scale: float, cfg):
        out, lse = _forward(q, k, v, packed, mask, scale,
                            cfg or _default_config(q, k, v, mask, packed, scale), True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.packed, ctx.mask, ctx.scale = packed, mask, scale
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # the log-sum-exp's gradient is never read
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        dq, dk, dv = _backward_packed(*saved_with_dout(ctx, dout), ctx.packed, ctx.mask,
                                      ctx.scale)
        return dq, dk, dv, None, None, None, None


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                     max_seqlen_k: int, *, is_causal: bool = False,
                     scale: Optional[float] = None, window=None,
                     softcap: Optional[float] = None, align: str = "top_left",
                     return_lse: bool = False, config: Optional[Knobs] = None,
                     validate: Optional[bool] = None):
    """Attention over a packed batch of sequences of different lengths; no sequence sees
    another's keys.

    q (total_q, H, D), k and v (total_k, Hkv, D) with Hkv dividing H (grouped-query
    attention), fp16/bf16, any strides; ``cu_seqlens_q``/``cu_seqlens_k`` (B + 1,) int32
    prefix sums on q's device (sequence b: rows cu[b] .. cu[b + 1] of each), sequences
    of length 0 allowed; ``max_seqlen_q``/``max_seqlen_k`` at least the longest
    sequence of each (they size the grid). The mask keywords are :func:`flashscope.
    attention`'s (``is_causal``, ``window=(left, right)``, ``align``, ``softcap``) and
    apply to each sequence on its own lengths (bottom-right alignment offsets sequence b
    by its own Nk - Nq). A row that sees no key (e.g. of a sequence without keys)
    returns zeros and a log-sum-exp of -inf. ``scale`` defaults to 1/sqrt(D). ``config``:
    a forward config (:class:`flashscope.TritonFwdConfig`, or on Hopper
    :class:`flashscope.Sm90FwdConfig` without BALANCE and SPLIT_KV). ``validate``: check
    the prefix sums' values (module docstring; default: only where that needs no device
    synchronization).

    Returns the output (total_q, H, D) laid out like q, and with ``return_lse`` the
    natural-log row log-sum-exp (H, total_q) fp32. Differentiable in q, k and v (the
    portable backward, with its default config)."""
    _flag("is_causal", is_causal)
    _flag("return_lse", return_lse)
    if validate is not None:
        _flag("validate", validate)
    _check_packed_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          scale)
    mask = check_mask_args(is_causal, window, align, softcap)
    if validate or (validate is None and q.device.type == "cpu"
                    and not torch.compiler.is_compiling()):
        check_seqlens(cu_seqlens_q, q.shape[0], max_seqlen_q, "cu_seqlens_q", "max_seqlen_q")
        check_seqlens(cu_seqlens_k, k.shape[0], max_seqlen_k, "cu_seqlens_k", "max_seqlen_k")
    D = q.shape[-1]
    cfg = None if config is None else resolve_config(config, D, _DTYPES[q.dtype], q.device)
    if cfg is not None and cfg.KERNEL == sm90_fwd.KERNEL:
        sm90_fwd.check_packed(cfg, True)
    sc = launch.default_scale(D) if scale is None else float(scale)
    packed = _packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if torch.compiler.is_compiling():  # the compiler sees the custom ops
        left, right = _window_ints(mask)
        out, lse = _varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, mask.causal, left, right,
                               mask.align == "bottom_right", mask.softcap or 0.0, sc,
                               "" if cfg is None else config_text(cfg))
    elif _needs_grad(q, k, v):
        out, lse = _Eager.apply(q, k, v, packed, mask, sc, cfg)
    else:
        out, lse = _forward(q, k, v, packed, mask, sc,
                            cfg or _default_config(q, k, v, mask, packed, sc), return_lse)
    return (out, lse) if return_lse else out
