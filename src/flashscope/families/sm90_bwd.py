"""The Hopper backward (``sm90-bwd``): one Gluon pass per key tile, 5 products a tile pair,
dQ added in fp32 by TMA reductions, or at D = 256 by the consumer's atomics
(:mod:`flashscope.kernels.attention_bwd_sm90`).

Its record (:class:`Sm90BwdConfig`), rules, the rule that runs it in place of the portable
backward (:func:`prefers`) and its launches (:func:`calls`, :func:`run`). The portable
two-pass backward (:mod:`.triton_bwd`) stays the reference, the deterministic path and the
one for short rows and head dims outside 40-128 and 168-256 (:func:`prefers`). Packed
batches run its VARLEN build; a window or bottom-right alignment its band (each key
tile's masked edge tiles first, then the whole ones between them), packed or not; a
logit cap its SOFTCAP switch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar, Optional

from ..compat import CODEGEN_OPTIONS
from ..errors import ConfigError
from .base import (DTYPE_BYTES, Knobs, Problem, Rule, allowed, check_rules, head_parts,
                   not_sm90, shared_memory, sm90_only, unit_consts)

KERNEL = "sm90-bwd"
MODULE, FUNCTION = "attention_bwd_sm90", "_attn_bwd_sm90"
#: the widths the kernel is built at; a head dim between runs at the next one up
#: (:func:`width`), or from 72 to 96 as 64 columns and a tail (:func:`parts`): TMA
#: zero-fills the columns past D on loads and clips them on the dK and dV stores, so the
#: products pay for the padding but need no masks
WIDTHS = (64, 128, 256)
#: head dims the kernel takes: rows of whole 16-byte units (TMA's stride rule), from 40
#: (narrower heads would pay for twice their width or more)
MIN_HEAD_DIM, MAX_HEAD_DIM = 40, 256


def width(head_dim: int) -> int:
    """The width ``head_dim`` is built at, 64, 128 or 256 (the rule's class,
    :data:`MIN_TILES`)."""
    return next(w for w in WIDTHS if head_dim <= w)


def split(head_dim: int) -> bool:
    """Whether ``head_dim`` is built at the 256-column width, whose programs take
    :data:`SPLIT_KEYS` keys and split the head dim between the warpgroups."""
    return head_dim > WIDTHS[1]


def parts(head_dim: int) -> tuple:
    """(HEAD_DIM, HEAD_TAIL): the column parts the kernel runs ``head_dim`` as. 72-96 as 64
    columns and a tail of 16 or 32 (:func:`~.base.head_parts`): D = 96 pays for 96 columns,
    not 128; the GPU time of the padded build over it (H200, bf16, ABBA medians) is in
    docs/backward.md. Others at their :func:`width`, HEAD_TAIL 0 (above 128: 256, whose
    build has no tail)."""
    if head_dim <= WIDTHS[0] or split(head_dim):
        return width(head_dim), 0
    return head_parts(head_dim)


def columns(head_dim: int) -> int:
    """Columns the kernel's tiles hold for ``head_dim``, its parts together."""
    return sum(parts(head_dim))


def head_dim_problem(head_dim: int) -> Optional[str]:
    """Why the kernel cannot take ``head_dim``, or None."""
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM or head_dim % 8:
        return (f"head dim {head_dim} (the kernel takes multiples of 8 from {MIN_HEAD_DIM} "
                f"to {MAX_HEAD_DIM})")
    return None


#: two consumer warpgroups in the default partition: 64 key rows each, or at the
#: 256-column width (:data:`SPLIT_KEYS`) 64 keys for both, each half of the head dim
WARPS = 8
#: key rows of a program at the 256-column width, where the warpgroups split the head
#: dim (the kernel's SPLIT_D): dK and dV of 64 keys take 128 of a thread's registers
#: this way, 256 with a warpgroup per 64 keys
SPLIT_KEYS = 64
#: registers of the producer and reducer warps (setmaxnreg); the consumers get the rest
WORKER_REGS = 24
#: (batch, kv head) pairs per section of a causal grid's order, key tile by key tile
#: within a section (the kernel's SECTION): its longest programs start first. GPU time
#: against head by head (H200, bf16, D = 128, causal): GQA 32/8 at 4k B = 1 1.39x, B = 2
#: 1.18x, Llama-3-70B's 64/8 at 4k 1.14x, 16 heads at 2k B = 2 1.16x, B = 8 1.05x; 8k
#: and 1k within 1%; 16 heads at 16k 0.96x. Sections of 2 read 0.98-1.05x.
CAUSAL_SECTION = 8


@dataclass(frozen=True)
class Sm90BwdConfig(Knobs):
    """Knobs of the Hopper backward. BLOCK_N key rows per program (128: its two
    warpgroups take 64 each; 64 at D = 256: both take the 64, each half of the head dim),
    BLOCK_M query rows per streamed tile, num_stages the depth of the Q/dO ring, DQ_SLOTS
    the shared-memory slots the finished dQ tiles wait in for their TMA reduction (two:
    the consumer fills one while the copy engine reads the other; 0: the consumer adds
    dQ by 16-byte atomics, no slot, as D = 256 does for want of the 64 KB a slot takes)."""

    KERNEL: ClassVar[str] = KERNEL

    BLOCK_M: int = 64
    BLOCK_N: int = 128
    num_stages: int = 2
    DQ_SLOTS: int = 2

    @property
    def num_warps(self) -> int:
        return WARPS

    def _label_parts(self) -> list:
        return [f"{self.BLOCK_M}x{self.BLOCK_N}", f"s{self.num_stages}",
                f"dq-slots {self.DQ_SLOTS}" if self.DQ_SLOTS else "dq atomics"]


Config = Sm90BwdConfig


def min_shared_bytes(cfg: Sm90BwdConfig, head_dim: int, dtype: str = "bfloat16") -> int:
    """The kernel's shared memory but the allocator's alignment: the Q and dO ring with
    its rows' log-sum-exp and delta, K and V, the dS^T tile (where the warpgroups split
    the head dim, two slots each for P^T and dS^T), the fp32 dQ slots and 8 bytes an
    mbarrier."""
    elt = DTYPE_BYTES[dtype]
    cols = columns(head_dim)
    tiles = (2 * cfg.num_stages * cfg.BLOCK_M + 2 * cfg.BLOCK_N) * cols * elt
    rows = 2 * cfg.num_stages * cfg.BLOCK_M * 4
    barriers = 1 + 2 * cfg.num_stages + 2 * max(1, cfg.DQ_SLOTS)
    st_tiles = 4 if cfg.BLOCK_N == SPLIT_KEYS else 1
    return (tiles + rows + st_tiles * cfg.BLOCK_N * cfg.BLOCK_M * elt
            + cfg.DQ_SLOTS * cfg.BLOCK_M * cols * 4 + 8 * barriers)


def _head_dim(cfg, ctx):
    why = head_dim_problem(ctx.head_dim)
    return f"{KERNEL}: {why} (use triton-bwd)" if why else None


def _key_rows(cfg, ctx):
    want = SPLIT_KEYS if split(ctx.head_dim) else Sm90BwdConfig.BLOCK_N
    if cfg.BLOCK_N != want:
        return (f"{KERNEL}: BLOCK_N={cfg.BLOCK_N}: expected {want} at head dim "
                f"{ctx.head_dim} (128: a warpgroup per 64 key rows, up to D = 128; 64: "
                "both warpgroups on 64 keys, each half of the head dim, above 128)")
    return None


RULES = (
    sm90_only(KERNEL, "triton-bwd"),
    Rule("head dim", "the kernel is built for these head dims", _head_dim),
    allowed("BLOCK_M", (64, 128), "query rows of a streamed tile"),
    Rule("BLOCK_N", "key rows of a program, by the head dim's width", _key_rows),
    allowed("num_stages", (2, 3), "the depth of the Q/dO ring"),
    allowed("DQ_SLOTS", (0, 1, 2), "dQ tiles awaiting their reduction (0: atomics)"),
    shared_memory(min_shared_bytes, lambda c: f"BLOCK_M={c.BLOCK_M}, DQ_SLOTS={c.DQ_SLOTS}"),
)

#: the values a one-knob search steps along (:func:`~.base.neighbours`)
STEPS = {"BLOCK_M": (64, 128), "BLOCK_N": (64, 128), "num_stages": (2, 3),
         "DQ_SLOTS": (0, 1, 2)}


def check(cfg: Sm90BwdConfig, target="sm90", head_dim: int = 128,
          dtype: str = "bfloat16") -> Sm90BwdConfig:
    """``cfg`` unchanged if it can be built for ``target``; else ConfigError naming the
    knob and the limit it breaks."""
    return check_rules(cfg, RULES, target, head_dim, dtype)


def accepts(problem: Problem) -> Optional[str]:
    """Why this family cannot run ``problem``, or None. Pure: no tensor is read."""
    why = not_sm90(problem.target_record())
    if why:
        return why
    return head_dim_problem(problem.head_dim)


#: Query rows a streamed tile takes at the 64-column width (D <= 64) where :func:`wide_rows`
#: says so: a tile's fixed steps (the ring and dQ-slot waits, the dS and dQ
#: stores with their barriers, the reduction's hand-off) serve twice the rows, as in
#: FlashAttention-3's D = 64 tiles. Its dP^T starting at -delta keeps it at 5/5 spilled
#: registers (sm_90; 75/94 with delta live beside P^T and dP^T). GPU time against 64 rows
#: (H200, bf16; in parentheses against 64 rows with dP^T from -delta too): dense
#: 4x32x4096 1.15x (1.11x) / 1.07x (1.05x) causal, 16x32x1024 1.15x (1.10x), 2x16x16384
#: causal 1.07x (1.07x), GQA 32/8 4k causal 1.08x (1.05x); packed 64k-token batches
#: 1.04-1.09x.
WIDE_ROWS = 128

#: The narrowest band (the keys it spans, ``Mask.span``) that takes :data:`WIDE_ROWS` rows.
WIDE_BAND = 1024


def wide_rows(problem: Problem) -> bool:
    """Whether a D <= 64 problem streams :data:`WIDE_ROWS` query rows: where most of a key
    tile's query tiles are whole. The masked ones (a band's edges, a packed sequence's ends)
    cost 1.5-1.7x a whole tile's instructions at 128 rows (sm_90, a causal window's edges
    840 and 937 against 561), and with a logit cap they spill (22-94 stores a tile), as
    does the cap's causal build in its whole tiles' loop (9/12). GPU time of 128 rows over
    64, one-pass backward (H200, bf16, 4 alternating rounds, 2026-11-30): causal window
    4096 at 16k, GQA 32/8, 1.09-1.10x; window 1024 at 8k 1.02-1.03x; bottom-right causal,
    2k queries over 4k keys, 1.03x; a logit cap without a mask 1.06x. Left at 64: window
    512 at 16k (1.00x at 128), window 128 (0.99x), two-sided 256 (1.00x), a packed
    64k-token batch under a 1024 window (1.01x), window 4096 with a cap (0.94x), a causal
    cap (1.01x)."""
    if problem.softcap:
        return not (problem.causal or problem.window)
    if not problem.window:
        return True
    return not problem.varlen and (problem.band_keys == 0 or problem.band_keys >= WIDE_BAND)


def select(problem: Problem) -> Sm90BwdConfig:
    """The default for a problem the family accepts: 64 x 128 tiles, a 2-stage ring, two
    dQ slots (214 KB of shared memory at D = 128: one program an SM); query tiles of
    :data:`WIDE_ROWS` rows at D <= 64 where :func:`wide_rows` says so (199 KB); above D = 128
    64 x 64 tiles with the head dim split between the warpgroups and dQ added by atomics
    (225 KB at D = 256: a dQ slot would take 64 KB more)."""
    if width(problem.head_dim) == WIDTHS[0] and wide_rows(problem):
        return Sm90BwdConfig(BLOCK_M=WIDE_ROWS)
    if split(problem.head_dim):
        return Sm90BwdConfig(BLOCK_N=SPLIT_KEYS, DQ_SLOTS=0)
    return Sm90BwdConfig()


# -- the rule against the two passes --------------------------------------------------------

#: Mean query tiles (of 64 rows) a program should visit, by head dim: below, its
#: prologue (K and V) and epilogue (dK and dV) weigh more than the two passes' second
#: read of the products. GPU time against the two passes (H200, bf16, alternating runs,
#: 2026-11-28): D = 128 at 2 and 2.5 tiles (B = 64 at 256 causal, 128 non-causal, 320
#: causal) 0.72-0.92x, 3 (384 causal) 1.04x, 4 (512 causal, 256 non-causal) 1.09-1.11x,
#: 6-8 1.10-1.26x, causal window 128 at 32k (4) 1.00x, two-sided 128 at 16k (6) 1.15x;
#: D = 64 (128-row tiles) at 4 tiles 0.89-0.90x, 6 0.96-0.99x, 7 1.00x, 8 (1k causal,
#: 512) 1.03-1.06x, 10-16 1.11-1.19x; its band builds (64-row tiles) 0.98x at 8 (causal
#: window 384 at 16k) and 1.03x at 10 (window 512).
#: D = 256 (64-key programs, the head dim split between the warpgroups) against the
#: two passes: 1 tile (B = 128 at 128 causal) 1.07x, 2 1.23-1.26x, 3 1.40x, 4
#: 1.48-1.49x, 6 1.59x, 8-16 1.74-1.95x (H200, bf16, 2026-11-29).
MIN_TILES = {64: 8, 128: 4, 256: 1}  # by the tiles' width (:func:`width`)
#: The same for packed batches (on their mean lengths), whose programs run the list of
#: the batch's key tiles while the two passes launch one for every key tile of the
#: longest sequence: 64k tokens of 64-1024 (172 sequences) and 128-2048 (90), one pass
#: against two: D = 128 at 3 tiles (causal) 1.19x, 6 1.32-1.40x, 12 1.48x; D = 64 at 3
#: 0.96x, 6 1.12-1.18x, 12 1.32x; causal windows on 64k tokens of 128-8192, D = 128 at 4
#: and 6 tiles 1.16x and 1.22x, D = 64 at 6, 8 and 10 1.00x, 1.09x and 1.13x.
#: D = 256 packed: not measured; the dense bound (the packed one is never above it).
PACKED_MIN_TILES = {64: 6, 128: 3, 256: 1}
#: The narrowest head dim the 256-column build runs by default: it pays for 256 columns
#: where the two passes run D as 128 and a tail. GPU time against them (H200, bf16):
#: D = 160 0.78-0.83x (4k causal, 1k causal), 192 1.13x (4k) and 1.17x (4k causal),
#: 256 1.07-1.95x.
MIN_SPLIT_HEAD_DIM = 168
#: Rows of the query tiles :data:`MIN_TILES` counts: those it was measured with, whatever
#: BLOCK_M :func:`select` gives the problem
RULE_ROWS = 64
#: Programs per SM the grid should reach (one program an SM fits): 256 programs (1.9 an
#: SM) ran 1.07x (B = 1, 16 heads, 2k) and 1.21x (GQA 32/8, 4k), causal in sections
#: (:data:`CAUSAL_SECTION`) 1.13x (GQA 32/8, 4k); 64 (MQA, B = 2, 4k) 0.63x.
MIN_WAVES = 1


def query_tiles(problem: Problem) -> float:
    """Mean query tiles of :data:`RULE_ROWS` rows a program visits, its GQA group's
    together: half the rows under a causal mask; a window bounded on both sides
    (``band_keys``) reaches a key tile from its BLOCK_N rows and the band's span, whatever
    the length."""
    keys = Sm90BwdConfig().BLOCK_N
    rows = -(-problem.n_q // RULE_ROWS) * (0.5 if problem.causal else 1.0)
    if problem.band_keys:
        rows = min(rows, -(-(problem.band_keys + keys) // RULE_ROWS))
    return max(1, problem.group) * rows


def prefers(problem: Problem) -> Optional[str]:
    """Why the two passes run ``problem`` by default, or None where this family does.
    Pure: the problem's sizes and the target's SM count (a packed batch's problem carries
    its mean lengths, :func:`flashscope.varlen.backward_problem`)."""
    why = accepts(problem)
    if why:
        return why
    if problem.deterministic:
        return "deterministic algorithms are on (dQ's sum order varies)"
    if split(problem.head_dim) and problem.head_dim < MIN_SPLIT_HEAD_DIM:
        return (f"head dim {problem.head_dim} (padded to 256 columns; the two passes run it "
                f"as 128 and a tail)")
    cfg = select(problem)
    group = max(1, problem.group)
    least = (PACKED_MIN_TILES if problem.varlen else MIN_TILES)[width(problem.head_dim)]
    tiles = query_tiles(problem)
    if tiles < least:
        return (f"{tiles:g} query tiles a program (fewer than {least} at "
                f"D = {problem.head_dim})")
    if problem.heads:
        programs = -(-problem.n_k // cfg.BLOCK_N) * max(1, problem.heads // group)
        sms = problem.units
        if programs < MIN_WAVES * sms:
            return f"{programs} programs (fewer than {MIN_WAVES} an SM)"
    return None


# -- launches ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _fp32_layout():
    """Unswizzled fp32 rank-2 blocks: the row vectors' (1, rows) and the dQ buffer's tile,
    whose bytes the kernel writes in their final order."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def _rows_desc(x, rows: int, n_q: int):
    """A rank-2 TMA descriptor over fp32 row vectors ``x`` (:func:`row_shape`), a row per
    head with its first ``n_q`` values read, block (1, ``rows``): the consumer's
    log-sum-exp and delta for one query tile. A tile's rows past ``n_q`` come back
    zero-filled (L = 0 and delta = 0 beside zero Q and dO rows: P = 1 and dS = 0, nothing
    added), not the next head's: a head whose rows saw only very negative scores has L
    near -400, and P = 2^(0 - L) = inf there made dK and dV NaN. Packed, the padding's
    +inf and 0 come first."""
    from .sm90_fwd import _descriptor

    n_rows = x.shape[-1]
    heads = x.numel() // n_rows
    return _descriptor(x, dict(shape=[heads, n_q], strides=[n_rows, 1],
                               block_shape=[1, rows], layout=_fp32_layout(), padding="zero"))


def row_shape(q, packed, cfg: Sm90BwdConfig) -> tuple:
    """The shape of the fp32 row vectors the kernel reads a query tile's log-sum-exp and
    delta from by TMA (delta; a copy of the log-sum-exp where :func:`copies_lse`): (B, H,
    Nq rounded up to 4) dense, so that each head's vector starts 16-byte aligned, as a
    copy's stride must; for a packed batch (H, rows) with each sequence from a multiple of
    BLOCK_M, so that every tile's copy starts 16-byte aligned wherever its sequence
    starts in the packed tensors (``attention_bwd.padded_start``). The delta launch writes
    them. Loaded by the consumer instead, rows in registers across its loop, they cost
    1.06-1.15x the GPU time (H200, D = 128, 1k-16k keys)."""
    if packed is None:
        return (*q.shape[:2], -(-q.shape[2] // 4) * 4)
    m = cfg.BLOCK_M
    return q.shape[1], -(-(q.shape[2] + packed.batch * m) // m) * m


def copies_lse(q, packed) -> bool:
    """Whether the delta launch copies the log-sum-exp into a :func:`row_shape` vector
    (``lse_rows``): for a packed batch, and where a dense head's Nq values are not a whole
    number of 16-byte units (the forward's (B, H, Nq) vector then gives TMA no aligned
    stride)."""
    return packed is not None or q.shape[2] % 4 != 0


#: rows of a dQ tile in the buffer: one per consumer thread (the kernel's FRAG_ROWS)
FRAG_ROWS = 32 * WARPS


def acc_shape(q, packed, cfg: Sm90BwdConfig) -> tuple:
    """The fp32 dQ buffer the one pass adds into: each query tile of each head (B H
    dense, H packed; a head's tiles over its :func:`row_shape` rows) as a block of
    FRAG_ROWS rows, one per consumer thread, in the accumulator's register order (the
    kernel's ``_fragments``: conflict-free 128-bit stores), which ``_dq_unpack`` reads.
    (rows, cols): a tile is FRAG_ROWS rows, its bytes in the kernel's order."""
    rows = row_shape(q, packed, cfg)
    heads = rows[0] if packed is not None else rows[0] * rows[1]
    tiles = -(-rows[-1] // cfg.BLOCK_M)
    return heads * tiles * FRAG_ROWS, cfg.BLOCK_M * columns(q.shape[3]) // FRAG_ROWS


def _acc_desc(acc, cols: int):
    """A rank-2 TMA descriptor over the dQ buffer (:func:`acc_shape`), block (FRAG_ROWS,
    ``cols``): a tile, or with a head-dim tail one of its parts (a buffer row holds the
    main part's values, then the tail's)."""
    from .sm90_fwd import _descriptor

    return _descriptor(acc, dict(shape=list(acc.shape), strides=[acc.shape[1], 1],
                                 block_shape=[FRAG_ROWS, cols],
                                 layout=_fp32_layout(), padding="zero"))


def calls(dout, q, k, v, out, lse, delta, acc, dk, dv, *, mask, scale: float,
          cfg: Sm90BwdConfig, packed=None, lse_rows=None, dq=None) -> dict:
    """``{name: (function name, grid, positional args, constexpr keywords, launch
    options)}``: ``bwd_preprocess`` (delta, the portable backward's kernel) and
    ``sm90-bwd``, which adds dQ into ``acc`` (fp32, :func:`acc_shape`; the delta launch
    zeroes it), and
    with ``dq`` ``dq_unpack``, which scales and casts it into ``dq``. The one place their
    argument lists are built: :func:`run` launches them, offline compilation binds them.
    ``packed``: a :class:`~flashscope.launch.Packed` batch, the tensors (1, H, total, D)
    (the kernel's VARLEN: its programs run the order ``key_list`` writes before it, the
    batch's key tiles with the longest sequences first, into a list this allocates).
    ``delta``, and where :func:`copies_lse` ``lse_rows``, are row vectors of
    :func:`row_shape`, which the preprocess fills (``lse_rows`` from ``lse``)."""
    from ..launch import LOG2E, triton_cdiv
    from . import triton_bwd
    from .sm90_fwd import LIST_BLOCK_B, LIST_BLOCK_E, _desc_problem, tma_desc4
    from .triton_fwd import packed_shape

    _, H, Nq, D = q.shape
    W, tail = parts(D)
    Hkv, Nk = k.shape[1], k.shape[2]
    B, rows, keys, _ = packed_shape(q, k, packed)
    varlen = packed is not None
    lengths = (None, None) if varlen else (Nq, Nk)  # packed: each sequence's own
    cu = (lse, lse) if packed is None else (packed.cu_seqlens_q, packed.cu_seqlens_k)
    copied = copies_lse(q, packed)
    padded = (lse, lse_rows, cfg.BLOCK_M if varlen else 0) if copied else None
    rows_in = lse_rows if copied else lse
    n_rows = delta.shape[-1] if varlen else Nq  # the rows a copy reads of a head
    opts = {"num_warps": WARPS, "num_stages": cfg.num_stages, **CODEGEN_OPTIONS}
    # dK and dV by TMA where their buffers take a descriptor (else the key descriptors
    # stand in, unused)
    kv_tma = not (_desc_problem(dk) or _desc_problem(dv))

    def part(cols: int) -> tuple:
        """The descriptors of a column part ``cols`` wide: Q, K, V, dO, dK, dV, the dQ
        buffer's."""
        qd = tma_desc4(q, "query", cfg.BLOCK_M, cols)
        kd, vd = tma_desc4(k, "key", cfg.BLOCK_N, cols), tma_desc4(v, "value", cfg.BLOCK_N, cols)
        kv_out = ((tma_desc4(dk, "dk", cfg.BLOCK_N, cols),
                   tma_desc4(dv, "dv", cfg.BLOCK_N, cols)) if kv_tma else (kd, vd))
        return (qd, kd, vd, tma_desc4(dout, "grad_out", cfg.BLOCK_M, cols), *kv_out,
                _acc_desc(acc, cfg.BLOCK_M * cols // FRAG_ROWS))

    q_d, k_d, v_d, do_d, dk_d, dv_d, acc_d = part(W)
    tails = part(tail) if tail else (None,) * 7
    section = CAUSAL_SECTION if mask.causal else 0
    grid = (triton_cdiv(keys, cfg.BLOCK_N), B * Hkv)
    order = {}
    listed = lse  # unread without VARLEN
    if varlen:  # the programs run the device-built order of the batch's key tiles
        import torch

        slots = min((triton_cdiv(k.shape[2], cfg.BLOCK_N) + B) * Hkv, grid[0] * grid[1])
        listed = torch.empty(max(1, slots), dtype=torch.int32, device=q.device)
        grid = (max(1, slots), 1)
        order = {"key_list": (
            "_key_list", (max(1, triton_cdiv(B, LIST_BLOCK_B)), Hkv),
            (*cu, listed, B, Hkv, triton_cdiv(keys, cfg.BLOCK_N), listed.shape[0]),
            {"BLOCK_N": cfg.BLOCK_N, "BLOCK_B": LIST_BLOCK_B, "BLOCK_E": LIST_BLOCK_E,
             "SECTION": section},
            {"num_warps": 4, "num_stages": 1})}
    return {
        "bwd_preprocess": triton_bwd.preprocess_call(
            out, dout, delta, triton_bwd.TritonBwdConfig().PRE_BLOCK, rows, cu[0], varlen,
            padded, zero=acc),
        **order,
        KERNEL: (
            FUNCTION, grid,
            (q_d, k_d, v_d, do_d, acc_d, _rows_desc(rows_in, cfg.BLOCK_M, n_rows),
             _rows_desc(delta, cfg.BLOCK_M, n_rows), dk_d, dv_d, dk, dv, acc,
             *cu, listed,
             *dk.stride()[:3], *dv.stride()[:3], H, Hkv, Nq, keys, delta.shape[-1],
             float(scale * LOG2E), float(scale), *mask.scalars(*lengths),
             *mask.cap_args(scale), *tails),
            {"HEAD_DIM": W, "HEAD_COLS": D, "HEAD_TAIL": tail, "BLOCK_M": cfg.BLOCK_M,
             "BLOCK_N": cfg.BLOCK_N, "STAGES": cfg.num_stages, "DQ_SLOTS": cfg.DQ_SLOTS,
             "IS_CAUSAL": mask.causal,
             "WORKER_REGS": WORKER_REGS, "SECTION": 0 if varlen else section,
             "VARLEN": varlen, "KEY_TAIL": varlen or Nk % cfg.BLOCK_N != 0,
             "DKV_TMA": kv_tma,
             **{name: on for name, on in mask.switches(*lengths).items()
                if name in ("HAS_LEFT", "HAS_RIGHT", "SHIFTED", "SOFTCAP")}},
            opts),
        **({} if dq is None else {"dq_unpack": (
            "_dq_unpack", (triton_cdiv(rows, cfg.BLOCK_M), B * H),
            (acc, dq, cu[0], *dq.stride(), H, Nq, delta.shape[-1], float(scale)),
            {"HEAD_DIM": W, "HEAD_COLS": D, "HEAD_TAIL": tail, "BLOCK_M": cfg.BLOCK_M,
             "WARPS": WARPS, "VARLEN": varlen, **unit_consts(dq)},
            {"num_warps": 4, "num_stages": 1})}),
    }


def _module(name: str) -> str:
    """The kernel module of launch ``name`` of :func:`calls`."""
    from . import triton_bwd

    return {"bwd_preprocess": triton_bwd.MODULE, "key_list": "packed_worklist"}.get(name, MODULE)


#: compiled kernels per geometry, as :data:`.triton_bwd._PLANS`
_PLANS: dict = {}
_PLANS_MAX = 256


def run(dout, q, k, v, out, lse, dq, dk, dv, *, mask, scale: float, cfg: Sm90BwdConfig,
        packed=None) -> None:
    """Launch the backward on a GPU: delta (zeroing the fp32 dQ buffer), the one pass into it,
    then dQ scaled and cast into ``dq``. dK and dV need a contiguous last dimension (the kernel
    stores them by TMA, or row by row where they take no descriptor); dO without a TMA
    descriptor is copied. ``packed``: a packed
    batch, as in :func:`calls`."""
    import torch

    from .. import kernels
    from ..launch import launch_jit, remembered
    from . import triton_bwd
    from .sm90_fwd import _desc_problem, tensors_problem

    if q.device.type != "cuda":
        raise ConfigError(f"{KERNEL} runs on a GPU only (use triton-bwd)")
    why = tensors_problem(q, k, v)  # the forward's reads: a TMA descriptor for each
    if why:
        raise ConfigError(f"{KERNEL}: {why} (use triton-bwd)")
    if _desc_problem(dout):
        dout = dout.contiguous()
    if lse.data_ptr() % 16:  # the log-sum-exp's descriptor needs an aligned base
        lse = lse.clone()
    work = [x if x.stride(-1) == 1 else torch.empty_like(x, memory_format=torch.contiguous_format)
            for x in (dk, dv)]
    delta, lse_rows, acc = _scratch(q, packed, cfg)
    key = triton_bwd.plan_key(dout, q, k, v, out, lse, dq, *work, mask=mask, scale=scale,
                              cfg=cfg, packed=packed)
    compiled = remembered(_PLANS, key, lambda: {}, _PLANS_MAX)
    for name, (fn_name, grid, args, consts, opts) in calls(
            dout, q, k, v, out, lse, delta, acc, *work, mask=mask, scale=scale,
            cfg=cfg, packed=packed, lse_rows=lse_rows, dq=dq).items():
        mod = kernels.load(_module(name))
        launch_jit(getattr(mod, fn_name), grid, args, consts, opts, q.device,
                   cache=compiled.setdefault(name, {}))
    for given, made in zip((dk, dv), work):
        if given is not made:
            given.copy_(made)


def _bound_plans(given, made, *, mask, scale: float, cfg: Sm90BwdConfig) -> dict:
    """:func:`calls` once, each launch's arguments with the tensors' places marked:
    ``{name: (function name, grid, args, fills, constexprs, options)}``, ``fills`` (place,
    index into ``given + made``, None or a descriptor's fields) for every tensor and TMA
    descriptor, whose bases differ per call. ``given`` (dout, q, k, v, out, lse) and
    ``made`` (delta, lse_rows, acc, dq, dk, dv) must be distinct objects."""
    import torch

    from .sm90_fwd import _descriptor_class

    slots = {id(t): i for i, t in enumerate((*given, *made))}
    delta, lse_rows, acc, dq, dk, dv = made
    plans = {}
    for name, (fn_name, grid, args, consts, opts) in calls(
            *given, delta, acc, dk, dv, mask=mask, scale=scale, cfg=cfg, lse_rows=lse_rows,
            dq=dq).items():
        fills = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                fills.append((i, slots[id(a)], None))
            elif isinstance(a, _descriptor_class()):
                fields = {n: x for n, x in a.__dict__.items() if n != "base"}
                fills.append((i, slots[id(a.base)], fields))
        marked = {i for i, _, _ in fills}
        args = tuple(None if i in marked else a for i, a in enumerate(args))
        plans[name] = (fn_name, grid, args, tuple(fills), consts, opts)
    return plans


def _filled(args, fills, now) -> list:
    """A plan's arguments for one call: ``now`` (given + made) in the marked places, each
    descriptor rebuilt over its tensor with the fields it had."""
    from .sm90_fwd import _descriptor

    call = list(args)
    for i, m, fields in fills:
        call[i] = now[m] if fields is None else _descriptor(now[m], fields)
    return call


def _scratch(q, packed, cfg: Sm90BwdConfig) -> tuple:
    """The backward's own fp32 buffers: delta, the log-sum-exp's copy where
    :func:`copies_lse` (else None), and the dQ buffer (the delta launch zeroes it)."""
    import torch

    f32 = dict(device=q.device, dtype=torch.float32)
    rows = row_shape(q, packed, cfg)
    return (torch.empty(rows, **f32),
            torch.empty(rows, **f32) if copies_lse(q, packed) else None,
            torch.empty(acc_shape(q, packed, cfg), **f32))


def _buffers(q, k, v, cfg: Sm90BwdConfig) -> tuple:
    """A dense backward's buffers: :func:`_scratch`'s, then dq, dk, dv."""
    import torch

    return (*_scratch(q, None, cfg), torch.empty_like(q), torch.empty_like(k),
            torch.empty_like(v))


def bind(dout, q, k, v, out, lse, *, mask, scale: float, cfg: Sm90BwdConfig):
    """:func:`run` for every later backward on a GPU on tensors of these tensors' geometry
    (:class:`flashscope.launch.BoundBackward`): the launches' arguments but the addresses,
    and their compiled kernels, found once; a call allocates its buffers, fills the
    tensors' places and rebuilds the descriptors over them. A function of (dout, q, k, v,
    out, lse) returning (dq, dk, dv), new tensors laid out like q, k, v; False (the plain
    path) off a GPU, under the interpreter, and where :func:`run` would copy an input
    first."""
    from .. import kernels
    from ..launch import interpreting, launch_compiled
    from .sm90_fwd import _desc_problem, tensors_problem

    if (q.device.type != "cuda" or interpreting() or tensors_problem(q, k, v)
            or _desc_problem(dout) or lse.data_ptr() % 16):
        return False
    # one distinct alias of each tensor (a call may pass one tensor as q, k and v), its
    # strides as they are (a view would renumber those of a dimension of size 1)
    given = tuple(t.as_strided(t.shape, t.stride()) for t in (dout, q, k, v, out, lse))
    plans = []
    for name, (fn_name, grid, args, fills, consts, opts) in _bound_plans(
            given, _buffers(q, k, v, cfg), mask=mask, scale=scale, cfg=cfg).items():
        mod = kernels.load(_module(name))
        plans.append((getattr(mod, fn_name), grid, args, fills, consts, opts, {}))

    def go(dout, q, k, v, out, lse):
        now = (dout, q, k, v, out, lse, *_buffers(q, k, v, cfg))
        for kernel, grid, args, fills, consts, opts, cache in plans:  # a GPU, checked above
            launch_compiled(kernel, grid, _filled(args, fills, now), consts, opts, cache=cache)
        return now[9], now[10], now[11]
    return go
