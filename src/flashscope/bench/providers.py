"""Attention implementations the harness can time, each registered with what it is.

A provider is a ``build(case, options) -> fn`` function registered with :func:`provider`,
which records its name, a description, the tensor layout it takes (``bhnd``: (B, H, N, D)
like SDPA; ``bnhd``: (B, N, H, D) like flash-attn), whether it has a backward and GQA,
whether it may serve as the speed baseline, and an ``available(device)`` check that returns
the reason it cannot run (None when it can). ``fn(q, k, v)`` computes the forward in that
layout and returns the output in it; backward providers return a tensor autograd can
differentiate. ``features`` names what a provider handles beyond plain causal or full
dense attention (``window``, ``softcap``, ``varlen``: a packed batch, whose tensors are
(total, H, D) for every provider); a case needing more is unsupported, with the reason.
Everything imports lazily, so listing providers never loads CUDA libraries.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..errors import FlashscopeError, unknown

Reason = Optional[str]


@dataclass(frozen=True)
class Provider:
    name: str
    description: str
    build: Callable  # (case, options: dict) -> fn(q, k, v) -> out
    layout: str = "bhnd"
    has_backward: bool = True
    gqa: bool = True
    baseline: bool = True
    available: Callable = field(default=lambda device: None)  # (torch.device) -> Reason
    supports: Callable = field(default=lambda case: None)  # (Case) -> Reason
    features: frozenset = frozenset()  # of FEATURES


REGISTRY: dict = {}
#: what a provider may handle beyond plain dense attention (:attr:`Case.needs`), and why
#: a case needing it is unsupported otherwise
FEATURES = {"window": "no sliding window", "softcap": "no logit softcap",
            "varlen": "no packed (variable-length) batches"}


def provider(name: str, *, description: str, layout: str = "bhnd", has_backward: bool = True,
             gqa: bool = True, baseline: bool = True, available=None, supports=None,
             features=(), registry: Optional[dict] = None):
    """Register ``build`` under ``name`` (in :data:`REGISTRY` unless ``registry`` is given)."""
    if layout not in ("bhnd", "bnhd"):
        raise FlashscopeError(f"provider {name}: layout {layout!r}: expected bhnd or bnhd")
    unknown_features = set(features) - set(FEATURES)
    if unknown_features:
        raise FlashscopeError(f"provider {name}: features {sorted(unknown_features)}: "
                              f"expected some of {', '.join(FEATURES)}")

    def deco(build):
        p = Provider(name, description, build, layout, has_backward, gqa, baseline,
                     available or (lambda device: None), supports or (lambda case: None),
                     frozenset(features))
        (REGISTRY if registry is None else registry)[name] = p
        return build

    return deco


def select(names: Optional[list] = None, skip: Optional[list] = None,
           registry: Optional[dict] = None) -> list:
    """The providers named by ``--only`` (all when None) minus ``--skip``, in registry order."""
    reg = REGISTRY if registry is None else registry
    for flag, group in (("--only", names or []), ("--skip", skip or [])):
        for n in group:
            if n not in reg:
                raise unknown(flag, n, reg, what="provider")
    chosen = [p for n, p in reg.items() if names is None or n in names]
    return [p for p in chosen if p.name not in (skip or [])]


# -- availability checks ---------------------------------------------------------------

def _needs_cuda(device) -> Reason:
    import torch

    if device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA GPU"
    return None


def _needs_nvidia(min_cc: int):
    def check(device) -> Reason:
        import torch

        reason = _needs_cuda(device)
        if reason:
            return reason
        if torch.version.hip:
            return "NVIDIA only (this is a ROCm GPU)"
        major, minor = torch.cuda.get_device_capability(device)
        if 10 * major + minor < min_cc:
            return f"needs compute capability >= {min_cc / 10:.1f}, this GPU is {major}.{minor}"
        return None
    return check


def _importable(module: str, attr: str, then=None):
    def check(device) -> Reason:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                return f"{e.name} not installed"
            return f"{module} not importable ({e})"
        except Exception as e:  # a broken CUDA extension, a missing shared library
            return f"{module} not importable ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
        if not hasattr(mod, attr):
            return f"{module} has no {attr}"
        return then(device) if then else None
    return check


def _flashscope_available(device) -> Reason:
    from .. import launch

    if device.type == "cpu":
        return None if launch.interpreting() else "CPU runs need TRITON_INTERPRET=1"
    return _needs_cuda(device)


def _max_head_dim(limit: int):
    return lambda case: (f"head dim {case.D} > {limit}" if case.D > limit else None)


def _causal_equal_lengths(case):
    """Causal with Nq != Nk is a different problem for some providers: PyTorch's
    FlashAttention-2 path has no kernel for it ("No available kernel"), and the flash-attn
    packages (FA2, FA4) align the causal mask bottom-right, where SDPA and flashscope align it
    top-left (query i sees keys j <= i). Seen on an H100: FA4 at Nq=65, Nk=190 differs from
    the top-left reference by a relative error of 1.0. Unsupported, not a failure. A case
    aligned bottom-right (``align``) is the flash-attn packages' own: see
    :func:`_flash_alignment`."""
    if case.masked and case.Nq != case.Nk:
        return "causal with Nq != Nk (mask alignment differs)"
    return None


def _flash_alignment(case):
    """The flash-attn packages align causal masks and windows bottom-right: a masked case
    with Nq != Nk runs there only when it asks for that alignment (flashscope takes both,
    so the comparison is like with like)."""
    if case.masked and case.Nq != case.Nk and case.align != "bottom_right":
        return "mask aligned top-left with Nq != Nk (flash-attn aligns bottom-right)"
    return None


def _window_args(case) -> tuple:
    """(left, right) of a case's window as the flash-attn packages take it: -1 for an
    unbounded side, right 0 when causal."""
    mask = case.mask()
    return (-1 if mask.left is None else mask.left, -1 if mask.right is None else mask.right)


def _all_of(*checks):
    return lambda case: next((r for c in checks if (r := c(case))), None)


# -- PyTorch SDPA, one backend forced --------------------------------------------------

# name -> (SDPBackend member, description, availability, shape support, GQA). The efficient
# backend has no GQA kernel (``enable_gqa`` dispatches away from it), as seen on an H100
# with torch 2.11.
_SDPA = {
    "sdpa-flash": ("FLASH_ATTENTION", "PyTorch SDPA, FlashAttention-2 backend forced",
                   _needs_nvidia(80), _all_of(_max_head_dim(256), _causal_equal_lengths),
                   True),
    "sdpa-efficient": ("EFFICIENT_ATTENTION",
                       "PyTorch SDPA, memory-efficient (CUTLASS) backend forced",
                       _needs_cuda, None, False),
    "sdpa-cudnn": ("CUDNN_ATTENTION", "PyTorch SDPA, cuDNN backend forced",
                   _needs_nvidia(80), _max_head_dim(256), True),
    "sdpa-math": ("MATH", "PyTorch SDPA, math backend forced (unfused; any device)",
                  None, None, True),
}


def _sdpa_supports(more):
    """SDPA's cases: ``more``, and none aligned bottom-right with Nq != Nk (its causal mask
    is top-left)."""
    def check(case):
        if case.masked and case.Nq != case.Nk and case.align == "bottom_right":
            return "mask aligned bottom-right with Nq != Nk (SDPA aligns top-left)"
        return more(case) if more else None
    return check


def _sdpa_build(backend_name: str):
    def build(case, options):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        causal, gqa = case.causal, case.gqa

        def fn(q, k, v):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
        return fn
    return build


for _name, (_backend, _desc, _avail, _supports, _gqa) in _SDPA.items():
    provider(_name, description=_desc, available=_avail, supports=_sdpa_supports(_supports),
             gqa=_gqa)(_sdpa_build(_backend))


# -- FlexAttention ---------------------------------------------------------------------

@provider("flex", description="torch FlexAttention, torch.compile'd, causal block mask",
          available=_needs_cuda)
def _flex(case, options):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # Static shapes, compiled per shape as a user would; the suite has more shapes than
    # dynamo's default recompile limit, past which it would silently run eager.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 512)
    torch._dynamo.config.accumulated_cache_size_limit = max(
        torch._dynamo.config.accumulated_cache_size_limit, 4096)
    compiled = torch.compile(flex_attention, dynamic=False)
    mask = None
    causal, gqa = case.causal, case.gqa
    state = {}

    def fn(q, k, v):
        nonlocal mask
        if causal and state.get("shape") != (q.shape[2], k.shape[2]):
            mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None,
                                     q.shape[2], k.shape[2], device=q.device)
            state["shape"] = (q.shape[2], k.shape[2])
        return compiled(q, k, v, block_mask=mask, enable_gqa=gqa)
    return fn


# -- flash-attn packages ---------------------------------------------------------------

def _first(out):
    return out[0] if isinstance(out, tuple) else out


class _PackedOffsets:
    """A packed case's cu_seqlens (int32 prefix sums of ``case.seqlens``) on the inputs'
    device, made at the first call (the validation's, before any timing) and kept."""

    def __init__(self, case):
        self.lengths = case.seqlens
        self.longest = max(case.seqlens)
        self.cu = None

    def __call__(self, device):
        if self.cu is None or self.cu.device != device:
            import itertools

            import torch

            self.cu = torch.tensor([0, *itertools.accumulate(self.lengths)],
                                   dtype=torch.int32, device=device)
        return self.cu


def _flash_call(case, dense, packed):
    """fn(q, k, v) calling a flash-attn package's ``dense(q, k, v, **kw)`` or, for a
    packed case, ``packed(q, k, v, cu, cu, longest, longest, **kw)``, with the case's
    mask as keywords (a window only when the case has one, a cap only when it caps)."""
    kw = {"causal": case.causal}
    if case.window is not None:
        kw["window_size"] = _window_args(case)
    if case.softcap is not None:
        kw["softcap"] = case.softcap
    if not case.varlen:
        return lambda q, k, v: _first(dense(q, k, v, **kw))
    offsets = _PackedOffsets(case)

    def fn(q, k, v):
        cu = offsets(q.device)
        return _first(packed(q, k, v, cu, cu, offsets.longest, offsets.longest, **kw))
    return fn


@provider("fa4", description="FlashAttention-4 (flash_attn.cute, CuTe DSL), (B, N, H, D)",
          layout="bnhd", supports=_flash_alignment, features=("window", "softcap", "varlen"),
          available=_importable("flash_attn.cute", "flash_attn_func", _needs_nvidia(90)))
def _fa4(case, options):
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    def dense(q, k, v, window_size=None, **kw):  # FA4 takes None for an unbounded side
        if window_size is not None:
            kw["window_size"] = tuple(None if w < 0 else w for w in window_size)
        return flash_attn_func(q, k, v, **kw)

    def packed(q, k, v, cu_q, cu_k, max_q, max_k, window_size=None, **kw):
        if window_size is not None:
            kw["window_size"] = tuple(None if w < 0 else w for w in window_size)
        return flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                      max_seqlen_q=max_q, max_seqlen_k=max_k, **kw)

    return _flash_call(case, dense, packed)


@provider("fa2", description="flash-attn 2 package (flash_attn.flash_attn_func), (B, N, H, D)",
          layout="bnhd", supports=_all_of(_max_head_dim(256), _flash_alignment),
          features=("window", "softcap", "varlen"),
          available=_importable("flash_attn", "flash_attn_func", _needs_nvidia(80)))
def _fa2(case, options):
    from flash_attn import flash_attn_func, flash_attn_varlen_func

    return _flash_call(case, flash_attn_func, flash_attn_varlen_func)


@provider("xformers", description="xFormers memory_efficient_attention, (B, N, H, D)",
          layout="bnhd", gqa=False,
          available=_importable("xformers.ops", "memory_efficient_attention", _needs_cuda))
def _xformers(case, options):
    import xformers.ops as xops

    bias = xops.LowerTriangularMask() if case.causal else None
    return lambda q, k, v: xops.memory_efficient_attention(q, k, v, attn_bias=bias)


# -- flashscope ------------------------------------------------------------------------

@provider("flashscope", description="flashscope.attention (default config, or --config); "
          "flashscope.attention_varlen for packed batches", baseline=False,
          available=_flashscope_available, supports=_max_head_dim(256),
          features=("window", "softcap", "varlen"))
def _flashscope(case, options):
    import flashscope

    cfg = options.get("config")
    if isinstance(cfg, str):
        from ..api import device_target
        from ..families import Problem, config_from_text

        # the problem the call itself runs: a packed batch's mask on no fixed lengths
        lengths = () if case.varlen else (case.Nq, case.Nk)
        target = device_target(__import__("torch").device(options.get("device", "cuda")))
        cfg = config_from_text(cfg, Problem(target or "sm90", case.dtype, case.D, case.causal,
                                            case.Nq, case.Nk, case.B * case.H,
                                            varlen=case.varlen,
                                            **case.mask().problem_fields(*lengths)))
    mask = dict(is_causal=case.causal, window=case.window, align=case.align,
                softcap=case.softcap)
    if case.varlen:
        offsets = _PackedOffsets(case)

        def packed(q, k, v):
            cu = offsets(q.device)
            return flashscope.attention_varlen(q, k, v, cu, cu, offsets.longest,
                                               offsets.longest, config=cfg, **mask)
        return packed
    gqa = case.gqa
    return lambda q, k, v: flashscope.attention(q, k, v, enable_gqa=gqa, config=cfg, **mask)
