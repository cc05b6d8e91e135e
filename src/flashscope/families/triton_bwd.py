"""The portable backward (``triton-bwd``): Triton kernels with recomputation from the
saved log-sum-exp, deterministic (no atomics): a dK/dV pass and a dQ pass, with delta =
rowsum(dO * O) formed by the dQ pass when it runs first, or by a preprocess launch when
the two passes run side by side (:mod:`flashscope.kernels.attention_bwd`).

Its record (:class:`TritonBwdConfig`), rules, defaults as data (:func:`select`) and the
argument lists of its launches (:func:`calls`).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass
from typing import ClassVar, Optional

from ..compat import CODEGEN_OPTIONS
from .base import (CAPS, DTYPE_BYTES, WARPS, Knobs, Problem, check_rules, head_dim_pad,
                   head_parts, pow2_tiles, shared_memory, stages, table_select,
                   unit_consts)

KERNEL = "triton-bwd"
MODULE = "attention_bwd"
#: the launches: name -> the kernel's function (:func:`calls` says which run, in what order)
FUNCTIONS = {"bwd_preprocess": "_attn_bwd_preprocess", "bwd_dkdv": "_attn_bwd_dkdv",
             "bwd_dq": "_attn_bwd_dq", "bwd_sum": "_attn_bwd_sum_splits"}
#: The preprocess (delta = rowsum(dO * O)) and the sum of a shared group's partial dK,
#: dV read tiles and write them back reduced: memory-bound, launched with fixed options.
PRE_OPTIONS = {"num_warps": 4, "num_stages": 1, **CODEGEN_OPTIONS}
#: The group sum's tiles: this many elements (BLOCK_N rows of the padded head dim), a
#: few per thread and share, so that a small grid still has many programs in flight.
SUM_ELEMENTS = 1024


@dataclass(frozen=True)
class TritonBwdConfig(Knobs):
    """Tile and launch knobs of the backward kernels.

    The dK/dV kernel keeps a key tile of BLOCK_N1 rows (K, V, dK, dV) and streams query
    tiles of BLOCK_M1 rows; the dQ kernel keeps a query tile of BLOCK_M2 rows (Q, dO, dQ)
    and streams key tiles of BLOCK_N2. The resident tile is the large one (as in Triton's
    fused-attention tutorial: 32/128 and 128/32), so the streamed operands are small and
    the fp32 accumulators are what fills the registers. PRE_BLOCK is the row tile of the
    delta preprocess. ``num_warps``, ``num_stages``, ``maxnreg`` and ``waves_per_eu``
    apply to both main kernels."""

    KERNEL: ClassVar[str] = KERNEL

    BLOCK_M1: int = 32
    BLOCK_N1: int = 128
    BLOCK_M2: int = 128
    BLOCK_N2: int = 32
    num_warps: int = 4
    num_stages: int = 3
    PRE_BLOCK: int = 64
    maxnreg: Optional[int] = None
    waves_per_eu: Optional[int] = None

    def _label_parts(self) -> list:
        return [f"dkdv {self.BLOCK_M1}x{self.BLOCK_N1}", f"dq {self.BLOCK_M2}x{self.BLOCK_N2}",
                f"w{self.num_warps}", f"s{self.num_stages}",
                *([] if self.PRE_BLOCK == 64 else [f"pre {self.PRE_BLOCK}"]), *self._caps()]


Config = TritonBwdConfig

def min_shared_bytes(cfg: TritonBwdConfig, head_dim: int, dtype: str = "bfloat16") -> int:
    """A lower bound on the larger kernel's shared memory, in bytes: the dK/dV kernel
    streams Q and dO tiles (BLOCK_M1 x D_pad each), the dQ kernel K and V tiles
    (BLOCK_N2 x D_pad each), with max(1, S - 1) copies in flight for S stages. The
    resident tiles may also live in shared memory; this bound leaves them out, so a
    config over the limit by it certainly cannot launch."""
    copies = max(1, cfg.num_stages - 1)
    streamed = max(cfg.BLOCK_M1, cfg.BLOCK_N2)
    return 2 * streamed * head_dim_pad(head_dim) * DTYPE_BYTES[dtype] * copies


RULES = (
    pow2_tiles("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "PRE_BLOCK"),
    WARPS,
    stages(1, 8),
    CAPS,
    shared_memory(min_shared_bytes, lambda c: f"BLOCK_M1={c.BLOCK_M1}, BLOCK_N2={c.BLOCK_N2}"),
)

#: the values a one-knob search steps along (:func:`~.base.neighbours`)
_TILES = (16, 32, 64, 128, 256)
STEPS = {"BLOCK_M1": _TILES, "BLOCK_N1": _TILES, "BLOCK_M2": _TILES, "BLOCK_N2": _TILES,
         "PRE_BLOCK": _TILES, "num_warps": (1, 2, 4, 8, 16),
         "num_stages": (1, 2, 3, 4, 5, 6, 7, 8), "maxnreg": (96, 128, 168, 232, None),
         "waves_per_eu": (1, 2, 3, 4, None)}


def check(cfg: TritonBwdConfig, target="sm90", head_dim: int = 128,
          dtype: str = "bfloat16") -> TritonBwdConfig:
    """``cfg`` unchanged if the backward can be built with it for ``target``; else
    ConfigError naming the knob and the limit it breaks."""
    return check_rules(cfg, RULES, target, head_dim, dtype)


# Defaults as data, keyed like the forward's (causal None: both). Start: Triton's
# fused-attention tutorial (32/128 for dK/dV, 128/32 for dQ). Pruned by registers and local
# memory of the sm90 cubins, bf16, read offline (no GPU), dK/dV | dQ, non-causal / causal:
#   D=64,  32/128/128/32 w8 s3: 194/252 regs, no stack | 103/127   (w4: dK/dV 48 B stack)
#   D=128, 16/128/128/32 w8 s2: 243/254 regs, no stack | 203/195   (32/128 w8 s3: 16/144 B)
#   D=256, 16/32/32/16 w8 s2:   208/245 regs, no stack | 252/254   (16/64 w8: 136/680 B)
# Then timed on an H100 (bf16, N = 4096): the smaller 32/64/64/32 with 4 warps
# and 3 stages beat every spill-free wide tile, for both head dims (TFLOP/s, non-causal /
# causal):
#   D=64:  32/64/64/32 w4 s3 349 / 316  vs 32/128/128/32 w8 s3 313 / 303   (FA2 270 / 229)
#   D=128: 32/64/64/32 w4 s3 385 / 298  vs 16/128/128/32 w8 s2 246 / 178   (FA2 290 / 251)
# D=256 on an H200 (N = 4096, non-causal / causal): 64/64/64/64 w8 s2 217 / 173 against
# the spill-free 16/32/32/16 w8 s2 at 43 / 43; it spills 80 B in dK/dV, which costs less
# than tiles too small for wgmma. Rows are widths the kernels build (:func:`select`): at
# D = 160 (128 + 32) the D <= 128 tiles read 333 / 272 against the D = 256 row's 165 / 145;
# at 192 (128 + 64) 16/64/64/16 w4 s3 286 / 234 against 186 / 167 (H100, N = 2048; both
# spill 20-28 B in dK/dV).
C = TritonBwdConfig
DEFAULTS = (
    ("sm90", 64, None, C(32, 64, 64, 32, 4, 3)),
    ("sm90", 160, None, C(32, 64, 64, 32, 4, 3)),
    ("sm90", 192, None, C(16, 64, 64, 16, 4, 3)),
    ("sm90", 256, None, C(64, 64, 64, 64, 8, 2)),
    ("nvidia", 64, None, C(32, 128, 128, 32, 8, 2)),
    ("nvidia", 128, None, C(16, 128, 128, 32, 8, 2)),
    ("nvidia", 256, None, C(16, 32, 32, 16, 8, 1)),
    ("cdna", 128, None, C(32, 64, 64, 32, 4, 1, waves_per_eu=1)),
    ("cdna", 256, None, C(16, 32, 32, 16, 4, 1, waves_per_eu=1)),
    ("rdna", 128, None, C(16, 32, 32, 16, 4, 1)),
    ("rdna", 256, None, C(16, 16, 16, 16, 4, 1)),
)
del C


def parts(head_dim: int) -> tuple:
    """(HEAD_DIM_PAD, HEAD_TAIL): the column parts the passes run ``head_dim`` as,
    :func:`~.base.head_parts`' but where a 32-column tail would hold 24 columns (D = 88 as
    64 + 32, 152 as 128 + 32): that takes a 64-column tail, or the whole padded width
    where the tail would reach it (88 as 128). Triton 3.6 built the dK/dV pass's tail
    product at those two head dims with a shared-memory address out of range
    (compute-sanitizer on an H200: an illegal address in ``dv_t``'s product at Nq = Nk =
    127; every other multiple of 8 to 256 ran clean)."""
    main, tail = head_parts(head_dim)
    if tail == 32 and head_dim - main == 24:
        whole = head_dim_pad(head_dim)
        return (main, 64) if main + 64 < whole else (whole, 0)
    return main, tail


def select(problem: Problem) -> TritonBwdConfig:
    """The default for a problem: pure, tensor-free, deterministic. Rows are keyed by the
    width the kernels build (:func:`parts`: D = 160 builds 128 + 32 columns, not 256),
    which is what sets their registers."""
    main, tail = parts(problem.head_dim)
    return table_select(DEFAULTS, KERNEL, dataclasses.replace(problem, head_dim=main + tail))


def calls(dout, q, k, v, out, lse, delta, dq, dk, dv, *, mask, scale: float,
          cfg: TritonBwdConfig, packed=None, splits: int = 1, side_by_side: bool = False,
          work=None) -> dict:
    """``{name: (function, grid, positional args, constexpr keywords, launch options)}``
    for the launches, in launch order: ``bwd_dq`` (forming delta), then ``bwd_dkdv``;
    with ``side_by_side`` (:func:`concurrent`) ``bwd_preprocess``, ``bwd_dkdv``,
    ``bwd_dq``, which :func:`_launch` runs as their names say. The one place their
    argument lists are built: :func:`run` launches them and offline compilation binds
    them (on meta tensors). delta and lse are contiguous (B, H, Nq) fp32. ``packed``: a
    :class:`~flashscope.launch.Packed` batch (VARLEN), tensors as in
    :func:`.triton_fwd.call`, lse and delta (1, H, total_q). ``splits`` > 1
    (:func:`group_splits`): ``work`` holds fp32 workspaces (B * splits, Hkv, Nk, D) of
    the group's partial sums, which dK/dV writes and a last launch, ``bwd_sum``, adds
    into dk and dv."""
    from ..launch import LOG2E, launch_options, triton_cdiv
    from .triton_fwd import packed_shape

    _, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    B, rows, keys, lengths = packed_shape(q, k, packed)
    varlen = packed is not None
    common = {"HEAD_DIM": D, "HEAD_DIM_PAD": head_dim_pad(D)}
    main, tail = parts(D)
    built = {"HEAD_DIM": D, "HEAD_DIM_PAD": main, "HEAD_TAIL": tail}
    switches = mask.switches(*lengths)
    switches.pop("GUARD")  # rows that see no key have L = -inf and every score masked
    switches["VARLEN"] = varlen
    scalars = (*mask.scalars(*lengths), *mask.cap_args(scale))
    cu = (q, q) if packed is None else (packed.cu_seqlens_q, packed.cu_seqlens_k)
    opts = launch_options(cfg, q.device)
    wk, wv = (dk, dv) if splits == 1 else work
    launches = {
        "bwd_dkdv": (
            FUNCTIONS["bwd_dkdv"], (triton_cdiv(keys, cfg.BLOCK_N1), B * splits * Hkv),
            (q, k, v, dout, lse, delta, wk, wv,
             *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *wk.stride(), *wv.stride(),
             H, Hkv, H // Hkv, splits, Nq, Nk, float(scale), float(scale * LOG2E), *scalars,
             *cu),
            {**built, "BLOCK_M1": cfg.BLOCK_M1, "BLOCK_N1": cfg.BLOCK_N1,
             "EVEN_M": not varlen and Nq % cfg.BLOCK_M1 == 0, **switches,
             **unit_consts(q, k, v, dout, wk, wv)}, opts),
        "bwd_dq": (
            FUNCTIONS["bwd_dq"], (triton_cdiv(rows, cfg.BLOCK_M2), B * H),
            (q, k, v, dout, out, lse, delta, dq,
             *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *out.stride(),
             *dq.stride(), H, H // Hkv, Nq, Nk, float(scale), float(scale * LOG2E), *scalars,
             *cu),
            {**built, "BLOCK_M2": cfg.BLOCK_M2, "BLOCK_N2": cfg.BLOCK_N2,
             "EVEN_N": not varlen and Nk % cfg.BLOCK_N2 == 0,
             "OWN_DELTA": not side_by_side, **switches,
             **unit_consts(q, k, v, dout, out, dq)}, opts),
    }
    if side_by_side:
        launches = {"bwd_preprocess": preprocess_call(out, dout, delta, cfg.PRE_BLOCK, rows,
                                                      cu[0], varlen), **launches}
    else:
        launches = {"bwd_dq": launches["bwd_dq"], "bwd_dkdv": launches["bwd_dkdv"]}
    if splits > 1:
        block = max(1, SUM_ELEMENTS // head_dim_pad(D))
        launches["bwd_sum"] = (
            FUNCTIONS["bwd_sum"], (triton_cdiv(Nk, block), B * Hkv),
            (wk, wv, dk, dv, *dk.stride(), *dv.stride(), Hkv, Nk),
            {**common, "BLOCK_N": block, "SPLITS": splits, **unit_consts(dk, dv)},
            dict(PRE_OPTIONS))
    return launches


def preprocess_call(out, dout, delta, block: int, rows: int, cu_seqlens_q,
                    varlen: bool = False, padded=None, zero=None) -> tuple:
    """The delta launch (:func:`calls`' format) over ``rows`` query rows (a packed batch's
    longest sequence with ``varlen``) of (B, H, Nq, D) ``out`` and ``dout``; the Hopper
    backward launches it too. A packed batch's (1, H, total, D) tensors hold as many
    sequences as its prefix sums say, each a row of the grid per head. Delta's heads lie
    ``delta.shape[-1]`` rows apart. ``padded``: (lse, lse_rows, pad), the log-sum-exp
    copied into ``lse_rows``, laid out as delta: for a packed batch whose vectors are (H,
    N) with each sequence at a multiple of ``pad`` rows (the kernel's PAD_ROWS), or with
    ``pad`` 0 dense (B, H, N) vectors whose heads start 16-byte aligned. ``zero``: an
    fp32 buffer the launch fills with zeros, shared evenly among its programs."""
    from ..kernels.attention_bwd import ZERO_BLOCK
    from ..launch import triton_cdiv

    B, H, Nq, D = out.shape
    if varlen:
        B = cu_seqlens_q.shape[0] - 1
    lse, lse_rows, pad = padded or (delta, delta, 0)
    if pad:
        rows = triton_cdiv(rows, pad) * pad
    grid = (triton_cdiv(rows, block), B * H)
    n_zero = 0 if zero is None else zero.numel()
    step = ZERO_BLOCK.value
    chunk = triton_cdiv(triton_cdiv(n_zero, grid[0] * grid[1]), step) * step
    return (FUNCTIONS["bwd_preprocess"], grid,
            (out, dout, delta, *out.stride(), *dout.stride(), H, Nq, cu_seqlens_q, lse,
             lse_rows, delta.shape[-1], delta if zero is None else zero, n_zero, chunk),
            {"HEAD_DIM": D, "HEAD_DIM_PAD": head_dim_pad(D), "BLOCK_M": block,
             "VARLEN": varlen, "PAD_ROWS": pad, "COPY_LSE": padded is not None,
             "ZERO": zero is not None, **unit_consts(out, dout)}, dict(PRE_OPTIONS))


#: Compiled kernels of the launches per :func:`plan_key` and schedule (``{name: {device:
#: ...}}``, :func:`flashscope.launch.launch_compiled`'s ``cache``), so a launch of a known
#: geometry builds no per-argument key: on short rows that key cost the host more than
#: the kernels ran.
_PLANS: dict = {}
_PLANS_MAX = 256


def plan_key(dout, q, k, v, out, lse, dq, dk, dv, *, mask, scale: float,
             cfg: TritonBwdConfig, packed=None) -> tuple:
    """What the launches specialize on besides data addresses: the device, dtype,
    every tensor's shape, strides and 16-byte alignment (delta is allocated here, hence
    aligned), the mask, scale and config, and a packed batch's longest sequences and its
    prefix sums' alignment. It determines each launch's arguments up to their values, so
    it keys their compiled kernels."""
    ts = (dout, q, k, v, out, dq, dk, dv)
    pk = None if packed is None else (
        packed.max_seqlen_q, packed.max_seqlen_k, packed.cu_seqlens_q.shape,
        packed.cu_seqlens_q.data_ptr() % 16, packed.cu_seqlens_k.data_ptr() % 16)
    return (q.device, q.dtype, tuple(t.shape for t in ts), tuple(t.stride() for t in ts),
            tuple(t.data_ptr() % 16 for t in (*ts, lse)), lse.shape, lse.stride(), mask,
            float(scale), cfg, pk)


def run(dout, q, k, v, out, lse, dq, dk, dv, *, mask, scale: float,
        cfg: TritonBwdConfig, packed=None) -> None:
    """Launch the backward (GPU, or the interpreter on CPU tensors): dQ forming delta,
    then dK/dV; under GQA on a GPU delta first, then the two passes side by side
    (:func:`concurrent`)."""
    import torch

    from .. import kernels
    from ..launch import interpreting, launch_jit, remembered

    mod = kernels.load(MODULE, interpret=interpreting())
    B, H, Nq, _ = q.shape
    delta = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)
    splits = 1 if packed is not None else splits_for(q, k, cfg)
    side_by_side = concurrent(q, k, mask, packed)
    # the schedule follows from the geometry and the device, but is part of the key (a
    # kernel compiled for one schedule reads what the other does not write)
    key = (plan_key(dout, q, k, v, out, lse, dq, dk, dv, mask=mask, scale=scale, cfg=cfg,
                    packed=packed), splits, side_by_side)
    compiled = remembered(_PLANS, key, lambda: {name: {} for name in FUNCTIONS.values()},
                          _PLANS_MAX)
    launches = {name: functools.partial(launch_jit, getattr(mod, fn_name), grid, args,
                                        consts, opts, q.device, cache=compiled[fn_name])
                for name, (fn_name, grid, args, consts, opts) in calls(
                    dout, q, k, v, out, lse, delta, dq, dk, dv, mask=mask, scale=scale,
                    cfg=cfg, packed=packed, splits=splits, side_by_side=side_by_side,
                    work=_workspaces(k, splits)).items()}
    _launch(launches, side_by_side, q.device)


#: Programs the dK/dV grid should reach before it shares a GQA group among programs
#: (:func:`group_splits`), per SM. Against no sharing (H200, bf16, D = 128 unless said):
#: MQA 16 heads causal 4k B = 2 1.67x, D = 64 1.83x, 1k B = 4 1.38x, 16k B = 1 1.05x;
#: GQA 32/8 B = 1 2k (256 programs, shared in two) 0.98x. Reaching 4 or 8 an SM instead
#: gains as much on MQA but loses 4-18% where GQA groups of 4 or 8 get shared.
SPLIT_BELOW = 2


def group_splits(programs: int, group: int, sms: int) -> int:
    """How many programs share each (key tile, kv head) of dK/dV: 1, or under GQA when the
    grid's ``programs`` (key tiles x batch x kv heads) are fewer than SPLIT_BELOW per SM,
    the least power of two that reaches that, at most the group. Each share sums its
    heads' partial dK, dV in fp32, and the shares are added in order after (the result
    stays deterministic). MQA with 16 heads, B = 2, 4k keys: 128 programs for 132 SMs,
    each looping over 16 heads, where two programs fit an SM."""
    s = 1
    while s < group and programs * s < SPLIT_BELOW * sms:
        s *= 2
    return min(s, group)


def splits_for(q, k, cfg: TritonBwdConfig) -> int:
    """:func:`group_splits` of a dense problem on its device (1 off a GPU)."""
    from ..launch import interpreting, sm_count, triton_cdiv

    B, H = q.shape[:2]
    Hkv, Nk = k.shape[1], k.shape[2]
    if H == Hkv or q.device.type != "cuda" or interpreting():
        return 1
    return group_splits(triton_cdiv(Nk, cfg.BLOCK_N1) * B * Hkv, H // Hkv,
                        sm_count(q.device))


def _workspaces(k, splits: int):
    """(dK, dV) fp32 workspaces of ``splits`` partial sums per batch, or None."""
    if splits == 1:
        return None
    import torch

    B, Hkv, Nk, D = k.shape
    return tuple(torch.empty((B * splits, Hkv, Nk, D), device=k.device,
                             dtype=torch.float32) for _ in range(2))


#: Per (thread, device index), a second stream for the dQ pass and the two events that
#: order it against the caller's stream (:func:`_launch`). The events are reused, as a
#: wait takes an event's state when it is queued; per thread, because another thread
#: recording one between this thread's record and wait would move the wait.
_SIDE: dict = {}


def concurrent(q, k, mask, packed=None) -> bool:
    """Whether the dQ pass runs beside dK/dV on a second stream: on a GPU, where
    :func:`uneven_gqa` holds."""
    return q.device.type == "cuda" and uneven_gqa(q, k, mask, packed)


def uneven_gqa(q, k, mask, packed=None) -> bool:
    """The schedule's rule, on any device (offline builds follow it): GQA where dK/dV's
    programs are uneven (a band: causal or a window; a packed batch). Both passes need
    only delta, and dK/dV's grid is the group size times smaller than dQ's (one program
    per key tile and kv head), so alone it leaves SMs idle through its last wave. GPU
    time of the pair against the passes in turn with dQ forming delta (H100, bf16, 10 GQA
    and MQA shapes, D = 64-128, 1k-8k keys): causal 1.03-1.28x (B = 1, 32/8 heads, 4k:
    1.28x); without a mask 0.99-1.02x, where the second stream only added host time
    (60-200 us a call), and without GQA 0.99-1.03x (H200), so those run in turn."""
    banded = mask.causal or mask.left is not None or mask.right is not None
    return q.shape[1] != k.shape[1] and (banded or packed is not None)


def _launch(launches: dict, side_by_side: bool, device) -> None:
    """:func:`calls`' launches as zero-argument callables by name, in order; with
    ``side_by_side`` ``bwd_dq`` goes on a second stream that first waits for delta, and
    the caller's stream waits for it before the group sum or anything it queues next (so
    tensors the passes read stay theirs until both are done). Off a GPU, in order."""
    from ..launch import interpreting

    if not side_by_side or device.type != "cuda" or interpreting():
        for go in launches.values():
            go()
        return
    import torch

    launches["bwd_preprocess"]()
    main = torch.cuda.current_stream(device)
    key = (threading.get_ident(), main.device_index)
    side = _SIDE.get(key)
    if side is None:
        side = _SIDE[key] = (torch.cuda.Stream(device=main.device), torch.cuda.Event(),
                             torch.cuda.Event())
    stream, ready, done = side
    ready.record(main)
    stream.wait_event(ready)
    with torch.cuda.stream(stream):
        launches["bwd_dq"]()
    launches["bwd_dkdv"]()
    done.record(stream)
    main.wait_event(done)
    if "bwd_sum" in launches:
        launches["bwd_sum"]()


def bind(dout, q, k, v, out, lse, *, mask, scale: float, cfg: TritonBwdConfig):
    """:func:`run` for every later backward on a GPU on tensors of these tensors'
    geometry (:class:`flashscope.launch.BoundBackward`): the launches' arguments but the
    addresses, and their compiled kernels, found once. A function of (dout, q, k, v, out,
    lse) returning (dq, dk, dv), new tensors laid out like q, k, v."""
    import torch

    from .. import kernels
    from ..launch import launch_compiled

    B, H, Nq, _ = q.shape
    mod = kernels.load(MODULE)
    splits = splits_for(q, k, cfg)
    side_by_side = concurrent(q, k, mask)
    made = (torch.empty((B, H, Nq), device=q.device, dtype=torch.float32),
            torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    work = _workspaces(k, splits)
    # one distinct alias of each tensor (a call may pass one tensor as q, k and v; a
    # later call of the same geometry need not), so each argument's role is known by
    # identity: each launch's arguments with the tensors' places marked, an index into
    # the call's (dout, q, k, v, out, lse, delta, dq, dk, dv, *workspaces)
    given = tuple(t.view(t.shape) for t in (dout, q, k, v, out, lse))
    slots = {id(t): i for i, t in enumerate((*given, *made, *(work or ())))}
    plans = {}
    for name, (fn_name, grid, args, consts, opts) in calls(
            *given, *made, mask=mask, scale=scale, cfg=cfg, splits=splits,
            side_by_side=side_by_side, work=work).items():
        # the plan keeps no tensor (a record outlives its call): the marked places are
        # filled per call
        fills = tuple((i, slots[id(a)]) for i, a in enumerate(args)
                      if isinstance(a, torch.Tensor))
        args = tuple(None if isinstance(a, torch.Tensor) else a for a in args)
        plans[name] = (getattr(mod, fn_name), grid, args, fills, consts, opts, {})

    def go(dout, q, k, v, out, lse):
        delta = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        now = (dout, q, k, v, out, lse, delta, dq, dk, dv, *(_workspaces(k, splits) or ()))
        launches = {}
        for name, (kernel, grid, args, fills, consts, opts, cache) in plans.items():
            call = list(args)
            for i, m in fills:
                call[i] = now[m]
            launches[name] = functools.partial(launch_compiled, kernel, grid, call, consts,
                                               opts, cache=cache)
        _launch(launches, side_by_side, q.device)
        return dq, dk, dv
    return go
