"""The Hopper forward (``sm90-fwd``), written in Gluon
(:mod:`flashscope.kernels.attention_fwd_sm90`): a TMA producer warp and one consumer
warpgroup per 64 query rows on a persistent grid, FlashAttention-3's schedule.

In order: the head dims it runs and the column parts it runs each as (:func:`head_parts`),
its record (:class:`Sm90FwdConfig`) with its rules (:data:`RULES`, :func:`check`) and the
problems it accepts (:func:`accepts`), the default rule (:func:`select`, fitted to a
problem's sizes by :func:`fit`) and the tensors it reads (:func:`tensors_problem`), its
TMA descriptors (:func:`tma_desc4`), the host's work lists (:func:`lpt_tensor`,
:func:`split_tensors`), and its launch plan
(:class:`Sm90Plan`: descriptors, scalars, work list, constexprs, built once per geometry
and then looked up, :func:`plan`; a packed batch's list is built on the device per call,
:meth:`Sm90Plan.packed_list`), then its launches: :func:`run`, and :func:`bind` for the
later calls of one geometry (both through ``_launch``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional

from ..compat import CODEGEN_OPTIONS
from ..errors import ConfigError
from .base import (DTYPE_BYTES, Knobs, Problem, Rule, allowed, check_rules, head_dim_pad,
                   head_parts, not_sm90, shared_memory, sm90_only)

KERNEL = "sm90-fwd"
MODULE, FUNCTION = "attention_fwd_sm90", "_attn_fwd_sm90"
#: head dims the kernel runs (:func:`~.base.head_parts`, a rule the portable backward
#: shares, gives the column parts it builds each as); TMA zero-fills the columns past D on
#: loads and clips them on the output store, so the products pay for the padding but need
#: no masks
MIN_HEAD_DIM, MAX_HEAD_DIM = 33, 256


def head_dim_ok(d: int) -> bool:
    return MIN_HEAD_DIM <= d <= MAX_HEAD_DIM


def head_width(d: int) -> int:
    """Columns the kernel's tiles hold for head dim ``d``: both parts of :func:`head_parts`."""
    return sum(head_parts(d))


# -- the record and its rules ---------------------------------------------------------------

#: warps of one consumer warpgroup (the kernel's num_warps)
WARPS = 4
#: setmaxnreg budgets by consumer warpgroups: with a 24-register producer warpgroup, two
#: 240-register consumers fill 64K registers ((2 x 240 + 24) x 128 = 64512, as in
#: FlashAttention-3); three take 160 each and the producer, then in the default
#: partition, the remaining 32 ((3 x 160 + 32) x 128 = 65536, FlashAttention-4's split).
#: One consumer runs in the default partition alone.
CONSUMER_REGS = {1: 240, 2: 240, 3: 160}
PRODUCER_REGS = 24
#: two consumers' and the producer's budgets reading a paged cache of pages smaller than
#: a key tile (a table read and a TMA copy each page): at 24 registers the producer kept
#: five of its loop's values in local memory, reloaded every work tile; at 40 none
#: ((2 x 232 + 40) x 128 = 64512)
PAGED_REGS = (232, 40)
#: loading warps of the same builds: each page is a TMA copy and a table read (16 copies a
#: 128-key tile of K and of V at 16-key pages). One warp issuing every copy kept the route
#: at 0.94-0.96 of the dense speed on the same memory (pages in order), two (Q and K in
#: one, V in the other) at 0.99-1.00 (H200, B = 8-64, 8k-32k keys). The two one-warp
#: loaders share the producer's warpgroup and its PAGED_REGS budget
PAGED_LOADERS = 2
#: base-2 threshold of LAZY_RESCALE: a row's maximum moves only when a key tile raises it
#: by more than this (a factor of 256), which keeps P below 2^8 and every sum exact in fp32
RESCALE_TAU = 8


@dataclass(frozen=True)
class Sm90FwdConfig(Knobs):
    """Knobs of the Hopper forward. The defaults are the recipe that measured best at
    D = 128 on an H100 (:func:`select` gives each problem's).

    BLOCK_M rows per work tile, one consumer warpgroup per 64 (64, 128 or 192); BLOCK_N
    keys per tile (the wgmma N of the score tile); num_stages the depth of the K/V ring.
    Q_IN_REGS: each consumer loads its Q slot into registers once per work tile and feeds
    Q K^T from there (wgmma's register A operand): each key tile then reads only K and V
    from shared memory, for D / 4 more registers per thread. PINGPONG (two or three
    consumers): the consumers issue their wgmma in turn on hardware named barriers, so one
    warpgroup's softmax runs under the others' products (FlashAttention-3's ping-pong).
    LAZY_RESCALE: a row keeps its running maximum until a key tile raises it by more than
    :data:`RESCALE_TAU` (base 2), so most tiles skip the O rescale (FlashAttention-4's
    conditional rescaling). EARLY_Q: the output gets a shared-memory slot of its own, so
    each Q slot goes back to the producer at its last Q K^T and the next work tile's Q loads
    under the epilogue. K_EARLY: each K slot goes back when its Q K^T completes instead of
    with its V. MASKED_FIRST: each work tile's masked key tiles run first, so the
    consumer loop carries no mask. OUT_RCP: each output row is scaled by one reciprocal of
    its sum instead of dividing every value. BALANCE: the host's work list prices a head's
    partly padded last row block by the consumers that hold real rows and splits the heads
    into sections of nearly equal size (:mod:`flashscope.schedule`). SPLIT_KV: the work
    list's ragged end is cut along the keys (a decoding call's packed rows: every row
    block, :func:`packed_pieces`); the pieces write fp32 partials that a second kernel
    merges (:mod:`flashscope.kernels.attention_merge`)."""

    KERNEL: ClassVar[str] = KERNEL

    BLOCK_M: int = 128
    BLOCK_N: int = 128
    num_stages: int = 2
    Q_IN_REGS: bool = True
    PINGPONG: bool = False
    LAZY_RESCALE: bool = True
    EARLY_Q: bool = True
    K_EARLY: bool = True
    MASKED_FIRST: bool = True
    OUT_RCP: bool = True
    BALANCE: bool = False
    SPLIT_KV: bool = False

    #: the switches a label names when on
    _SWITCHES: ClassVar[tuple] = (
        ("Q_IN_REGS", "q-regs"), ("PINGPONG", "pingpong"), ("LAZY_RESCALE", "lazy"),
        ("EARLY_Q", "early-q"), ("K_EARLY", "k-early"), ("MASKED_FIRST", "masked-first"),
        ("OUT_RCP", "rcp"), ("BALANCE", "balance"), ("SPLIT_KV", "split-kv"))

    @property
    def num_warps(self) -> int:
        return WARPS

    @property
    def consumers(self) -> int:
        return self.BLOCK_M // 64

    def _label_parts(self) -> list:
        return [f"{self.BLOCK_M}x{self.BLOCK_N}", f"s{self.num_stages}",
                *(name for knob, name in self._SWITCHES if getattr(self, knob))]


Config = Sm90FwdConfig


def min_shared_bytes(cfg: Sm90FwdConfig, head_dim: int, dtype: str = "bfloat16") -> int:
    """The kernel's shared memory but the allocator's alignment, in bytes: Q (and the
    output slot with EARLY_Q), the K/V ring, 16 bytes a row of the row maxima the
    consumers store, and 8 bytes an mbarrier (two a consumer's Q slot, three or with
    K_EARLY four a ring slot)."""
    rows = cfg.BLOCK_M * (2 if cfg.EARLY_Q else 1) + 2 * cfg.num_stages * cfg.BLOCK_N
    barriers = 2 * cfg.consumers + (4 if cfg.K_EARLY else 3) * cfg.num_stages
    return rows * head_width(head_dim) * DTYPE_BYTES[dtype] + 16 * cfg.BLOCK_M + 8 * barriers


def _head_dim(cfg, ctx):
    if not head_dim_ok(ctx.head_dim):
        return (f"{KERNEL} takes head dims {MIN_HEAD_DIM}..{MAX_HEAD_DIM}, got "
                f"{ctx.head_dim} (use triton-fwd)")
    return None


def _pingpong(cfg, ctx):
    if cfg.PINGPONG and cfg.BLOCK_M < 128:
        return (f"{KERNEL}: PINGPONG=1 needs two or three consumer warpgroups to take turns "
                f"(BLOCK_M=128 or 192), got BLOCK_M={cfg.BLOCK_M}")
    return None


RULES = (
    sm90_only(KERNEL, "triton-fwd"),
    Rule("head dim", "the kernel is built for these head dims", _head_dim),
    allowed("BLOCK_M", (64, 128, 192), "one consumer warpgroup per 64 query rows"),
    allowed("BLOCK_N", (64, 128), "the wgmma N of the score tile"),
    allowed("num_stages", (2, 3, 4), "the depth of the K/V ring"),
    Rule("PINGPONG", "turns need two or more consumers", _pingpong),
    shared_memory(min_shared_bytes, lambda c: f"BLOCK_M={c.BLOCK_M}, BLOCK_N={c.BLOCK_N}"
                  + (", EARLY_Q=1" if c.EARLY_Q else "")),
)

#: the values a one-knob search steps along (:func:`~.base.neighbours`): the tiles and
#: ring depths the rules allow
STEPS = {"BLOCK_M": (64, 128, 192), "BLOCK_N": (64, 128), "num_stages": (2, 3, 4)}


#: Switches that order or cut a work tile's key tiles as a causal or unmasked block needs
#: them (the masked tiles of a causal block first, the host's work list priced by causal
#: row lengths); a band (a window bound or bottom-right alignment) has masked tiles at
#: both edges and runs round robin, so it takes none of them.
BAND_KNOBS = ("MASKED_FIRST", "BALANCE", "SPLIT_KV")


def check_band(cfg: Sm90FwdConfig, mask, n_q: int, n_k: int, cache: bool = False) -> None:
    """ConfigError naming the first of :data:`BAND_KNOBS` ``cfg`` sets when ``mask`` is a
    band (:meth:`flashscope.masks.Mask.banded`). ``cache``: a decoding call's packed
    batch, which cuts its blocks along the keys its own way (SPLIT_KV,
    :func:`packed_pieces`)."""
    if not mask.banded(n_q, n_k):
        return
    for knob in BAND_KNOBS:
        if getattr(cfg, knob) and not (cache and knob == "SPLIT_KV"):
            raise ConfigError(f"{KERNEL}: {knob}=1 orders a causal or unmasked block's key "
                              "tiles; windows and bottom-right alignment run with "
                              f"{knob}=0")


#: Switches that price or cut the host's work list: a packed batch's list is built on the
#: device from its prefix sums (:mod:`flashscope.kernels.packed_worklist`), so it takes
#: neither; one that reads a KV cache takes SPLIT_KV (:func:`packed_pieces`).
PACKED_KNOBS = ("BALANCE", "SPLIT_KV")


def check_packed(cfg: Sm90FwdConfig, packed, head_dim: int = 128) -> None:
    """ConfigError naming the first of :data:`PACKED_KNOBS` ``cfg`` sets for a packed
    batch (``packed``: :func:`_packed_key`, True for any, or None), and for one that
    reads a KV cache what :func:`check_cache` refuses."""
    if packed is None:
        return
    cache = isinstance(packed, tuple) and packed[3]
    for knob in PACKED_KNOBS:
        if getattr(cfg, knob) and not (cache and knob == "SPLIT_KV"):
            raise ConfigError(f"{KERNEL}: {knob}=1 shapes the host's work list; a packed "
                              f"batch's list is built on the device (run it with {knob}=0)")
    if cache:
        check_cache(cfg, head_dim, packed[6])


def check_cache(cfg: Sm90FwdConfig, head_dim: int, page: int = 0) -> None:
    """ConfigError for what a packed batch that reads a KV cache cannot take (the keys
    past each length are zeroed in its last key tile, :func:`~flashscope.kernels.
    sm90_softmax._zero_past`): MASKED_FIRST (which takes that tile first), a head
    dim other than 64, 128 and 256 (a tail between two powers of two is not zeroed;
    the zeroing's tiles are 64 columns wide at least), and a paged cache's ``page``
    size other than a power of two of 16 keys or more (a TMA copy a page or a key tile,
    :func:`paged_ok`)."""
    if cfg.MASKED_FIRST:
        raise ConfigError(f"{KERNEL}: MASKED_FIRST=1 reads a sequence's last key tile "
                          "first; against a KV cache it runs with MASKED_FIRST=0")
    if head_dim not in (64, 128, 256):
        raise ConfigError(f"{KERNEL}: head dim {head_dim} against a KV cache: expected "
                          "64, 128 or 256")
    if page and not paged_ok(page):
        raise ConfigError(f"{KERNEL}: pages of {page} keys: expected a power of two of "
                          "16 or more")


def paged_ok(page: int) -> bool:
    """Whether the kernel reads a paged cache of ``page`` keys a page: a power of two of
    16 keys or more, so that a key tile holds whole pages or lies in one, and each TMA
    copy fills whole 8-row groups of the tile's swizzled layout."""
    return page >= 16 and page & (page - 1) == 0


def grouped_ok(group: int) -> bool:
    """Whether the kernel reads a decoding call's q and writes its output in the caller's
    layout (GROUPED) for ``group`` query heads a kv head: the group divides 64, so that
    a consumer's 64 rows are whole tokens (:func:`tma_desc_tokens`)."""
    return 64 % group == 0


def check(cfg: Sm90FwdConfig, target="sm90", head_dim: int = 128,
          dtype: str = "bfloat16") -> Sm90FwdConfig:
    """``cfg`` unchanged if it can be built for ``target``; else ConfigError naming the
    knob and the limit it breaks."""
    return check_rules(cfg, RULES, target, head_dim, dtype)


def accepts(problem: Problem) -> Optional[str]:
    """Why this family cannot run ``problem``, or None. Pure: no tensor is read."""
    why = not_sm90(problem.target_record())
    if why:
        return why
    if not head_dim_ok(problem.head_dim):
        return f"head dim {problem.head_dim} (the kernel takes {MIN_HEAD_DIM}..{MAX_HEAD_DIM})"
    return None


# -- the default rule -----------------------------------------------------------------------

def select(problem: Problem) -> Sm90FwdConfig:
    """The default for a problem the family accepts, a rule over the measured recipes
    (H100, bf16, B*N = 16384, H*D = 2048; each knob's effect in docs/experiments.md):

    - D = 64: three consumers (192 x 128), a 3-stage ring, consumers in turn, Q read from
      shared memory (three 160-register consumers have no room for it), the output in a
      slot of its own with one reciprocal per row, and the padded last row block priced in
      the work list; causal adds the lazy rescale, early K hand-backs and the masked tiles
      first.
    - D = 128: two consumers (128 x 128), a 2-stage ring with early K hand-backs (the
      shared memory leaves room for the output slot), Q in registers, the lazy rescale,
      the masked tiles first; causal adds the balanced work list.
    - D = 256: two consumers over 64-key tiles (128 x 64) and a 2-stage ring: Q, K and V
      then fill 192 KB, which leaves no room for an output slot (no EARLY_Q), and the 64 x
      256 fp32 accumulator takes 128 of a consumer's 240 registers, so Q stays in shared
      memory (the shape FlashAttention-3 runs at this head dim, 128 x 80, in powers of two).

    Head dims in between take the recipe of their padded width (and run at the width
    of :func:`head_parts`). A narrow band (:func:`narrow_band`) takes key tiles of half
    the width and twice the stages (at most :data:`NARROW_STAGES`). Tuned entries
    (:mod:`flashscope.tuned`) override this where an A/B beat it. A band (a window, or
    bottom-right alignment) runs round robin with its masked tiles in place
    (:data:`BAND_KNOBS` off); a packed batch runs the device's list (:data:`PACKED_KNOBS`
    off)."""
    base = Sm90FwdConfig()
    d = head_dim_pad(problem.head_dim)
    if d <= 64:
        cfg = base.replace(BLOCK_M=192, num_stages=3, Q_IN_REGS=False, PINGPONG=True,
                           LAZY_RESCALE=problem.causal, K_EARLY=problem.causal,
                           MASKED_FIRST=problem.causal, BALANCE=True)
    elif d <= 128:
        cfg = base.replace(BALANCE=problem.causal)
    else:
        cfg = base.replace(BLOCK_N=64, Q_IN_REGS=False, EARLY_Q=False,
                           BALANCE=problem.causal)
    if problem.window:
        cfg = cfg.replace(**{knob: False for knob in BAND_KNOBS})
        if narrow_band(problem, cfg):
            cfg = cfg.replace(BLOCK_N=cfg.BLOCK_N // 2,
                              num_stages=min(2 * cfg.num_stages, NARROW_STAGES))
    if problem.varlen:
        cfg = cfg.replace(**{knob: False for knob in PACKED_KNOBS})
    return cfg


#: Keys x head dim of the widest band that takes 64-key tiles (:func:`narrow_band`)
NARROW_BAND = 64 * 1024
#: most stages of the narrow band's ring (the neighbour search's deepest)
NARROW_STAGES = 4


def narrow_band(problem: Problem, cfg: Sm90FwdConfig) -> bool:
    """Whether a window bounded on both sides (causal: left only) spans so few keys for
    its head dim, ``band_keys`` x padded D <= :data:`NARROW_BAND` (512 keys at D = 128,
    1024 at D = 64), that its key tiles should be 64 keys wide rather than 128.

    Why: a band's rows start and end at different keys, so a tile of 128 keys wastes
    more of its products on the masked keys at each edge than one of 64 does, and the
    edges are most of a narrow band; on a wide one the 128-key tile's lower cost a key
    wins (it measured 7-19% faster on unmasked rows). The cost of a key's products grows
    with D, so the crossover's key count halves as D doubles. Measured on an H100 (bf16,
    the band-compatible recipes, GPU time): 64-key tiles in 4 stages ran 1.11-1.33x the
    128-key ones at D = 128 for causal bands of 128 and 512 keys and two-sided ones of
    128 and 256 keys each side, 0.94 at a causal 1024; 1.25-2.1x at D = 64 from 128 to
    1024 keys and two-sided 256 each side, 0.98 at 2048. D = 256 takes 64-key tiles
    already."""
    return (0 < problem.band_keys * head_dim_pad(problem.head_dim) <= NARROW_BAND
            and cfg.BLOCK_N > 64)


#: How many more padded query rows three-consumer tiles (BLOCK_M = 192) may cost than
#: two-consumer ones (128) before :func:`fit` takes the smaller tile. The 192-row tile
#: processes 5-15% more rows a second (BERT-large, 512 rows: 417 against 401 TFLOP/s with
#: 12% more padded rows; ViT-L/14, 577 rows: even at 20% more); at ViT-B/16's 197 rows, 384
#: padded rows against 256, the 128-row tile reaches 181 TFLOP/s against 132 (H200, bf16,
#: CUDA-graph time).
ROW_PAD_LIMIT = 1.25


def _padded(n: int, block: int) -> int:
    return -(-n // block) * block


#: Below this share of the SMs busy over the persistent grid's waves, a non-causal
#: problem's work list is cut along the keys (SPLIT_KV). SDXL's self-attention (B 2, H 10,
#: N 4096, D 64: 440 tiles of 192 rows, 4 waves on 132 SMs, 83% busy) ran 486 against 456
#: TFLOP/s with the cut (H200, bf16); the suite's other shapes fill 94-99%. Causal work
#: lists are balanced by BALANCE instead. A cut list drops BALANCE: the cut already evens
#: the sections, and pricing the padded row blocks on top of it cost SDXL 6-7% of its time
#: in both dtypes (H100, flashscope tune cells --suite models --neighbours; Flux.1 and the
#: chunked prefill, cut lists without BALANCE, ran 0.5% slower with it).
WAVE_LIMIT = 0.9


#: Key tiles a piece of a decoding call's cut row block holds at least
#: (:func:`packed_pieces`).
PIECE_TILES = 4
#: A row block of fewer than SHORT_CUT_TILES key tiles is cut into SHORT_CUT_PIECES
#: pieces or more, or none (:func:`packed_pieces`)
SHORT_CUT_PIECES = 4
SHORT_CUT_TILES = 32


def packed_pieces(blocks: int, key_tiles: int, sms: int) -> int:
    """Pieces each row block of a decoding call's packed batch is cut into along its
    keys (SPLIT_KV): the SMs each of its ``blocks`` row blocks has to itself, but no
    fewer than :data:`PIECE_TILES` of the cache's ``key_tiles`` a piece (the host knows
    the cache's capacity, not its lengths; a piece of a shorter sequence may hold none,
    :func:`~flashscope.kernels.sm90_worklist._range`); a block of fewer than
    :data:`SHORT_CUT_TILES` key tiles into :data:`SHORT_CUT_PIECES` or more, or none.

    Why: two or three pieces take at most a half or two thirds of a short read's tiles
    off each program, less than the merge kernel and its partials cost. H200, bf16, D =
    128, GQA 8:1 at 4 and 16 tokens (32 and 128 rows), B = 4-11, 3 rounds interleaved,
    GPU time uncut over cut: 2 pieces at 8 key tiles 1.03-1.17x (dense and 16-key
    pages), at 16 and 24 tiles 1.03-1.08x, 3 pieces at 12 tiles 1.00-1.08x; 4 pieces at
    16 tiles 0.95x dense and 0.81x paged (the cut faster), 8 and 16 pieces at 32-64
    tiles 0.31-0.54x."""
    pieces = max(1, min(sms // max(1, blocks), key_tiles // PIECE_TILES))
    if pieces < SHORT_CUT_PIECES and key_tiles < SHORT_CUT_TILES:
        return 1
    return pieces


def wave_share(tiles: int, sms: int) -> float:
    """The share of ``sms`` busy over the waves ``tiles`` equal tiles take."""
    return tiles / (-(-tiles // sms) * sms)


def fit(cfg: Sm90FwdConfig, problem: Problem) -> Sm90FwdConfig:
    """A tuned entry or rule's config fitted to the problem's sizes (entries are tuned on
    lengths in whole thousands and batches that fill the GPU):

    - a 192-row tile gives way to a 128-row one where it pads :data:`ROW_PAD_LIMIT` times
      as many query rows (short rows such as a ViT's 197 tokens);
    - a non-causal problem whose tiles leave the SMs under :data:`WAVE_LIMIT` busy cuts
      its work list along the keys (SPLIT_KV, without BALANCE), when its batch x heads is
      known and it is not a band or a packed batch (which run with :data:`BAND_KNOBS`
      and :data:`PACKED_KNOBS` off).

    Everything else is kept; a change the rules refuse is not made."""
    out = cfg
    n = max(1, int(problem.n_q))
    if out.BLOCK_M == 192 and _padded(n, 192) > ROW_PAD_LIMIT * _padded(n, 128):
        out = out.replace(BLOCK_M=128)
    if (not problem.causal and not problem.window and not problem.varlen and not out.SPLIT_KV
            and problem.heads > 0
            and wave_share(-(-n // out.BLOCK_M) * problem.heads, problem.units) < WAVE_LIMIT):
        out = out.replace(SPLIT_KV=True, BALANCE=False)
    if out is cfg:
        return cfg
    try:
        return check(out, problem.target, problem.head_dim, problem.dtype)
    except ConfigError:
        return cfg


def tensors_problem(q, k, v, scale: "float | None" = None) -> Optional[str]:
    """Why the kernel cannot run on these tensors, or None: head dim, scale > 0 (it folds
    the scale into the row maximum) and a rank-4 TMA descriptor for each."""
    if not head_dim_ok(q.shape[-1]):
        return f"head dim {q.shape[-1]}"
    if scale is not None and scale <= 0:
        return f"scale {scale} (needs > 0)"
    for name, x in (("query", q), ("key", k), ("value", v)):
        why = _desc_problem(x)
        if why:
            return f"{name}: needs {why}"
    return None


# -- descriptors ---------------------------------------------------------------------------

def _desc_problem(x) -> Optional[str]:
    """Why ``x`` (B, H, N, D), or any tensor of rank 5 or less, has no TMA descriptor, or
    None."""
    strides = x.stride()
    if strides[-1] != 1:
        return f"a contiguous last dimension (stride 1), got strides {tuple(strides)}"
    if x.data_ptr() % 16 or not _strides_aligned(strides, x.shape, x.element_size()):
        return (f"a 16-byte aligned base and strides, got strides {tuple(strides)} at base "
                f"address % 16 = {x.data_ptr() % 16}")
    return None


@functools.lru_cache(maxsize=4096)
def _strides_aligned(strides, shape, elt: int) -> bool:
    """16-byte strides on every dimension but the last longer than 1 (cached: asked on
    every call)."""
    return not any(st * elt % 16 for st, n in zip(strides[:-1], shape[:-1]) if n > 1)


def _check_tma(x, name: str) -> None:
    """ConfigError naming ``name`` where ``x`` has no TMA descriptor."""
    why = _desc_problem(x)
    if why:
        raise ConfigError(f"{name}: {KERNEL} needs {why} (pass .contiguous())")


def tma_desc4(x, name: str, rows: int, width: "int | None" = None):
    """A rank-4 Gluon TMA descriptor over ``x`` (B, H, N, D) with its own strides, block
    (1, 1, rows, width) (default: D padded to a power of two). TMA zero-fills rows past N
    of each head and columns past D on loads and clips them on stores. Raises ConfigError
    (naming ``name``) when TMA's alignment rules fail."""
    _check_tma(x, name)
    width = head_dim_pad(x.shape[3]) if width is None else width
    return _descriptor(x, _desc4_fields(x.shape, x.stride(), x.element_size(),
                                        str(x.dtype).removeprefix("torch."), rows, width))


def tma_desc_tokens(x, name: str, width: "int | None" = None):
    """A rank-5 Gluon TMA descriptor over a decoding call's q or output in the caller's
    layout, ``x`` (B, Nq, Hkv, G, D) with G dividing 64, block (1, 64 / G, 1, G, width):
    64 packed rows, 64 / G tokens' G query heads of one kv head (the kernel's GROUPED).
    TMA zero-fills tokens past Nq on loads and clips them on stores. Raises ConfigError
    (naming ``name``) when TMA's alignment rules fail."""
    _check_tma(x, name)
    width = head_dim_pad(x.shape[4]) if width is None else width
    return _descriptor(x, _desc_tokens_fields(x.shape, x.stride(), x.element_size(),
                                              str(x.dtype).removeprefix("torch."), width))


def _descriptor(base, fields: dict):
    """A TensorDescriptor over ``base`` with the other fields given. Its constructor
    re-checks in Python what :func:`tma_desc4` and the rules check (rank, alignment,
    block shape): a few microseconds per descriptor, four per launch. The fields depend
    only on the geometry: they are filled directly."""
    desc = object.__new__(_descriptor_class())
    desc.__dict__.update(fields, base=base)
    return desc


@functools.lru_cache(maxsize=None)
def _descriptor_class():
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor


@functools.lru_cache(maxsize=4096)
def _desc4_fields(shape, strides, elt: int, dtype: str, rows: int, width: int) -> dict:
    """TensorDescriptor fields but the base, for :func:`tma_desc4` (read-only: shared by
    every descriptor of this geometry). Size-1 dimensions never move: they get an aligned
    stride TMA accepts."""
    return dict(shape=list(shape), strides=_aligned_strides(shape, strides, elt),
                block_shape=[1, 1, rows, width],
                layout=_nvmma_layout(rows, width, dtype), padding="zero")


def _aligned_strides(shape, strides, elt: int) -> list:
    """``strides`` with those of size-1 dimensions (which never move) replaced by an
    aligned one TMA accepts."""
    return [st if n > 1 else 16 // elt * max(1, shape[-1])
            for st, n in zip(strides[:-1], shape[:-1])] + [1]


@functools.lru_cache(maxsize=4096)
def _desc_tokens_fields(shape, strides, elt: int, dtype: str, width: int) -> dict:
    """TensorDescriptor fields but the base, for :func:`tma_desc_tokens`."""
    from triton.experimental.gluon import language as gl

    G = shape[3]
    block = [1, 64 // G, 1, G, width]
    return dict(shape=list(shape), strides=_aligned_strides(shape, strides, elt),
                block_shape=block,
                layout=gl.NVMMASharedLayout.get_default_for(block, getattr(gl, dtype)),
                padding="zero")


@functools.lru_cache(maxsize=None)
def _nvmma_layout(rows: int, head_dim: int, dtype: str):
    """The shared-memory layout of a (1, 1, rows, head_dim) TMA block of ``dtype``
    (``bfloat16`` or ``float16``): built once
    per block shape, not on every launch."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], getattr(gl, dtype))


# -- work lists -----------------------------------------------------------------------------

def _list_args(q, n_k: int, cfg: Sm90FwdConfig, programs: int) -> tuple:
    """(n_m, bh, block_m, block_n, n_k, programs, section): the arguments every work list
    of :mod:`flashscope.schedule` starts with, for q's shape and device."""
    from ..launch import l2_bytes, triton_cdiv
    from ..schedule import section_heads

    B, H, Nq, D = q.shape
    section = section_heads(n_k, D, q.element_size(), l2_bytes(q.device), B * H)
    return (triton_cdiv(Nq, cfg.BLOCK_M), B * H, cfg.BLOCK_M, cfg.BLOCK_N, n_k, programs,
            section)


def lpt_tensor(q, n_k: int, cfg: Sm90FwdConfig, programs: int, causal: bool = True):
    """The persistent grid's work list (:func:`flashscope.schedule.lpt_schedule`) for q's
    shape on q's device, built once per shape and device and kept there."""
    return _lpt_on_device(q.device, *_list_args(q, n_k, cfg, programs), causal,
                          q.shape[2] if cfg.BALANCE else None)


@functools.lru_cache(maxsize=256)
def _lpt_on_device(device, n_m, bh, block_m, block_n, n_k, programs, section, causal, n_q):
    from ..schedule import lpt_schedule

    host = lpt_schedule(n_m, bh, block_m, block_n, n_k, programs, section, causal, n_q)
    return _on_device(host, device)


def _on_device(host, device):
    import torch

    if device.type == "meta":
        return torch.empty(host.shape, dtype=torch.int32, device="meta")
    return torch.from_numpy(host.copy()).to(device)


class SplitList(NamedTuple):
    """A SPLIT_KV work list on a device: the kernel's list, the merge table (one row per
    cut block) and the number of workspace slots."""
    sched: "object"
    merges: "object"
    slots: int


def split_tensors(q, n_k: int, cfg: Sm90FwdConfig, programs: int, causal: bool) -> SplitList:
    """The SPLIT_KV work list (:func:`flashscope.schedule.split_schedule`) for q's shape
    on q's device, built once per shape and device."""
    return _split_on_device(q.device, *_list_args(q, n_k, cfg, programs), causal,
                            q.shape[2], bool(cfg.BALANCE), bool(cfg.MASKED_FIRST))


@functools.lru_cache(maxsize=256)
def _split_on_device(device, *args) -> SplitList:
    from ..schedule import split_schedule

    sched, merges, slots = split_schedule(*args)
    return SplitList(_on_device(sched, device), _on_device(merges, device), slots)


@functools.lru_cache(maxsize=256)
def _pieces_on_device(device, tiles: int, pieces: int) -> SplitList:
    """A decoding call's SPLIT_KV (its list is built on the device): every one of the
    ``tiles`` row blocks in ``pieces`` slots of its own, t pieces onward."""
    import numpy as np

    t = np.arange(tiles, dtype=np.int32)
    merges = np.stack([t, t * pieces, np.full_like(t, pieces)], axis=1)
    return SplitList(None, _on_device(merges, device), tiles * pieces)


# -- the launch plan -----------------------------------------------------------------------

class Sm90Plan(NamedTuple):
    """Everything of a launch but the tensors' addresses: the grid, the descriptors' fields
    but their base (q, k, v, out, then with a head-dim tail the tail's four), the scalar
    arguments, the host's work list (or None),
    the constexprs and, once launched, the compiled kernel."""
    grid: tuple
    fields: tuple
    scalars: tuple
    sched: "object"
    consts: dict
    compiled: dict  #: :func:`flashscope.launch.launch_compiled`'s cache, by device
    split: "SplitList | None" = None  #: SPLIT_KV: the merge table and workspace size
    merge_compiled: "dict | None" = None  #: the merge kernel's launch cache
    band: tuple = (0, 0, 0, 0.0, 0.0)  #: OFFSET, LEFT, RIGHT, cap_in, cap_out
    #: a packed batch: (sequences, heads, row blocks a head, list slots L, programs,
    #: pieces a row block), the arguments of its device-built work list
    #: (:meth:`packed_list`)
    packed: "tuple | None" = None
    #: (ADDED_K, PIECES) of a KV cache's grid without a list (LPT = 0: a program for
    #: each entry, :meth:`packed_list`); (0, 1), unread, otherwise
    cache: tuple = (0, 1)

    def packed_list(self, packed):
        """The work list of a packed batch (:class:`~flashscope.launch.Packed`), built on
        its device from the prefix sums (:mod:`flashscope.kernels.packed_worklist`): one
        small launch, no host synchronization. On a meta device, an empty list. A KV
        cache's grid with a program for each entry takes none (LPT = 0): the kernel
        reads the cache's lengths instead (:func:`~flashscope.kernels.sm90_worklist.
        _tile`)."""
        import torch

        if not self.consts["LPT"]:
            return packed.seqused_k
        B, H, n_m, L, P, pieces = self.packed
        split = self.consts["SPLIT"]
        cu = packed.cu_seqlens_q
        sched = torch.empty(P + 1 + (7 if split else 5) * L, dtype=torch.int32,
                            device=cu.device)
        if cu.device.type == "meta":
            return sched
        from .. import kernels
        from ..launch import launch_compiled, triton_cdiv

        kernel = kernels.load("packed_worklist")._packed_list
        grid = (max(1, triton_cdiv(B, LIST_BLOCK_B)), H)
        causal = self.consts["IS_CAUSAL"]
        # a causal head's row blocks cost 1, 2, .. key tiles and pair up folded; a
        # decoding call's see their whole sequence (bottom-right, few tokens), cost the
        # same, and dealt in pairs would leave half the programs idle where they number
        # fewer than two a program
        fold = causal and not self.consts["CACHE"]
        used = packed.seqused_k
        consts = dict(BLOCK_M=self.consts["BLOCK_M"], BLOCK_B=LIST_BLOCK_B,
                      BLOCK_E=LIST_BLOCK_E, FOLD=fold,
                      TOP_LEFT=causal and not self.consts["SHIFTED"], USED=used is not None,
                      SPLIT=split, EARLY=bool(self.consts["CACHE"]))
        launch_compiled(kernel, grid, (cu, packed.cu_seqlens_k, cu if used is None else used,
                                       int(packed.added_k), sched, B, H, n_m, P, L, pieces),
                        consts, {"num_warps": 4, **CODEGEN_OPTIONS})
        return sched

    @property
    def record_width(self) -> int:
        """Columns of a workspace record: the head dim's padded width (the kernel's
        ``_record_width``), which the merge kernel reads."""
        return head_dim_pad(self.consts["HEAD_DIM"] + self.consts["HEAD_TAIL"])

    def workspace(self, q):
        """A float32 workspace for the pieces of cut blocks (SPLIT_KV), else None."""
        if self.split is None:
            return None
        import torch

        rec = self.consts["BLOCK_M"] * (self.record_width + 2)
        return torch.empty(max(1, self.split.slots) * rec, dtype=torch.float32,
                           device=q.device)

    def args(self, q, k, v, out, lse, part=None, trace=None, sched=None,
             table=None) -> tuple:
        """The positional arguments for these tensors (``lse=None``: ``out`` in its slot;
        ``part``: the workspace of :meth:`workspace`, unread without SPLIT_KV; ``trace``:
        the clock-stamp buffer of a TRACE build, unread otherwise; ``sched``: a packed
        batch's list, :meth:`packed_list`; ``table``: a paged cache's block table, unread
        without PAGE)."""
        descs = [_descriptor(x, f) for x, f in zip((q, k, v, out) * 2, self.fields)]
        tails = descs[4:] or (None,) * 4
        lse_arg = lse if lse is not None else out
        if sched is None:  # unread without a list
            sched = self.sched if self.sched is not None else lse_arg
        if part is None:
            part = self.workspace(q) if self.split is not None else lse_arg
        pages = (sched, 0, 0) if table is None else (table, table.stride(0),
                                                       table.shape[1])
        return (*descs[:4], lse_arg, sched, part, *self.scalars,
                trace if trace is not None else sched, *self.band, out, *tails, *pages,
                *self.cache)

    def merge(self, part, out, lse, early: bool = False) -> None:
        """Combine the cut blocks' pieces in ``part`` into ``out`` (and ``lse``): the
        second kernel of a SPLIT_KV forward (:mod:`flashscope.kernels.attention_merge`).
        ``early``: the forward was launched early (:func:`_options`: a KV cache's grid,
        which lets the merge in at its start); the merge then is too, and waits for the
        grid itself."""
        if self.split is None or self.split.slots == 0:
            return
        from .. import kernels
        from ..launch import launch_compiled, triton_cdiv

        H, N_Q = self.scalars[0], self.scalars[2]
        block_m, d = self.consts["BLOCK_M"], self.record_width
        kernel = kernels.load("attention_merge")._merge_parts
        blocks = self.split.merges.shape[0]
        if self.packed is None:
            strides = (*out.stride(), H * N_Q, N_Q, 0, 0)
            grid = (blocks, block_m // 64)
            consts = dict(ROWS=64)
        else:
            o, l_ = out.stride(), (lse if lse is not None else out).stride()
            if self.consts["GROUPED"]:  # the caller's (B, Nq, Hkv, G, D), Lse (B, H, Nq)
                G = out.shape[3]
                strides = (o[0], o[2], o[1], o[4], l_[0], G * l_[1], o[3], l_[1])
            else:  # sequence b's rows are rows b N_Q.. of (1, H, B N_Q)
                G = 0
                strides = (N_Q * o[2], o[1], o[2], o[3], N_Q * l_[2], l_[1], 0, 0)
            grid = (blocks, block_m // MERGE_ROWS, d // MERGE_COLS)
            chunk = min(MERGE_CHUNK, 1 << (self.packed[5] - 1).bit_length())
            consts = dict(ROWS=MERGE_ROWS, COLS=MERGE_COLS, CHUNK=chunk, GROUP=G)
        args = (part, self.split.merges, out, lse if lse is not None else part, H, N_Q,
                triton_cdiv(N_Q, block_m), out.shape[-1], *strides)
        consts.update(HEAD_DIM=d, BLOCK_M=block_m, RETURN_LSE=lse is not None, EARLY=early)
        # one stage: a pipelined loop over the chunks would stage each chunk's loads in
        # shared memory (38 us against 5 for 64 blocks of 2 pieces, H200)
        options = {"num_warps": 4, "num_stages": 1, **CODEGEN_OPTIONS}
        if early:
            options["launch_pdl"] = True
        launch_compiled(kernel, grid, args, consts, options, cache=self.merge_compiled)


#: plans by :func:`plan_key`; emptied when it reaches :data:`_PLANS_MAX`.
_PLANS: dict = {}
_PLANS_MAX = 256


def _as_mask(mask):
    """A :class:`~flashscope.masks.Mask`, or the causal flag that stands for one."""
    from ..masks import Mask

    return mask if isinstance(mask, Mask) else Mask.of(bool(mask))


def _packed_key(packed) -> "tuple | None":
    """A packed batch's part of :func:`plan_key`: its sequences, longest lengths, whether
    it reads a cache's lengths (the keys they add), its query rows a position, and a
    paged cache's page size and block table's geometry."""
    if packed is None:
        return None
    table = packed.block_table
    return (packed.batch, int(packed.max_seqlen_q), int(packed.max_seqlen_k),
            packed.seqused_k is not None, int(packed.added_k), int(packed.row_group),
            int(packed.page), None if table is None else (tuple(table.shape),
                                                            tuple(table.stride())))


def plan_key(q, k, v, out, lse, mask, scale: float, cfg: Sm90FwdConfig,
             trace: int, packed=None) -> tuple:
    """What a launch depends on besides data addresses: the device, dtype, shapes and
    strides, each tensor's 16-byte alignment, the mask (a Mask, or a causal flag), scale,
    config and a packed batch's sequences and longest lengths. It determines every
    runtime argument's specialization and every constexpr, so it also keys compiled
    kernels."""
    from ..launch import geometry_key

    return (geometry_key(q, k, v), out.stride(), out.data_ptr() % 16,
            None if lse is None else lse.data_ptr() % 16, _as_mask(mask), float(scale),
            cfg, trace, _packed_key(packed))


def plan(q, k, v, out, lse, *, scale: float, cfg: Sm90FwdConfig, causal: bool = False,
         mask=None, trace: int = 0, packed=None) -> Sm90Plan:
    """The :class:`Sm90Plan` of a launch, built on the first call of its :func:`plan_key`
    and then looked up: on short rows the host builds a launch in about the time the GPU
    runs it, and the descriptor checks, divisions and argument lists are the same every
    time. ``mask``: a :class:`~flashscope.masks.Mask` (a band refuses
    :data:`BAND_KNOBS`), else ``causal`` alone. ``trace``: TRACE = R rows of clock stamps
    per program (0: none). ``packed``: a :class:`~flashscope.launch.Packed` batch, q and
    out (1, H, total_q, D), or a decoding call's in its caller's layout (B, Nq, Hkv, G, D;
    :func:`tma_desc_tokens`), k and v (1, Hkv, total_k, D) (:data:`PACKED_KNOBS` refused)."""
    from ..launch import remembered

    mask = _as_mask(causal if mask is None else mask)
    return remembered(_PLANS, plan_key(q, k, v, out, lse, mask, scale, cfg, trace, packed),
                      lambda: _build_plan(q, k, v, out, lse, mask, scale, cfg, trace,
                                          _packed_key(packed)),
                      _PLANS_MAX)


#: a packed batch's list kernel: sequences a program places (and ranks others by at
#: once), and row blocks of a head it places at once
LIST_BLOCK_B, LIST_BLOCK_E = 32, 64
#: the merge of a decoding call's pieces: rows and columns a program, pieces a round of
#: loads (:func:`flashscope.kernels.attention_merge.merge_chunks`; the decoding family's
#: merge takes the same shape)
MERGE_ROWS, MERGE_COLS, MERGE_CHUNK = 16, 32, 16


def _build_plan(q, k, v, out, lse, mask, scale, cfg, trace, packed_shape=None) -> Sm90Plan:
    """``packed_shape``: a packed batch's (sequences, longest query and key lengths),
    :func:`_packed_key`."""
    from ..launch import LOG2E, divider, sm_count, triton_cdiv

    grouped = q.dim() == 5  # a decoding call's q and out in the caller's layout
    if grouped:  # (B, Nq, Hkv, G, D); B and Nq come with the packed batch
        B, Nq, H, D = 1, 0, q.shape[2], q.shape[4]
    else:
        B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    packed = packed_shape is not None
    check_packed(cfg, packed_shape, D)
    lengths = (Nq, Nk)
    row_group, cache, page, added = 1, False, 0, 0
    if packed:  # the grid's lengths are the longest; each sequence's, on the device (the
        B, Nq, Nk, cache, added, row_group, page = packed_shape[:7]  # mask's OFFSET too)
        lengths = (None, None)
    check_band(cfg, mask, *lengths, cache=cache)
    causal = mask.causal
    band = mask.banded(*lengths)
    n_m = triton_cdiv(Nq, cfg.BLOCK_M)
    tiles = n_m * B * H
    # a host work list for causal grids, and non-causal ones with BALANCE or SPLIT_KV
    # (whose pieces may outnumber the blocks: one program per SM); a band runs round
    # robin (its blocks cost about the same: the band's width); a packed batch runs the
    # list its device builds (:meth:`Sm90Plan.packed_list`), whatever the mask, but a KV
    # cache's grid of a program an entry (below)
    lpt = packed or (bool(causal or cfg.BALANCE or cfg.SPLIT_KV) and not band)
    split = bool(cfg.SPLIT_KV)
    programs = sm_count(q.device) if split else min(tiles, sm_count(q.device))
    main, tail = head_parts(D)
    kv_rows = min(page, cfg.BLOCK_N) if page else cfg.BLOCK_N  # a TMA copy of K or V
    regs, loaders = (CONSUMER_REGS[cfg.consumers], PRODUCER_REGS), 1
    if kv_rows < cfg.BLOCK_N and cfg.consumers == 2:
        regs, loaders = PAGED_REGS, PAGED_LOADERS
    fields = tuple({n: v for n, v in d.__dict__.items() if n != "base"}
                   for width in ((main, tail) if tail else (main,))
                   for d in (_rows_desc(q, "query", width),
                             tma_desc4(k, "key", kv_rows, width),
                             tma_desc4(v, "value", kv_rows, width),
                             _rows_desc(out, "out", width)))
    cap_in, cap_out = mask.cap_args(scale)
    scalars = (H, H // Hkv, Nq, Nk, B * H, 1.0 if mask.softcap else scale * LOG2E,
               *divider(n_m), *divider(H), *divider(H // Hkv))
    switches = mask.switches(*lengths) if band else dict(HAS_LEFT=False, HAS_RIGHT=False,
                                                          SHIFTED=False)
    consts = dict(HEAD_DIM=main, HEAD_TAIL=tail, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                  STAGES=cfg.num_stages, K_EARLY=bool(cfg.K_EARLY),
                  IS_CAUSAL=bool(causal), RETURN_LSE=lse is not None,
                  LPT=(2 if causal or cfg.BALANCE else 1) if lpt else 0,
                  PINGPONG=bool(cfg.PINGPONG),
                  RESCALE_TAU=RESCALE_TAU if cfg.LAZY_RESCALE else 0,
                  EARLY_Q=bool(cfg.EARLY_Q), MASKED_FIRST=bool(cfg.MASKED_FIRST),
                  TRACE=int(trace), OUT_RCP=bool(cfg.OUT_RCP), Q_REGS=bool(cfg.Q_IN_REGS),
                  SPLIT=split, CONSUMER_REGS=regs[0], PRODUCER_REGS=regs[1],
                  HAS_LEFT=switches["HAS_LEFT"],
                  HAS_RIGHT=switches["HAS_RIGHT"], SHIFTED=switches["SHIFTED"],
                  SOFTCAP=mask.softcap is not None, VARLEN=packed, ROW_GROUP=row_group,
                  CACHE=cache, PAGE=page, GROUPED=grouped, LOADERS=loaders)
    grid = (programs,)
    band_args = (*mask.scalars(*lengths), cap_in, cap_out)
    if packed:  # the list is built per call (:meth:`Sm90Plan.packed_list`); a decoding
        pieces = 1  # call's with SPLIT_KV cuts each row block into pieces
        lists = None
        if split:
            pieces = packed_pieces(tiles, triton_cdiv(Nk, cfg.BLOCK_N), sm_count(q.device))
            programs = min(tiles * pieces, programs)
            lists = _pieces_on_device(q.device, tiles, pieces)
        direct = (0, 1)
        if cache and tiles * pieces <= programs:
            # a KV cache's entries run all at once, one a program: their order is moot,
            # and the list's launch (about 3 us and its gap, H200) would be the cost
            consts["LPT"] = 0
            direct = (int(added), pieces)
        return Sm90Plan((programs,), fields, scalars, None, consts, {}, lists,
                        {} if split else None, band_args,
                        (B, H, n_m, tiles * pieces, programs, pieces), direct)
    if split:
        lists = split_tensors(q, Nk, cfg, programs, causal)
        return Sm90Plan(grid, fields, scalars, lists.sched, consts, {}, lists, {},
                        band_args)
    sched = lpt_tensor(q, Nk, cfg, programs, causal) if lpt else None
    return Sm90Plan(grid, fields, scalars, sched, consts, {}, band=band_args)


def _rows_desc(x, name: str, width: int):
    """Q's or the output's descriptor: rank 4 over (B, H, N, D) with 64-row blocks, or
    rank 5 over a decoding call's (B, Nq, Hkv, G, D) (:func:`tma_desc_tokens`)."""
    if x.dim() == 5:
        return tma_desc_tokens(x, name, width)
    return tma_desc4(x, name, 64, width)


def call(q, k, v, out, lse, *, mask, scale: float, cfg: Sm90FwdConfig, packed=None):
    """(grid, positional args, constexpr keywords) of one launch (offline compilation binds
    these on meta tensors; a packed batch's list is then an empty one of its size)."""
    p = plan(q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg, packed=packed)
    sched = p.packed_list(packed) if packed is not None else None
    table = packed.block_table if packed is not None else None
    return p.grid, p.args(q, k, v, out, lse, sched=sched, table=table), dict(p.consts)


# -- launches -------------------------------------------------------------------------------

def _check_run(q, scale: float) -> None:
    from ..launch import interpreting

    if q.device.type != "cuda" or interpreting():
        raise ConfigError(f"{KERNEL} runs on an sm_90 GPU only: Triton's interpreter cannot "
                          "run Gluon kernels (use triton-fwd on CPU tensors)")
    if scale <= 0:
        raise ConfigError(f"{KERNEL} needs scale > 0 (it folds the scale into the row "
                          f"maximum), got {scale} (use triton-fwd)")


def _options(p: Sm90Plan, cfg: Sm90FwdConfig, device) -> dict:
    """Plan ``p``'s launch keywords: a KV cache's forward is launched with programmatic
    stream serialization (``launch_pdl``), so that it starts under the kernel before it
    (its work list, the append, or the caller's) and waits for it only where it first
    reads memory (:func:`~flashscope.kernels.sm90_sync._grid_wait`), on the devices that
    launch the decoding family's kernels so (:func:`flashscope.launch.early_launch`)."""
    from ..launch import early_launch, launch_options

    options = launch_options(cfg, device)
    if p.consts["CACHE"] and early_launch(device):
        options["launch_pdl"] = True
    return options


def run(q, k, v, out, lse, *, mask, scale: float, cfg: Sm90FwdConfig, packed=None) -> None:
    """Launch the kernel (and the merge of a SPLIT_KV list) on an sm_90 GPU."""
    _check_run(q, scale)
    p = plan(q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg, packed=packed)
    _launch(p, _options(p, cfg, q.device), q, k, v, out, lse,
            p.packed_list(packed) if packed is not None else None,
            packed.block_table if packed is not None else None)


def bind(q, k, v, out, lse, *, mask, scale: float, cfg: Sm90FwdConfig, packed=None):
    """:func:`run` for every later launch on tensors of these tensors' geometry, with the
    plan looked up once (:class:`flashscope.launch.BoundForward`): a function of (q, k,
    v, out, lse), or with ``packed`` of (q, k, v, out, lse, packed) for packed batches of
    its sequences and longest lengths (:func:`_packed_key`), whose list each launch
    builds."""
    _check_run(q, scale)
    p = plan(q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg, packed=packed)
    options = _options(p, cfg, q.device)
    if packed is not None:
        return lambda q, k, v, out, lse, packed: _launch(p, options, q, k, v, out, lse,
                                                         p.packed_list(packed),
                                                         packed.block_table)
    return lambda q, k, v, out, lse: _launch(p, options, q, k, v, out, lse)


def _launch(p: Sm90Plan, options: dict, q, k, v, out, lse, sched=None,
            table=None) -> None:
    """Plan ``p``'s launch on these tensors (``sched``: a packed batch's list) and the
    merge of its cut blocks."""
    from ..launch import launch_compiled

    part = p.workspace(q)
    launch_compiled(_kernel(), p.grid,
                    p.args(q, k, v, out, lse, part, sched=sched, table=table),
                    p.consts, options, cache=p.compiled)
    p.merge(part, out, lse, options.get("launch_pdl", False))


@functools.lru_cache(maxsize=None)
def _kernel():
    from .. import kernels

    return getattr(kernels.load(MODULE), FUNCTION)
