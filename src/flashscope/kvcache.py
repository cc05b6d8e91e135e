"""Attention against a KV cache (decoding), with FlashAttention's conventions:
:func:`attention_with_kvcache`, and :func:`check_kvcache`, which also reads the values.
The kernel is the decoding family's (:mod:`flashscope.families.triton_decode`), or for
wide GQA rows on sm_90 the Hopper forward's (:func:`~flashscope.families.triton_decode.
forward_rows`, :class:`_ForwardRows`).

What is checked, and when. Every call checks what the tensors' metadata says, on the
host and without reading any device memory: types, ranks, shapes, dtypes, devices, the
block table's dtype and shape, the page size, the mask keywords and the config. The
values of ``cache_seqlens`` (each within the cache, room left for the appended keys)
and of ``block_table`` (each page a sequence uses inside the cache) live on the device:
reading them costs a host synchronization per call, as long as a whole decoding step on
small batches, and a CUDA graph cannot capture one. They are checked on every call with
CPU tensors (where they cost nothing) and on the GPU by :func:`check_kvcache`, which a
caller runs where a sync is affordable (tests, a debug mode, once per batch layout). On
the GPU the kernels make bad values harmless instead: lengths are clamped into the cache,
pages read are clamped into it, and an append to a position or page outside it writes
nothing. A refused call writes nothing to the cache: every check runs before the append.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import launch
from .api import (_DTYPES, _bindable, _flag, _typed, call_key, check_device,
                  check_head_dim_of, check_mask_args, check_same_shape, check_scale,
                  device_target, resolve_config)
from .errors import ConfigError, FlashscopeError
from .families import Problem, sm90_fwd, triton_decode
from .families.sm90_fwd import Sm90FwdConfig
from .families.triton_decode import Cache, TritonDecodeConfig


def _tensor(name: str, t, rank: int, what: str):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise FlashscopeError(f"{name}: expected rank {rank} {what}, got shape "
                              f"{tuple(t.shape)} (rank {t.dim()})")
    return t


def _check_layout(q, k_cache, v_cache, cache_seqlens, k, v, block_table) -> tuple:
    """The metadata checks (module docstring); returns (Cache, appended keys)."""
    _tensor("q", q, 4, "(B, Nq, H, D)")
    paged = block_table is not None
    what = "(num_pages, page_size, Hkv, D)" if paged else "(B, Ncache, Hkv, D)"
    _tensor("k_cache", k_cache, 4, what)
    _tensor("v_cache", v_cache, 4, what)
    _tensor("cache_seqlens", cache_seqlens, 1, "(B,)")
    if (k is None) != (v is None):
        raise FlashscopeError("k, v: give both new keys and new values, or neither")
    values = [("k_cache", k_cache), ("v_cache", v_cache)]
    if k is not None:
        values += [("k", _tensor("k", k, 4, "(B, Nnew, Hkv, D)")),
                   ("v", _tensor("v", v, 4, "(B, Nnew, Hkv, D)"))]
    indices = [("cache_seqlens", cache_seqlens)]
    if paged:
        indices.append(("block_table",
                        _tensor("block_table", block_table, 2, "(B, max_pages)")))
    for name, t in values + indices:
        if t.device != q.device:
            raise FlashscopeError(f"{name}: on {t.device}, expected q's device {q.device}")
    check_device("q", q.device)
    if q.dtype not in _DTYPES:
        raise TypeError(f"q: expected dtype float16 or bfloat16, got {q.dtype}")
    for name, t in values:
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {t.dtype}, expected q's {q.dtype}")
    for name, t in indices:
        if t.dtype != torch.int32:
            raise TypeError(f"{name}: expected dtype int32, got {t.dtype}")
    B, _, H, D = q.shape
    check_same_shape("k_cache", k_cache, "v_cache", v_cache)
    _, n_or_page, hkv, dk = k_cache.shape
    if dk != D:
        raise FlashscopeError(f"k_cache: head dim {dk} does not match q's head dim {D}")
    check_head_dim_of("q", D)
    if hkv == 0 or H % hkv:
        raise FlashscopeError(f"k_cache: {hkv} kv heads must divide q's {H} heads (GQA)")
    if cache_seqlens.shape[0] != B:
        raise FlashscopeError(f"cache_seqlens: {cache_seqlens.shape[0]} lengths for q's "
                              f"batch of {B}")
    if paged:
        if block_table.shape[0] != B:
            raise FlashscopeError(f"block_table: {block_table.shape[0]} rows for q's batch "
                                  f"of {B}")
        if n_or_page < 1 or k_cache.shape[0] < 1:
            raise FlashscopeError(f"k_cache: {k_cache.shape[0]} pages of {n_or_page} keys: "
                                  "expected at least one page of at least one key")
    elif k_cache.shape[0] != B:
        raise FlashscopeError(f"k_cache: batch {k_cache.shape[0]} does not match q's batch "
                              f"{B} (a paged cache needs block_table)")
    cache = Cache.of(k_cache, v_cache, cache_seqlens, block_table)
    n_new = 0
    if k is not None:
        check_same_shape("k", k, "v", v)
        if k.shape[0] != B or k.shape[2] != hkv or k.shape[3] != D:
            raise FlashscopeError(f"k: shape {tuple(k.shape)}, expected ({B}, Nnew, {hkv}, "
                                  f"{D}) like the cache's heads and q's batch")
        n_new = k.shape[1]
        if n_new > cache.capacity:
            raise FlashscopeError(f"k: {n_new} new keys do not fit a cache of "
                                  f"{cache.capacity} keys per sequence")
    return cache, n_new


def _check_values(cache: Cache, n_new: int) -> None:
    """The values of the lengths and the block table (a host sync on the GPU)."""
    lens = cache.seqlens.cpu()
    room = cache.capacity - n_new
    bad = ((lens < 0) | (lens > room)).nonzero()
    if len(bad):
        b = int(bad[0, 0])
        raise FlashscopeError(
            f"cache_seqlens[{b}] = {int(lens[b])}: expected 0..{room} (the cache holds "
            f"{cache.capacity} keys per sequence{f' and {n_new} are appended' if n_new else ''})")
    if cache.table is None:
        return
    table = cache.table.cpu()
    used = (lens + n_new + cache.page - 1) // cache.page
    cols = torch.arange(table.shape[1])[None, :]
    bad = ((cols < used[:, None]) & ((table < 0) | (table >= cache.pages))).nonzero()
    if len(bad):
        b, i = (int(x) for x in bad[0])
        raise FlashscopeError(
            f"block_table[{b}, {i}] = {int(table[b, i])}: expected a page in "
            f"0..{cache.pages - 1} (sequence {b} uses its first {int(used[b])} entries)")


def _checked(q, k_cache, v_cache, cache_seqlens, k, v, block_table, is_causal, scale,
             window, softcap, return_lse, config) -> tuple:
    _flag("return_lse", return_lse)
    cache, n_new = _check_layout(q, k_cache, v_cache, cache_seqlens, k, v, block_table)
    check_scale(scale)
    mask = check_mask_args(is_causal, window, "bottom_right", softcap)
    D = q.shape[3]
    cfg = None if config is None else resolve_config(
        config, D, _DTYPES[q.dtype], q.device, kinds=(triton_decode.KERNEL, sm90_fwd.KERNEL))
    if isinstance(cfg, Sm90FwdConfig):
        why = forward_layout(q, cache, scale)
        if why:
            raise FlashscopeError(f"config: {sm90_fwd.KERNEL} cannot run this call: {why}")
        sm90_fwd.check_cache(cfg, D)
    if q.device.type == "cpu":
        _check_values(cache, n_new)
    return cache, n_new, mask, cfg


def check_kvcache(q, k_cache, v_cache, *, cache_seqlens, k=None, v=None, block_table=None,
                  is_causal: bool = True, scale: Optional[float] = None, window=None,
                  softcap: Optional[float] = None, return_lse: bool = False,
                  config: Optional[TritonDecodeConfig] = None) -> None:
    """Every check :func:`attention_with_kvcache` makes, plus the values of
    ``cache_seqlens`` and ``block_table`` on any device (one host sync on a GPU). Raises
    the call's error, or returns None."""
    cache, n_new, _, _ = _checked(q, k_cache, v_cache, cache_seqlens, k, v, block_table,
                                  is_causal, scale, window, softcap, return_lse, config)
    _check_values(cache, n_new)


#: Packed rows a decoding call's row block holds on the sm_90 forward with one consumer
#: warpgroup (:func:`forward_config`)
ONE_CONSUMER_ROWS = 64
#: Stages of K and V a one-consumer tile's program takes where it reads its row block
#: whole on a grid of at most half the SMs (:func:`forward_config`)
WHOLE_READ_STAGES = 3
#: Default configs by what :func:`_default_config` reads; emptied at 256 keys.
_DEFAULTS: dict = {}


def problem_of(q, cache: Cache, mask) -> Problem:
    """The :class:`~flashscope.families.base.Problem` of a decoding call: the query
    tokens, the cache's keys per sequence, B x H, the GQA group, the mask and the GPU."""
    B, Nq, H, D = q.shape
    hkv = cache.k.shape[2]
    return Problem(device_target(q.device) or "sm90", _DTYPES[q.dtype], D, mask.causal, Nq,
                   cache.capacity, B * H,
                   window=mask.left_bounded or (mask.right_bounded and not mask.causal),
                   softcap=mask.softcap is not None, group=H // hkv,
                   paged=cache.table is not None, device=launch.device_name(q.device))


def _default_config(q, cache: Cache, mask, scale: float):
    """The default for this call (:func:`problem_of`): the sm_90 forward's where
    :func:`~flashscope.families.triton_decode.forward_rows` sends the problem there and
    the cache's layout lets it (:func:`forward_layout`), else the decoding family's;
    remembered by what the problem and the layout are made of."""
    key = (q.device, q.dtype, q.shape, cache.k.shape, cache.k.stride(), cache.v.stride(),
           cache.k.data_ptr() % 16, cache.v.data_ptr() % 16, cache.capacity, cache.page,
           mask, scale > 0)
    return launch.remembered(_DEFAULTS, key, lambda: _select(q, cache, mask, scale))


def _select(q, cache: Cache, mask, scale: float):
    problem = problem_of(q, cache, mask)
    if triton_decode.forward_rows(problem) and forward_layout(q, cache, scale) is None:
        return forward_config(problem)
    return triton_decode.select(problem)


def forward_config(problem: Problem) -> Sm90FwdConfig:
    """The sm_90 forward's config for a decoding problem it runs: its rule's on the
    packed rows (:func:`~flashscope.families.triton_decode.forward_problem`), fitted, with
    MASKED_FIRST off (the cache's last key tile must come last,
    :func:`~flashscope.families.sm90_fwd.check_packed`), and with SPLIT_KV where the
    row blocks leave SMs enough to cut each one along its keys in two pieces or more
    (:func:`~flashscope.families.sm90_fwd.packed_pieces`). Rows that one consumer holds
    (64 or fewer, GQA 8:1 at 4 tokens) take a 64-row tile, without the ping-pong of two:
    1.02-1.18x the speed of 128-row tiles at 32 and 64 rows, 0.99x at B = 64 with 8k
    keys (H200, bf16, D = 128, B = 1-64, 1k-32k keys, dense and 16-key pages, two runs);
    read whole by no more programs than half the SMs, they take
    :data:`WHOLE_READ_STAGES` stages where shared memory holds them: a program alone on
    its SM waits on its loads (H200, bf16, 17-32 rows, 1k-3.5k keys, GPU time of 3 stages
    over 2: dense B = 5-8 1.00-1.09x, paged B = 3-8 1.04-1.09x, D = 256 1.01-1.14x; past
    half the SMs 0.94-1.00x, cut grids 0.93-1.08x)."""
    rows = triton_decode.packed_rows(problem)
    fwd = triton_decode.forward_problem(problem)
    cfg = sm90_fwd.fit(sm90_fwd.select(fwd), fwd).replace(MASKED_FIRST=False)
    if rows <= ONE_CONSUMER_ROWS:
        cfg = cfg.replace(BLOCK_M=ONE_CONSUMER_ROWS, PINGPONG=False)
    blocks, tiles, sms = triton_decode.forward_grid(problem, cfg.BLOCK_N)
    if sm90_fwd.packed_pieces(blocks, tiles, sms) > 1:
        return cfg.replace(SPLIT_KV=True, BALANCE=False)
    if rows <= ONE_CONSUMER_ROWS and 2 * blocks <= sms and cfg.num_stages < WHOLE_READ_STAGES:
        try:
            return sm90_fwd.check(cfg.replace(num_stages=WHOLE_READ_STAGES), problem.target,
                                  problem.head_dim, problem.dtype)
        except ConfigError:
            pass
    return cfg


def forward_layout(q, cache: Cache, scale) -> Optional[str]:
    """Why the sm_90 forward cannot run this call's layout, or None: it needs an sm_90
    GPU, a cache whose sequences (or pages) lie one stride apart (so that the cache is
    one packed batch of B slots of Ncache keys each, or of its pages), TMA-aligned,
    pages of a power of two of 16 keys or more (the table's columns one apart, as
    :meth:`~flashscope.families.triton_decode.Cache.of` lays them out), and a positive
    scale."""
    if q.device.type != "cuda" or launch.interpreting() or device_target(q.device) != "sm90":
        return "it runs on an sm_90 GPU"
    if cache.table is not None and not sm90_fwd.paged_ok(cache.page):
        return f"pages of {cache.page} keys (it takes a power of two of 16 or more)"
    if scale is not None and scale <= 0:
        return f"scale {scale} (it takes scale > 0)"
    if cache.capacity < 1:
        return "a cache without room for a key"
    for name, t in (("k_cache", cache.k), ("v_cache", cache.v)):
        if t.shape[0] > 1 and t.stride(0) != t.shape[1] * t.stride(1):
            return (f"{name}: its sequences {t.stride(0)} elements apart, expected "
                    f"Ncache x {t.stride(1)} (one packed batch)")
        why = sm90_fwd._desc_problem(_packed_cache(t))
        if why:
            return f"{name}: {why}"
    return None


def _packed_cache(t):
    """A dense cache (B, Ncache, Hkv, D) as the forward's packed keys (1, Hkv, B Ncache,
    D), or a paged one's pages (P, page, Hkv, D) as (1, Hkv, P page, D): a view, never a
    copy."""
    B, n, hkv, D = t.shape
    return t.view(1, B * n, hkv, D).permute(0, 2, 1, 3)


class _ForwardRows:
    """Attention on the sm_90 forward for the calls of one geometry (the append, if any,
    ran first): each kv head's G query heads times the Nq tokens packed as the rows of
    one sequence (row r of sequence b holding token r // G; ROW_GROUP = G), the cache as
    B slots of Ncache keys of which the first ``cache_seqlens[b] + n_new`` are used (read
    on the device, by the work list or by each program where the grid has one an entry;
    a paged cache's pages as one batch, read through its block table); with SPLIT_KV
    each row block cut into pieces along its keys and merged
    (:func:`flashscope.families.sm90_fwd.packed_pieces`). Where G
    divides 64 the kernel reads q and writes the output and log-sum-exp in the caller's
    layout (:func:`_grouped`: GROUPED, 64 rows are 64 / G whole tokens); otherwise q is
    copied packed, (1, Hkv, B Nq G, D), and the output and log-sum-exp copied back (at B
    = 64, 8k keys, GQA 8:1 x 16 tokens the two copies took 8% of the step, H200). The
    launch is bound on the first call (:func:`flashscope.families.sm90_fwd.bind`)."""

    __slots__ = ("go", "grouped")

    def __init__(self):
        self.go = None
        self.grouped = None

    def __call__(self, q, cache: Cache, out, lse, n_new: int, mask, scale: float,
                 cfg: Sm90FwdConfig) -> None:
        B, Nq, H, D = q.shape
        hkv = cache.k.shape[2]
        G = H // hkv
        rows = Nq * G
        if self.grouped is None:
            self.grouped = _grouped(q, out, lse, hkv)
        kp, vp = _packed_cache(cache.k), _packed_cache(cache.v)
        packed = launch.Packed(*_slots(q.device, B, rows, cache.capacity), rows,
                               cache.capacity, seqused_k=cache.seqlens, added_k=n_new,
                               row_group=G, block_table=cache.table, page=cache.page)
        if self.grouped:  # the caller's tensors, (B, Nq, Hkv, G, D)
            qx, ox, lx = q.unflatten(2, (hkv, G)), out.unflatten(2, (hkv, G)), lse
        else:
            qx = q.unflatten(2, (hkv, G)).permute(2, 0, 1, 3, 4).reshape(1, hkv, B * rows, D)
            ox = torch.empty_like(qx)
            lx = None if lse is None else torch.empty((1, hkv, B * rows), device=q.device,
                                                      dtype=torch.float32)
        if self.go is None:
            self.go = sm90_fwd.bind(qx, kp, vp, ox, lx, mask=mask, scale=scale, cfg=cfg,
                                    packed=packed)
        self.go(qx, kp, vp, ox, lx, packed)
        if self.grouped:
            return
        out.unflatten(2, (hkv, G)).copy_(
            ox[0].unflatten(1, (B, Nq, G)).permute(1, 2, 0, 3, 4))
        if lse is not None:
            lse.view(B, hkv, G, Nq).copy_(
                lx[0].unflatten(1, (B, Nq, G)).permute(1, 0, 3, 2))


def _grouped(q, out, lse, hkv: int) -> bool:
    """Whether the forward can read q (B, Nq, H, D) and write ``out`` and ``lse`` (B, H,
    Nq) where they are: the group G = H / Hkv divides 64 (a 64-row block is 64 / G
    whole tokens) and TMA addresses q and out as (B, Nq, Hkv, G, D)."""
    G = q.shape[2] // hkv
    if not sm90_fwd.grouped_ok(G):
        return False
    if lse is not None and lse.stride(2) != 1:
        return False
    return not any(sm90_fwd._desc_problem(x.unflatten(2, (hkv, G))) for x in (q, out))


#: (cu_seqlens_q, cu_seqlens_k) of the forward's packed rows and cache slots, by device
#: and sizes: a decoding loop asks for the same ones every step
_SLOTS: dict = {}


def _slots(device, B: int, rows: int, capacity: int) -> tuple:
    """Made once outside a CUDA graph's capture (tensors made inside one belong to the
    graph's memory pool, which outlives no graph)."""
    def make():
        steps = torch.arange(B + 1, device=device, dtype=torch.int32)
        return steps * rows, steps * capacity
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return _SLOTS.get((device, B, rows, capacity)) or make()
    return launch.remembered(_SLOTS, (device, B, rows, capacity), make)


def attention_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, k=None, v=None,
                           block_table=None, is_causal: bool = True,
                           scale: Optional[float] = None, window=None,
                           softcap: Optional[float] = None, return_lse: bool = False,
                           config: Optional[TritonDecodeConfig] = None):
    """Attention of new query tokens against a KV cache, FlashAttention's
    ``flash_attn_with_kvcache``.

    q (B, Nq, H, D); k_cache, v_cache (B, Ncache, Hkv, D), or paged: (num_pages,
    page_size, Hkv, D) with ``block_table`` (B, max_pages) int32, entry i of row b naming
    the page that holds keys [i page_size, (i + 1) page_size) of sequence b (any page
    size); ``cache_seqlens`` (B,) int32, the keys each sequence holds before this call.
    H a multiple of Hkv (GQA, MQA); fp16 or bf16; D in 1..256; any strides.

    ``k``, ``v`` (B, Nnew, Hkv, D), optional: written into the cache in place at positions
    ``cache_seqlens[b]`` onward before attending (the caller then advances
    ``cache_seqlens``). Query token i of sequence b sits at position
    ``cache_seqlens[b] + Nnew - Nq + i`` and, with ``is_causal``, sees the keys up to its
    own position; without it all ``cache_seqlens[b] + Nnew`` of them. ``window=(left,
    right)`` and ``softcap`` as in :func:`flashscope.attention` (positions as above). A
    query that sees no key returns zeros and a log-sum-exp of -inf.

    Returns the output (B, Nq, H, D) laid out like q and, with ``return_lse``, the
    natural-log log-sum-exp (B, H, Nq) fp32. ``config``: a
    :class:`~flashscope.families.triton_decode.TritonDecodeConfig` (default: chosen for
    the problem, :func:`flashscope.families.triton_decode.select`). Which values are
    checked where: the module docstring."""
    compiling = torch.compiler.is_compiling()
    key = None
    if not compiling and _bindable(q):
        key = _call_key(q, k_cache, v_cache, cache_seqlens, k, v, block_table, is_causal,
                        scale, window, softcap, return_lse, config)
        bound = None if key is None else _BOUND.get(key)
        if bound is not None:
            return bound(q, k_cache, v_cache, cache_seqlens, k, v, block_table)
    cache, n_new, mask, cfg = _checked(q, k_cache, v_cache, cache_seqlens, k, v,
                                       block_table, is_causal, scale, window, softcap,
                                       return_lse, config)
    sc = launch.default_scale(q.shape[3]) if scale is None else float(scale)
    if key is not None and q.numel():
        bound = _BoundDecode(mask, sc, cfg or _default_config(q, cache, mask, sc),
                             return_lse)
        launch.remembered(_BOUND, key, lambda: bound)
        return bound(q, k_cache, v_cache, cache_seqlens, k, v, block_table)
    if compiling:
        left = -1 if mask.left is None else mask.left
        right = -1 if mask.right is None or mask.causal else mask.right
        text = "" if cfg is None else f"{cfg.KERNEL}:{cfg.text}"
        out, lse = _decode_op(q, k_cache, v_cache, cache_seqlens, block_table, k, v,
                              mask.causal, left, right, mask.softcap or 0.0, sc, text)
    else:
        out, lse = _run(q, cache, k, v, mask, sc, cfg, return_lse)
    return (out, lse) if return_lse else out


#: :class:`_BoundDecode` records by :func:`_call_key`: a call whose key is here was
#: checked and configured before.
_BOUND: dict = {}


def _call_key(q, k_cache, v_cache, cache_seqlens, k, v, block_table, is_causal, scale,
              window, softcap, return_lse, config):
    """Everything the checks of a call on CUDA tensors read (none reads a value there):
    every tensor's geometry, the keywords with their types and the config
    (:func:`flashscope.api.call_key`)."""
    return call_key((q, k_cache, v_cache, cache_seqlens, k, v, block_table), window,
                    _typed(is_causal), _typed(scale), _typed(softcap), _typed(return_lse),
                    config)


class _BoundDecode:
    """The calls of one :func:`_call_key`: their mask, scale, config and launch plan
    (:func:`flashscope.families.triton_decode.plan`, found on the first call: with an
    sm_90 forward's config, the append's alone); a call allocates the output and
    launches."""

    __slots__ = ("mask", "scale", "cfg", "return_lse", "plan", "mod", "rows")

    def __init__(self, mask, scale: float, cfg, return_lse: bool):
        self.mask, self.scale, self.cfg, self.return_lse = mask, scale, cfg, return_lse
        self.plan = self.mod = None
        self.rows = _ForwardRows() if isinstance(cfg, Sm90FwdConfig) else None

    def __call__(self, q, k_cache, v_cache, cache_seqlens, k, v, block_table):
        cache = Cache.of(k_cache, v_cache, cache_seqlens, block_table)
        B, Nq, H, _ = q.shape
        out, lse = torch.empty_like(q), launch.lse_for(q, (B, H, Nq), self.return_lse)
        if self.plan is None:
            from . import kernels

            self.plan = triton_decode.plan(q, cache, out, lse, k, v, mask=self.mask,
                                           scale=self.scale, cfg=self.cfg,
                                           attend=self.rows is None)
            self.mod = kernels.load(triton_decode.MODULE)
        triton_decode.run_plan(self.plan, self.mod, q, cache, out, lse, k, v)
        if self.rows is not None:
            self.rows(q, cache, out, lse, 0 if k is None else k.shape[1], self.mask,
                      self.scale, self.cfg)
        return (out, lse) if self.return_lse else out


def _run(q, cache: Cache, k, v, mask, scale: float, cfg, return_lse: bool):
    B, Nq, H, _ = q.shape
    out, lse = torch.empty_like(q), launch.lse_for(q, (B, H, Nq), return_lse)
    if launch.interpreting() and q.dtype == torch.bfloat16:
        from .testing.interpreter import patch_bf16_dot

        patch_bf16_dot()
    if out.numel() == 0:
        if k is not None and B:  # no queries, but the append still happens
            triton_decode.run(q, cache, out, lse, k_new=k, v_new=v, mask=mask, scale=scale,
                              cfg=cfg or _default_config(q, cache, mask, scale),
                              attend=False)
        return out, lse
    cfg = cfg or _default_config(q, cache, mask, scale)
    forward = isinstance(cfg, Sm90FwdConfig)
    # the append (the decoding family's launch) runs first either way
    if not forward or k is not None:
        triton_decode.run(q, cache, out, lse, k_new=k, v_new=v, mask=mask, scale=scale,
                          cfg=cfg, attend=not forward)
    if forward:
        _ForwardRows()(q, cache, out, lse, 0 if k is None else k.shape[1], mask, scale, cfg)
    return out, lse


@torch.library.custom_op("flashscope::attention_with_kvcache",
                         mutates_args=("k_cache", "v_cache"))
def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
               k: Optional[torch.Tensor], v: Optional[torch.Tensor], is_causal: bool,
               left: int, right: int, softcap: float, scale: float,
               config: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out like q, lse (B, H, Nq) fp32); appends k and v to the caches first. ``left``/
    ``right``: window bounds, -1 unbounded; ``softcap`` 0: none; ``config`` "" = the
    default for the problem. What torch.compile captures, without graph breaks."""
    from .api import parse_config_text
    from .masks import Mask

    mask = Mask.of(is_causal, (left, right), "bottom_right", softcap or None)
    cache = Cache.of(k_cache, v_cache, cache_seqlens, block_table)
    cfg = parse_config_text(config) if config else None
    return _run(q, cache, k, v, mask, scale, cfg, True)


@_decode_op.register_fake
def _decode_op_fake(q, k_cache, v_cache, cache_seqlens, block_table, k, v, is_causal, left,
                    right, softcap, scale, config):
    B, Nq, H, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Nq), dtype=torch.float32)
