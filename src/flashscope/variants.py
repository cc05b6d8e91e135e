"""The kernel variants an offline build binds, and the argument lists it binds for them.

A variant is what a build takes beyond head dim, dtype and causal (:data:`VARIANT_OPTIONS`,
the extras of :func:`flashscope.compile.build`): the mask's window, alignment and logit
cap, and a packed batch. :func:`fwd_call` and :func:`bwd_call` make a registered kernel's
``call`` (:class:`flashscope.compile.KernelSpec`): its family's launch arguments, built on
meta tensors of the problem by the family itself (``call``/``calls``), so an offline build
binds exactly what a launch passes.
"""

from __future__ import annotations

from typing import Callable

from .errors import FlashscopeError
from .families import Problem, family
from .masks import Mask
from .targets import get_target

#: Build options of a kernel variant beyond head dim, dtype and causal (``build``'s
#: extras): the mask's ``window`` (left, right), ``align`` and ``softcap``, ``varlen``
#: (a packed batch, :class:`flashscope.launch.Packed`), and ``page``: the keys a page of
#: the paged decoding kernel's cache (its table reads depend on how pages and key tiles
#: divide; the other kernels read no pages).
VARIANT_OPTIONS = ("window", "align", "softcap", "varlen", "page")


def no_pages(page, kernel: str) -> None:
    """FlashscopeError naming ``--page`` when a kernel that reads no paged cache gets one."""
    if page is not None:
        raise FlashscopeError(f"--page {page}: {kernel} reads no paged cache (decode_paged "
                              "does)")


def variant_mask(causal: bool, window=None, align: str = "top_left", softcap=None) -> Mask:
    """The :class:`~flashscope.masks.Mask` of a build's variant options."""
    return Mask.of(causal, window, align, softcap)


def variant_problem(target, dtype: str, head_dim: int, causal: bool, window=None,
                    align: str = "top_left", softcap=None, varlen: bool = False,
                    page=None) -> Problem:
    """The :class:`~flashscope.families.base.Problem` a variant poses on
    :data:`flashscope.compile.DEFAULT_PROBLEM`'s lengths (what picks the ``fwd`` family
    and the default)."""
    from .compile import DEFAULT_PROBLEM

    mask = variant_mask(causal, window, align, softcap)
    _, _, _, n_q, n_k = DEFAULT_PROBLEM
    lengths = (None, None) if varlen else (n_q, n_k)
    return Problem(get_target(target).name, dtype, head_dim, causal, n_q, n_k,
                   varlen=bool(varlen), **mask.problem_fields(*lengths))


def _meta_tensors(problem, head_dim, dtype, *shapes):
    import torch

    dt = getattr(torch, _TORCH_DTYPES[dtype])
    return [torch.empty(s, dtype=dt, device="meta") for s in shapes]


def _variant_tensors(problem, head_dim, dtype, varlen: bool, *shapes):
    """Meta tensors of ``shapes`` (B, heads, N, D), or with ``varlen`` their packed views
    (1, heads, B N, D), and the :class:`~flashscope.launch.Packed` batch of B sequences
    of the problem's lengths (None without ``varlen``)."""
    import torch

    from .launch import Packed

    if not varlen:
        return _meta_tensors(problem, head_dim, dtype, *shapes), None
    B, _, _, Nq, Nk = problem
    packed = _meta_tensors(problem, head_dim, dtype,
                           *[(1, h, B * n, d) for _, h, n, d in shapes])
    cu = [torch.empty(B + 1, dtype=torch.int32, device="meta") for _ in range(2)]
    return packed, Packed(cu[0], cu[1], Nq, Nk)


def fwd_call(fam_name: str) -> Callable:
    """The ``call`` of forward family ``fam_name``'s kernel."""
    def call(cfg, problem, head_dim, dtype, causal, return_lse=False, window=None,
             align="top_left", softcap=None, varlen=False, page=None):
        import torch

        from . import launch

        no_pages(page, fam_name)
        B, H, Hkv, Nq, Nk = problem
        (q, k, v, out), packed = _variant_tensors(
            problem, head_dim, dtype, varlen, (B, H, Nq, head_dim), (B, Hkv, Nk, head_dim),
            (B, Hkv, Nk, head_dim), (B, H, Nq, head_dim))
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device="meta") \
            if return_lse else None
        _, args, consts = family(fam_name).call(
            q, k, v, out, lse, mask=variant_mask(causal, window, align, softcap),
            scale=launch.default_scale(head_dim), cfg=cfg,
            **({} if packed is None else {"packed": packed}))
        return args, consts

    return call


_TORCH_DTYPES = {"float16": "float16", "bfloat16": "bfloat16"}


def bwd_call(kernel: str) -> Callable:
    """Call builder for one backward kernel: binds
    :func:`flashscope.families.triton_bwd.calls` on meta tensors of the problem. The
    preprocess and the group sum have fixed launch options of their own; they travel as
    constants so that they win over the config's."""

    def call(cfg, problem, head_dim, dtype, causal, window=None, align="top_left",
             softcap=None, varlen=False, page=None):
        import torch

        from . import launch
        from .families import triton_bwd

        no_pages(page, kernel)
        B, H, Hkv, Nq, Nk = problem
        (q, out, dout, dq, k, v, dk, dv), packed = _variant_tensors(
            problem, head_dim, dtype, varlen, *[(B, H, Nq, head_dim)] * 4,
            *[(B, Hkv, Nk, head_dim)] * 4)
        lse, delta = (torch.empty(q.shape[:3], dtype=torch.float32, device="meta")
                      for _ in range(2))
        # as a GPU runs it: the passes side by side under GQA with uneven programs (delta
        # by the preprocess), else dQ forming delta; the group sum as a group shared in two
        mask = variant_mask(causal, window, align, softcap)
        splits = 2 if kernel == "bwd_sum" else 1
        work = tuple(torch.empty((B * splits, *dk.shape[1:]), dtype=torch.float32,
                                 device="meta") for _ in range(2))
        side_by_side = kernel == "bwd_preprocess" or triton_bwd.uneven_gqa(q, k, mask, packed)
        _, _, args, consts, opts = triton_bwd.calls(
            dout, q, k, v, out, lse, delta, dq, dk, dv, mask=mask,
            scale=launch.default_scale(head_dim), cfg=cfg, packed=packed, splits=splits,
            side_by_side=side_by_side, work=work)[kernel]
        if kernel in ("bwd_preprocess", "bwd_sum"):
            consts = {**consts, **opts}
        return args, consts

    return call


def sm90_bwd_call(cfg, problem, head_dim, dtype, causal, window=None, align="top_left",
                  softcap=None, varlen=False, page=None):
    """The Hopper backward's launch arguments (:func:`flashscope.families.sm90_bwd.calls`)
    on meta tensors of the problem; its family refuses the variants it does not run."""
    import torch

    from . import launch
    from .families import sm90_bwd

    no_pages(page, sm90_bwd.KERNEL)
    B, H, Hkv, Nq, Nk = problem
    (q, out, dout, k, v, dk, dv), packed = _variant_tensors(
        problem, head_dim, dtype, varlen, *[(B, H, Nq, head_dim)] * 3,
        *[(B, Hkv, Nk, head_dim)] * 4)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="meta")
    delta, lse_rows = (torch.empty(sm90_bwd.row_shape(q, packed, cfg), dtype=torch.float32,
                                   device="meta") for _ in range(2))
    acc = torch.empty(sm90_bwd.acc_shape(q, packed, cfg), dtype=torch.float32, device="meta")
    _, _, args, consts, _ = sm90_bwd.calls(
        dout, q, k, v, out, lse, delta, acc, dk, dv,
        mask=variant_mask(causal, window, align, softcap),
        scale=launch.default_scale(head_dim), cfg=cfg, packed=packed,
        lse_rows=lse_rows)[sm90_bwd.KERNEL]
    return args, consts
