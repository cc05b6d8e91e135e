"""Decoding with a KV cache (``triton-decode``): a few query tokens per sequence against a
dense or paged cache of per-sequence length, the KV heads' query groups packed into the
rows of one tile and the keys split across programs when the grid would not fill the GPU
(:mod:`flashscope.kernels.attention_decode`).

Its record (:class:`TritonDecodeConfig`), rules (:data:`RULES`), defaults (:func:`select`,
with the split rule :func:`split_count`) and the argument lists of its three launches:
the append of new keys and values (:func:`append_call`), the attention (:func:`call`)
and the merge of the splits (:func:`merge_call`); :func:`run` launches them. Which calls
run on the sm_90 forward instead is decided here too (:func:`forward_rows`: wide rows, and
up to 32 rows read whole, :func:`narrow_rows`); :mod:`flashscope.kvcache` launches them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, NamedTuple, Optional

from ..compat import CODEGEN_OPTIONS
from .base import (CAPS, DTYPE_BYTES, WARPS, Knobs, Problem, Rule, check_head_dim, check_rules,
                   head_dim_pad, pow2, pow2_tiles, shared_memory, stages, table_select,
                   unit_consts)

KERNEL = "triton-decode"
MODULE = "attention_decode"
#: the launches, in order: name -> the kernel's function
FUNCTIONS = {"decode_append": "_decode_append", KERNEL: "_decode_fwd",
             "decode_merge": "_decode_merge"}
FUNCTION = FUNCTIONS[KERNEL]
#: The append copies one token's heads a program and the merge reads a few float32 rows a
#: split: both memory-bound and small, launched with fixed options.
SMALL_OPTIONS = {"num_warps": 4, "num_stages": 1, **CODEGEN_OPTIONS}
#: The merge: a program combines MERGE_ROWS rows x MERGE_COLS columns of a work tile,
#: MERGE_CHUNK splits' slots loaded at once (16 x 16 x 32 float32: 64 a thread of 4
#: warps). A split's slots are read in one round of loads a chunk, not one after another:
#: on an H100 the merge of 50 splits took 16 us one slot at a time (8 programs).
MERGE_ROWS = 16
MERGE_COLS = 32
MERGE_CHUNK = 16
#: most splits of a work tile (each costs a workspace slot and a pass of the merge)
MAX_SPLITS = 256
#: fewest key tiles a split is given. One: on an H100 a 1024-key cache at B = 1 and 2 read
#: fastest cut into 8 splits of one 128-key tile each (a short read is all latency, and
#: more programs overlap more of it), 5-9% ahead of 4 splits of two tiles
MIN_SPLIT_TILES = 1
#: K and V bytes a GPU needs loading per SM (CU) to read at its memory's bandwidth: the
#: splits aim for the programs that together keep that much in flight
#: (:func:`in_flight_bytes`), no more. On an H100 66 programs of 128 KB each (D = 128 and
#: 256) read as fast as 132 of them, 132 of 64 KB (D = 64) faster than 66; a split
#: past that only adds slots to merge.
IN_FLIGHT_PER_SM = 64 * 1024
#: most packed rows of a tile whose programs keep pace with their loads on mma.sync
#: (on sm_90's wgmma: :data:`WGMMA_ROWS`). A program's products per key tile grow with its
#: rows (BLOCK_M flops per K/V byte loaded): on an H100, tiles of 32 rows (mma.sync) and
#: 128 (wgmma; GQA 8:1 at 4 and 16 query tokens) read up to 1.4x slower at the byte
#: target than with one program an SM; tiles of 16 rows (one token, GQA up to 16:1) and
#: 64 on wgmma (GQA 4:1 at 16 tokens) as fast or up to 9% faster.
STREAM_ROWS = 16
#: stages of a paged launch with more programs than SMs or one key tile a split
#: (:func:`shallow_paged`)
SHALLOW_PAGED_STAGES = 2
#: key tiles from which a split that only the one-program-an-SM grid asks for
#: (:func:`readers`: wide tiles, paged caches) may add the merge launch to an unsplit grid
#: (:func:`merge_pays`): a shorter read is latency more than bytes, and the merge's launch
#: costs what the second program an SM saves. H100, one query token and 16 (GQA 4:1), D =
#: 128, 16-key pages, B = 8 (64 programs unsplit, 128 at two splits): unsplit 10% faster
#: at 8 key tiles, as fast at 16, 4% slower at 32
LONG_READ_TILES = 32
#: rows of an sm_90 tile below wgmma's (mma.sync) from which a short read's program is
#: bound by its chain of products and softmax, one key tile after another, more than by
#: its bytes, so that a second program a work tile pays for the merge (:func:`merge_pays`)
CHAIN_ROWS = 32
#: K and V bytes an SM keeps loading (:data:`IN_FLIGHT_PER_SM`) on GPUs whose memory
#: needs more in flight than their target's example product (a word of the driver's
#: device name: bytes), on reads of :data:`LONG_READ_TILES` key tiles and more
#: (:func:`in_flight_per_sm`). H200 (HBM3e,
#: 4.8 TB/s against the H100's 3.35), bf16, D = 128, GQA 4:1, 1-16 query tokens, GPU time
#: against the H100's 64 KB, same run: B = 8 at 8k keys 1.14-1.20x (one program a work
#: tile read 2.9 TB/s), 32k 1.31-1.36x, 128k 1.39x; B = 2 1.03-1.10x at 8k, 1.17-1.33x
#: from 32k; B = 1 0.95-1.03x at 8k, 1.07-1.27x from 32k; D = 256, B = 8, 8k 1.20x. At 1k
#: keys (8 key tiles) the split it adds cost 0.90-0.97x at B = 8 and 0.92x at B = 2 with
#: 16 tokens: a short read is latency, not bytes.
IN_FLIGHT_BY_GPU = {"H200": 128 * 1024}
#: most key tiles of a cache on which wgmma tiles of 128 rows are cut to 64
#: (:func:`cut_rows`). H100, GQA 8:1, 16 query tokens, B = 1-8, GPU time against 128 rows:
#: 0.99-1.37x at 8-32 key tiles (D = 64, 128, 256, dense and paged); at 64, 0.70-1.14x
CUT_MAX_TILES = 32
#: key tiles of wgmma tiles on those short caches, and their stages with at most one
#: program an SM and with more (:func:`narrow_keys`)
NARROW_BLOCK_N = 64
NARROW_STAGES = (4, 3)
#: key tiles of the table's width up to which a dense cache's tiles of
#: :data:`STREAM_ROWS` rows whose programs outnumber the SMs take
#: :data:`NARROW_BLOCK_N`-key tiles in 4 stages (:func:`short_read_keys`)
SHORT_READ_TILES = 8
#: stages of D = 64's 16-row mma.sync tiles: of more than two programs an SM on a dense
#: cache (:func:`narrow_head_stages`), of one to two on a paged one (:func:`paged_stages`)
NARROW_HEAD_STAGES = 4
#: most fp32 scores (BLOCK_M x BLOCK_N over the threads) a thread of a wgmma tile holds
#: at any cache length: past it the key tiles are narrowed as on short caches
#: (:func:`narrow_keys`)
SCORES_PER_THREAD = 64
#: products a thread may hold in the reduce path (rows x keys x padded head dim over the
#: threads), past which they spill instead of staying in registers
REDUCE_PRODUCTS = 128


@dataclass(frozen=True)
class TritonDecodeConfig(Knobs):
    """Knobs of the decoding kernel.

    BLOCK_M packed rows (query heads of one kv head x query tokens) per work tile, BLOCK_N
    keys per step; ``num_warps``, ``num_stages`` (the software pipeline's depth over the
    key tiles: K and V tiles in flight + 1, as Triton counts a dense launch's stages; a
    paged launch passes Triton :func:`triton_stages`). DOT: Q K^T and P V on the tensor
    cores (``tl.dot``, at least 16 rows, the padding rows computed too); without it each
    key tile is multiplied into the rows and reduced on the CUDA cores. SPLITS: programs
    that share each work tile's keys (1: no split, no workspace, no merge).
    ``maxnreg``/``waves_per_eu``: the vendor register caps, as in the forward."""

    KERNEL: ClassVar[str] = KERNEL

    BLOCK_M: int = 16
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 3
    DOT: bool = True
    SPLITS: int = 1
    maxnreg: Optional[int] = None
    waves_per_eu: Optional[int] = None

    def _label_parts(self) -> list:
        return [f"{self.BLOCK_M}x{self.BLOCK_N}", f"w{self.num_warps}", f"s{self.num_stages}",
                *([] if self.DOT else ["reduce"]),
                *([f"split={self.SPLITS}"] if self.SPLITS > 1 else []), *self._caps()]


Config = TritonDecodeConfig


def in_flight_bytes(cfg: TritonDecodeConfig, head_dim: int, dtype: str = "bfloat16") -> int:
    """K and V bytes one program keeps loading: the tiles of every stage but the one it
    computes on."""
    return 2 * cfg.BLOCK_N * head_dim_pad(head_dim) * DTYPE_BYTES[dtype] \
        * max(1, cfg.num_stages - 1)


def min_shared_bytes(cfg: TritonDecodeConfig, head_dim: int, dtype: str = "bfloat16",
                     target=None) -> int:
    """A lower bound on shared memory, in bytes: with DOT, the K and V tiles (BLOCK_N x
    D_pad each) the tensor cores read from shared memory, max(1, S - 1) copies of each in
    flight for S stages (:func:`in_flight_bytes`; as the forward's bound). On sm_90 from
    :data:`WGMMA_ROWS` rows Triton issues wgmma, which reads its operands from shared
    memory: S copies of K and V, plus Q's tile (read from the sm_90 binaries: 112 KB at
    64 x 64 x 128, 3 stages; 128 KB at 128 rows). The reduce path reads K and V from
    registers: 0."""
    if not cfg.DOT:
        return 0
    tile = head_dim_pad(head_dim) * DTYPE_BYTES[dtype]
    if _wgmma(cfg, target):
        return 2 * cfg.BLOCK_N * tile * cfg.num_stages + cfg.BLOCK_M * tile
    return in_flight_bytes(cfg, head_dim, dtype)


#: fewest rows of a DOT tile Triton issues sm_90's wgmma for (fewer: mma.sync)
WGMMA_ROWS = 64


def _sm90_dot(cfg: TritonDecodeConfig, target) -> bool:
    """Whether ``cfg``'s products run on ``target``'s tensor cores and it is sm_90."""
    return target is not None and getattr(target, "cc", 0) == 90 and bool(cfg.DOT)


def _wgmma(cfg: TritonDecodeConfig, target) -> bool:
    """Whether Triton builds ``cfg``'s products as sm_90 wgmma on ``target``."""
    return _sm90_dot(cfg, target) and cfg.BLOCK_M >= WGMMA_ROWS


def _rows(cfg, ctx):
    if not (pow2(cfg.BLOCK_M) and cfg.BLOCK_M <= 128):
        return f"{KERNEL}: BLOCK_M={cfg.BLOCK_M}: expected a power of two in 1..128"
    if cfg.DOT and cfg.BLOCK_M < 16:
        return (f"{KERNEL}: BLOCK_M={cfg.BLOCK_M} with DOT=1: tensor-core products take at "
                "least 16 rows (use DOT=0 for fewer)")
    if not cfg.DOT:
        threads = cfg.num_warps * ctx.target.warp_size
        held = cfg.BLOCK_M * cfg.BLOCK_N * head_dim_pad(ctx.head_dim) // threads
        if held > REDUCE_PRODUCTS:
            return (f"{KERNEL}: DOT=0 with BLOCK_M={cfg.BLOCK_M}, BLOCK_N={cfg.BLOCK_N}, head "
                    f"dim {ctx.head_dim} holds {held} products a thread, over "
                    f"{REDUCE_PRODUCTS} (they would spill; use DOT=1 or smaller tiles)")
    return None


def _splits(cfg, ctx):
    if not (1 <= cfg.SPLITS <= MAX_SPLITS):
        return f"{KERNEL}: SPLITS={cfg.SPLITS}: expected 1..{MAX_SPLITS}"
    return None


RULES = (
    Rule("BLOCK_M,DOT", "rows of a tile; the tensor cores' smallest M", _rows),
    pow2_tiles("BLOCK_N"),
    WARPS,
    stages(1, 8),
    CAPS,
    Rule("SPLITS", "programs sharing a work tile's keys", _splits),
    shared_memory(min_shared_bytes, lambda c: f"BLOCK_M={c.BLOCK_M}, BLOCK_N={c.BLOCK_N}",
                  per_target=True),
)

#: the values a one-knob search steps along (:func:`~.base.neighbours`)
STEPS = {"BLOCK_M": (1, 2, 16, 32, 64, 128), "BLOCK_N": (16, 32, 64, 128, 256),
         "num_warps": (1, 2, 4, 8, 16), "num_stages": (1, 2, 3, 4, 5, 6),
         "SPLITS": (1, 2, 4, 8, 16, 32, 64, 128, 256),
         "maxnreg": (96, 128, 168, 232, None), "waves_per_eu": (1, 2, 3, 4, None)}


def triton_stages(cfg: TritonDecodeConfig, paged: bool) -> int:
    """The ``num_stages`` a launch passes Triton. Triton's pipeliner divides a loop's S - 1
    stages of load latency evenly among the loads of a chain: paged, each K and V load
    waits on a block-table read, so S stages would leave K and V (S - 1) / 2 tiles in
    flight (one buffer at S = 3, seen in the sm_90 TTGIR); 2 S - 1 stages give them the
    dense launch's S - 1."""
    return 2 * cfg.num_stages - 1 if paged else cfg.num_stages


def check(cfg: TritonDecodeConfig, target="sm90", head_dim: int = 128,
          dtype: str = "bfloat16") -> TritonDecodeConfig:
    """``cfg`` unchanged if it can be built for ``target``; else ConfigError naming the
    knob and the limit it breaks."""
    return check_rules(cfg, RULES, target, head_dim, dtype)


# -- defaults ------------------------------------------------------------------------------

# Tiles and pipeline depth as data: (target name or family, largest head dim, causal or
# None for both) -> config; BLOCK_M, DOT and SPLITS are set per problem by select().
# NVIDIA: 32 KB key tiles (128 keys at D <= 128, 64 at D = 256) of 3 stages, two tiles of
# K and V in flight (128 KB) and one program an sm_90 SM: on an H100 (D = 128, one query
# token, GQA 4:1 and 8:1, 8k-128k keys) one such program an SM read 2.6-3.1 TB/s, where
# three programs of 64-key tiles an SM read 2.3-2.8. AMD's pipeliner takes 2 stages,
# RDNA's 64 KB LDS one; not timed.
C = TritonDecodeConfig
DEFAULTS = (
    ("nvidia", 128, None, C(BLOCK_N=128, num_warps=4, num_stages=3)),
    ("nvidia", 256, None, C(BLOCK_N=64, num_warps=4, num_stages=3)),
    ("cdna", 128, None, C(BLOCK_N=64, num_warps=4, num_stages=2)),
    ("cdna", 256, None, C(BLOCK_N=32, num_warps=4, num_stages=2)),
    ("rdna", 256, None, C(BLOCK_N=32, num_warps=4, num_stages=1)),
)
del C


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def packed_rows(problem: Problem) -> int:
    """Rows of a sequence's kv head: its query heads times the query tokens."""
    return max(1, problem.group) * max(1, problem.n_q)


def in_flight_per_sm(device: str, key_tiles: int = LONG_READ_TILES) -> int:
    """K and V bytes an SM (CU) of GPU ``device`` (:attr:`Problem.device`) needs loading
    to read a cache of ``key_tiles`` key tiles at the memory's bandwidth:
    :data:`IN_FLIGHT_BY_GPU` where it names the GPU and the read is long, else
    :data:`IN_FLIGHT_PER_SM`."""
    if key_tiles < LONG_READ_TILES:
        return IN_FLIGHT_PER_SM
    words = device.split()
    return next((v for k, v in IN_FLIGHT_BY_GPU.items() if k in words), IN_FLIGHT_PER_SM)


def byte_readers(cfg: TritonDecodeConfig, head_dim: int, dtype: str, units: int,
                 per_sm: int = IN_FLIGHT_PER_SM) -> int:
    """Programs that keep ``per_sm`` bytes (:func:`in_flight_per_sm`) loading an SM (CU)
    of ``units`` at :func:`in_flight_bytes` a program, never more than one an SM."""
    return max(1, min(units, units * per_sm // in_flight_bytes(cfg, head_dim, dtype)))


def readers(cfg: TritonDecodeConfig, head_dim: int, dtype: str, units: int,
            target=None, paged: bool = False, per_sm: int = IN_FLIGHT_PER_SM) -> int:
    """Programs that together read the cache at the memory's bandwidth on a GPU of
    ``units`` SMs (CUs): those that keep ``per_sm`` bytes loading an SM at
    :func:`in_flight_bytes` a program, for dense caches and tiles whose products keep
    pace with their loads (up to :data:`STREAM_ROWS` rows, :data:`WGMMA_ROWS` where
    ``target`` runs them as wgmma); one an SM for wider tiles and for ``paged`` caches,
    whose programs gather each key tile through the block table at a lower rate (H100,
    16-key pages: 0.81-0.83 of the dense cache's bandwidth at the byte target's single
    program a work tile, 0.95-0.98 at one an SM). Never past one program an SM: a
    second wave's programs run alone."""
    if paged or cfg.BLOCK_M > (WGMMA_ROWS if _wgmma(cfg, target) else STREAM_ROWS):
        return units
    return byte_readers(cfg, head_dim, dtype, units, per_sm)


def split_count(tiles: int, key_tiles: int, readers: int, streams: Optional[int] = None,
                units: Optional[int] = None) -> int:
    """Programs that share each work tile's key tiles: enough that the ``streams`` (the
    kv heads the ``tiles`` work tiles read; default: one each) make up the grid of
    ``readers`` programs (:func:`readers`), but no more than leave each program
    :data:`MIN_SPLIT_TILES` of the ``key_tiles`` tiles, nor :data:`MAX_SPLITS`, nor a
    grid past one program an SM of ``units`` (default ``readers``); none (1) once the
    work tiles alone are that many. The row blocks of one kv head read the same K and
    V (the later reads can hit L2), so the bytes in flight are counted per kv head:
    GQA 8:1 at 16 query tokens, cut into two 64-row blocks (:func:`cut_rows`), read
    fastest on an H100 at B = 2 with 4 splits (45 against 55 us at 8k keys with 2) and
    at B = 4 with 2 (68 against 76).

    Why a target and not as many splits as fit: every split adds a slot to merge and the
    merge's launch, so a split pays only while it adds bandwidth. On an H100 (1 to 16
    query tokens; GQA 4:1 and 8:1; D = 64, 128, 256; 1k-128k keys; B = 1-16 at 8 kv heads,
    against 1-32 splits) the rule's count ran fastest or within 5% of the fastest from 8k
    keys, within 9% at 1k; one program an SM for 16-row tiles (2 splits at B = 8, D =
    128) ran 3-4% slower than none at 8k keys and 11% at 1k."""
    tiles = max(1, tiles)
    per_sm = (readers if units is None else units) // tiles
    return max(1, min(readers // max(1, streams or tiles), per_sm,
                      key_tiles // MIN_SPLIT_TILES, MAX_SPLITS))


def merge_pays(key_tiles: int, splits: int, byte_splits: int, chained: bool = False) -> bool:
    """Whether ``splits`` splits of a cache of ``key_tiles`` key tiles pay for their
    merge where the byte target alone would ask for ``byte_splits``: always where that
    count splits too (the merge is launched anyway, and a program with fewer tiles ends
    sooner: B = 2, one query, 16-key pages, 1k keys: 15.5 us at 8 splits against 17.1
    at 4), from :data:`LONG_READ_TILES` key tiles where it would not (the merge's
    launch costs about what the second program an SM saves on a short read), and at any
    length where each program's tiles are a chain of products (``chained``,
    :func:`_chained`): there the second program halves the chain. H200, 8 sequences x 8
    kv heads (64 programs unsplit), 2 splits against none, the merge launched early:
    32-row tiles (GQA 8:1 at 3 and 4 query tokens, 4:1 at 8; D = 128 and 256) at 1k keys
    1.01-1.12x, at 2k 1.10-1.24x, dense and 16-key pages; 16-row tiles (one token) at 1k
    0.94-0.99x, wgmma's 64 x 64 (GQA 4:1 at 16 tokens) 0.94-0.99x."""
    return splits <= 1 or byte_splits > 1 or key_tiles >= LONG_READ_TILES or chained


def _chained(cfg: TritonDecodeConfig, target) -> bool:
    """Whether ``cfg``'s tile on ``target`` is an sm_90 mma.sync tile of
    :data:`CHAIN_ROWS` rows or more (:func:`merge_pays`): twice the one-token tile's
    products a key tile, issued by warps that wait for each."""
    return _sm90_dot(cfg, target) and CHAIN_ROWS <= cfg.BLOCK_M < WGMMA_ROWS


def cut_rows(rows: int, block_m: int, kv_heads: int, units: int, wgmma: bool,
             key_tiles: int) -> int:
    """BLOCK_M for ``rows`` packed rows a kv head: a tile sm_90 runs as wgmma past
    :data:`WGMMA_ROWS` rows is cut to that many on a short cache (at most
    :data:`CUT_MAX_TILES` ``key_tiles``), where the cut work tiles of the ``kv_heads``
    still make one wave of ``units`` programs. Why: a 128-row program computes two 64-row
    products a key tile on one SM while half the SMs idle; two 64-row programs read the
    same K and V (the later reads can hit L2) on two, and a short read is all latency.
    H100, GQA 8:1, 16 query tokens, B = 1-8 (8-64 kv heads), GPU time against 128 rows:
    D = 64, 128, 256 at 1k-2k keys 0.99-1.37x, dense and paged (D = 128 at 4k: 1.02-1.10x);
    at 8k 0.70-1.14x, at 32k and 128k 0.66-1.06x (the cut grid splits half as often:
    :func:`split_count` counts the bytes in flight per kv head); at B = 16 (256 cut
    programs) 0.88x at 1k."""
    if not wgmma or block_m <= WGMMA_ROWS or key_tiles > CUT_MAX_TILES:
        return block_m
    blocks = -(-rows // WGMMA_ROWS)
    return WGMMA_ROWS if kv_heads * blocks <= units else block_m


def narrow_keys(block_n: int, stages: int, key_tiles: int, programs: int, units: int,
                wgmma: bool, scores: int = 0) -> tuple:
    """(BLOCK_N, num_stages) of a launch of ``programs`` on ``units`` SMs: tiles sm_90
    runs as wgmma, on a short cache (at most :data:`CUT_MAX_TILES` ``key_tiles`` of
    ``block_n`` keys) or holding more than :data:`SCORES_PER_THREAD` ``scores`` (fp32
    score values a thread) at any length, take :data:`NARROW_BLOCK_N`-key tiles, 4
    stages with one program an SM at most and 3 with more (two of 64 x 64 at D = 128,
    114 KB of shared memory each, fit an SM; the sm_90 build of 64 x 64 at 4 stages takes
    168 registers and no spill, 64 x 128 at 3 stages 255 and 4 spill stores). The splits
    stay those of the wider tile: a short read is latency, and the narrower tile shortens
    the pipeline's fill and drain without changing the grid (letting its smaller bytes in
    flight raise the splits, B = 1, GQA 4:1 at 16 tokens, 1k keys, 11 and 16 splits
    against 8, read 0.86-0.87x). H100, 16 query tokens, GQA 4:1 and 8:1, B = 1-64, 1k-4k
    keys, D = 64 and 128, dense and 16-key pages, against 128-key tiles: 89 shapes,
    geometric mean 1.03x (1.04x at 1k-2k keys, 1.02x at 4k); B = 8 at 1k 1.01-1.07x,
    B = 64 at 1k 0.94-1.12x; lowest GQA 4:1 at B = 64 with D = 64, paged: 0.94x at 1k, 0.89x at 4k.

    The score bound: a 128-row tile with 4 warps (head dims up to 64, whose accumulator
    takes no more) holds 128 scores a thread at 128 keys; its sm_90 build at D = 64
    takes 255 registers, 215 at 64 keys and 4 stages. H100, GQA 8:1, 16 query tokens,
    B = 8, 8k keys, 2 splits: 1.06x (dense) and 1.09x (16-key pages) with 64 keys."""
    if not wgmma or block_n <= NARROW_BLOCK_N or (key_tiles > CUT_MAX_TILES
                                                  and scores <= SCORES_PER_THREAD):
        return block_n, stages
    return NARROW_BLOCK_N, NARROW_STAGES[programs > units]


def short_read_keys(block_n: int, stages: int, key_tiles: int, programs: int, units: int,
                    rows: int, wgmma: bool, paged: bool) -> tuple:
    """(BLOCK_N, num_stages) of a launch of ``programs`` tiles of ``rows`` rows that the
    tensor cores run as mma.sync (not ``wgmma``), each reading a dense cache of at most
    :data:`SHORT_READ_TILES` ``key_tiles`` of ``block_n`` keys: where the programs
    outnumber the ``units`` SMs and the tiles hold at most :data:`STREAM_ROWS` rows, key
    tiles of :data:`NARROW_BLOCK_N` in 4 stages; otherwise unchanged.

    Why: such a read is eight key tiles a program, of which the first waits for the
    whole fill of the pipeline and the last drains it, while more programs than SMs keep
    the memory busy between them; tiles half as wide shorten both. H200, bf16, one
    query token (GQA 4:1 and 8:1: 16-row tiles), GPU time against 128-key tiles in 3
    stages, two runs: D = 128, B = 32-128 at 1k keys (256-1024 programs) 1.018-1.027x,
    D = 64 at B = 64 1.053x; at 2k keys (16 tiles) 1.003-1.012x and 4k 0.991-0.992x,
    which keep 128 keys; 128 programs (B = 16) 1.002-1.007x. The same tiles in 3 stages
    read 0.95-0.98x at B = 64 (1.04x at B = 32), and with 16-key pages 0.96-0.97x the
    paged default (128 keys, 2 stages: :func:`shallow_paged`), which stays. Against the
    rule before, 5 rounds: 1, 2 and 4 query tokens at B = 48-64, 512-1k keys
    1.025-1.038x; D = 64 at B = 128 0.995x."""
    if (wgmma or paged or rows > STREAM_ROWS or programs <= units
            or key_tiles > SHORT_READ_TILES or block_n <= NARROW_BLOCK_N):
        return block_n, stages
    return NARROW_BLOCK_N, NARROW_STAGES[0]


def narrow_head_stages(stages: int, head_pad: int, block_n: int, rows: int, programs: int,
                       units: int, wgmma: bool, paged: bool) -> int:
    """``num_stages`` of a launch of ``programs`` tiles of ``rows`` rows that the tensor
    cores run as mma.sync (not ``wgmma``), reading a dense cache at a padded head dim of 64
    in 128-key tiles of the table's 3 stages: :data:`NARROW_HEAD_STAGES` where the
    programs outnumber two an SM of the ``units`` (the 3-stage grid's one wave) and the
    tiles hold at most :data:`STREAM_ROWS` rows; otherwise unchanged.

    Why: at D = 64 a 128-key stage is 32 KB of K and V, half of D = 128's, and the
    table's 3 stages run two programs an SM, which read the cache 11-13% slower than one
    program of 4 stages (or three of 2). H200, bf16, GQA 4:1 (16-row tiles), B = 64 (512
    programs), GPU time against 3 stages, 3 rounds interleaved: 8k and 32k keys, one
    query token, 1.124x and 1.148x; 4 tokens at 8k 1.119x. Grids of one 3-stage wave
    were not timed but one: B = 8 at 32k (2 splits, 128 programs) 1.023x; they keep 3.
    D = 128 keeps 3 stages (4: 0.979x at B = 64, 8k); paged caches keep theirs
    (:func:`shallow_paged`; 4 stages read 0.96-0.98x there)."""
    if (wgmma or paged or rows > STREAM_ROWS or programs <= 2 * units or head_pad != 64
            or block_n != 128 or stages != 3):
        return stages
    return NARROW_HEAD_STAGES


def select(problem: Problem) -> TritonDecodeConfig:
    """The default for a problem (``n_q`` query tokens, ``n_k`` the cache's keys per
    sequence, ``heads`` = B x H, ``group`` = H / Hkv): pure, tensor-free, deterministic.

    Rows: the packed rows rounded up to a power of two, at least 16 (the tensor cores'
    smallest M) and at most 128 (a row block past that re-reads K and V), with 8 warps
    once the fp32 accumulator holds 128 x 128 values; wgmma tiles of 128 rows cut to 64 on
    short caches where the cut grid still makes one wave (:func:`cut_rows`). Always DOT:
    Triton's pipeliner stages only the loads that feed a ``tl.dot`` through shared memory
    (the reduce path's sm_90 TTGIR has no asynchronous copy), so without it each warp
    waits for its own K and V, while the padding rows of a 16-row product cost
    tensor-core issue slots that a loop bound by memory has to spare.

    Splits: :func:`split_count` over the work tiles B x Hkv x row blocks, the key tiles
    of the cache's length (the bound every sequence is under: the host reads no lengths)
    and the programs that read the cache at the memory's bandwidth on the target
    (:func:`readers`), the bytes in flight counted per kv head; a split past the byte
    target's grid that would add the merge launch to an unsplit one only on caches of
    :data:`LONG_READ_TILES` key tiles and more, or for sm_90's 32-row mma.sync tiles
    (:func:`merge_pays`). The table's key
    tiles are halved where the tile's shared memory would not fit a block (128 packed rows
    at D = 256 on sm_90), and wgmma tiles on short caches, or holding more than 64 scores
    a thread, take 64-key tiles once the splits are chosen (:func:`narrow_keys`), as do
    16-row tiles of more programs than SMs on short dense caches (:func:`short_read_keys`).
    A paged launch of more programs than SMs, or of one key tile a split, takes two
    stages, but for wgmma tiles, and D = 64's 16-row tiles of up to two programs an SM,
    which take four (:func:`paged_stages`)."""
    t = problem.target_record()
    check_head_dim(problem.head_dim)
    base = table_select(DEFAULTS, KERNEL, problem)
    rows = packed_rows(problem)
    kv_heads = max(1, problem.heads // max(1, problem.group))
    units = t.units
    block_m = min(128, max(16, _next_pow2(rows)))
    block_m = cut_rows(rows, block_m, kv_heads, units,
                       _wgmma(base.replace(BLOCK_M=block_m), t),
                       -(-max(1, problem.n_k) // base.BLOCK_N))
    pad = head_dim_pad(problem.head_dim)
    warps = 8 if block_m * pad >= 128 * 128 else base.num_warps
    cfg = base.replace(BLOCK_M=block_m, num_warps=warps)
    # wide tiles keep every stage and Q in shared memory (sm_90 wgmma): fewer keys a tile
    while cfg.BLOCK_N > 16 and min_shared_bytes(cfg, problem.head_dim, problem.dtype, t) \
            > t.smem_per_block_optin:
        cfg = cfg.replace(BLOCK_N=cfg.BLOCK_N // 2)
    tiles = kv_heads * -(-rows // block_m)
    key_tiles = -(-max(1, problem.n_k) // cfg.BLOCK_N)
    per_sm = in_flight_per_sm(problem.device, key_tiles)
    grid = readers(cfg, problem.head_dim, problem.dtype, units, t, problem.paged, per_sm)
    splits = split_count(tiles, key_tiles, grid, kv_heads, units)
    by_bytes = split_count(tiles, key_tiles, byte_readers(cfg, problem.head_dim,
                                                          problem.dtype, units, per_sm),
                           kv_heads, units)
    cfg = cfg.replace(SPLITS=splits if merge_pays(key_tiles, splits, by_bytes,
                                                  _chained(cfg, t)) else 1)
    # the launch's programs and product kind, which the key-tile and stage rules below
    # share (none of them changes the rows or the splits)
    programs, wgmma = tiles * cfg.SPLITS, _wgmma(cfg, t)
    block_n, stages = narrow_keys(cfg.BLOCK_N, cfg.num_stages, key_tiles, programs, units,
                                  wgmma, cfg.BLOCK_M * cfg.BLOCK_N // (warps * t.warp_size))
    block_n, stages = short_read_keys(block_n, stages, key_tiles, programs, units,
                                      cfg.BLOCK_M, wgmma, problem.paged)
    stages = narrow_head_stages(stages, pad, block_n, cfg.BLOCK_M, programs, units, wgmma,
                                problem.paged)
    if problem.paged:
        stages = paged_stages(stages, pad, block_n, cfg.BLOCK_M, programs, units, key_tiles,
                              cfg.SPLITS, wgmma)
    return cfg.replace(BLOCK_N=block_n, num_stages=stages)


def paged_stages(stages: int, head_pad: int, block_n: int, rows: int, programs: int,
                 units: int, key_tiles: int, splits: int, wgmma: bool) -> int:
    """``num_stages`` of a paged launch: :data:`NARROW_HEAD_STAGES` for 16-row mma.sync
    tiles of 128 keys at a padded head dim of 64 in the table's 3 stages whose programs
    outnumber the ``units`` SMs by at most two to one, each split holding more than one
    key tile; else :data:`SHALLOW_PAGED_STAGES` where :func:`shallow_paged` says so;
    else ``stages``.

    Why: two programs of 2 stages an SM, the shallow rule's bet, pay at D = 128, where a
    stage's K and V take 64 KB; at D = 64 they take 32 KB and one deep pipeline an SM
    reads faster. H200, bf16, one query token, GQA 4:1, 16-key pages, B = 32 at 32k keys
    (256 programs), GPU time against 2 stages, 3 rounds interleaved: 1.115x and 1.093x
    (two runs; 0.97x the dense cache's time, from 0.87-0.88x). Against the 3 stages of
    one program an SM or fewer (B = 1, 8 and 16, 1k-32k keys, 9 rows over two runs) 4
    stages read 0.885-1.062x, no better; past two programs an SM (B = 64) 0.96-0.98x the
    shallow rule's 2. Both keep theirs."""
    if (not wgmma and rows <= STREAM_ROWS and head_pad == 64 and block_n == 128
            and stages == 3 and units < programs <= 2 * units and key_tiles > splits):
        return NARROW_HEAD_STAGES
    if shallow_paged(programs, key_tiles, splits, units, wgmma):
        return min(stages, SHALLOW_PAGED_STAGES)
    return stages


def shallow_paged(programs: int, key_tiles: int, splits: int, units: int,
                  wgmma: bool = False) -> bool:
    """Whether a paged launch takes :data:`SHALLOW_PAGED_STAGES` stages: when its
    ``programs`` outnumber the SMs (CUs), or each split holds one key tile; never for
    tiles sm_90 runs as ``wgmma`` (64 rows and up), whose operands all come from shared
    memory (with 2 stages GQA 8:1 at 16 query tokens, B = 64, 8k keys read 0.79 of the
    dense cache, against 0.95 with 3).

    Why: a paged launch of S stages gives its K and V tiles S - 1 buffers and the block
    table's reads the rest (:func:`triton_stages`). With more programs than SMs, two
    stages (one buffer: 74 KB of shared memory against 139 KB in the sm_90 build of
    ``16x128 w4``, 224 registers) let two programs share an SM, and one's table reads
    overlap the other's K and V; with one tile a split, a deeper pipeline has nothing to
    overlap and only lengthens the prologue. H100, one query token, GQA 4:1, D = 128,
    16-key pages, GPU time against 3 stages: B = 64 at 1k keys 108 against 120 us (the
    dense cache: 106), at 8k 720 against 728; B = 1 at 1k, 8 splits, 13.8 against 15.2
    (dense: 12.8). One program an SM with several tiles a split (B = 8 at 8k and 32k)
    reads faster with 3 stages (112 against 115 us, 375 against 395), and so does the
    dense cache everywhere (B = 64 at 1k: 106 against 109)."""
    return not wgmma and (programs > units or key_tiles <= splits)


def accepts(problem: Problem) -> Optional[str]:
    """Why this family cannot run ``problem``, or None: it runs every decoding problem."""
    return None


# -- rows for the sm_90 forward ------------------------------------------------------------

#: Packed rows from which a dense cache's decoding runs on the sm_90 forward
#: (:func:`forward_rows`): a row block of its two-consumer tile
FORWARD_ROWS = 128
#: Packed rows up to which a decoding call may run on the sm_90 forward's one-consumer
#: tile where it reads row blocks whole (:func:`narrow_rows`): this family's 32-row tiles
NARROW_ROWS = 32
#: SMs a row block of :func:`narrow_rows` has to itself, from which it stays here where
#: the forward would read each block whole; and from which a paged cache's 17-32 rows do
WHOLE_IDLE_SMS = 3
PAGED_IDLE_SMS = 8
#: Keys each SM reads, at least (row blocks x keys a sequence / SMs), from which it does
FORWARD_SM_KEYS = 3072


def forward_rows(problem: Problem) -> bool:
    """Whether a decoding problem runs on the sm_90 forward (``sm90-fwd``) rather than
    this family: on sm_90, D = 64, 128 or 256, and either up to 32 packed rows of
    :func:`narrow_rows`, or at least :data:`FORWARD_ROWS` packed rows
    (:func:`packed_rows`) and at least :data:`FORWARD_SM_KEYS` keys for each SM to read
    across the row blocks (:func:`forward_blocks`), whether each SM runs whole blocks or
    pieces of one (fewer blocks than SMs: the forward cuts each into the SMs it has to
    itself, :func:`flashscope.families.sm90_fwd.packed_pieces`). Dense or paged.

    Why: this family's wide tiles (GQA 8:1 at 16 query tokens, 128 rows: 128 FLOP a
    byte of K and V) are bound by the products, not the bytes: its Triton loop waits for
    each tile's two products in turn, 370-470 TFLOP/s on an H200, where the forward's
    warp-specialized pipeline overlaps one tile's exponentials with the other's product.
    What the forward pays instead is fixed per program: its row blocks' Q and output, a
    cut grid's merge, a crowded grid's work list. On an H200 (bf16, GQA 8:1 x 16) it ran
    1.06-1.15x the Triton kernel at about 4k keys an SM, whole grids or cut ones (B = 64
    at 1k, B = 16 at 4k, B = 8 at 8k, B = 2 at 32k), 1.08-1.23x from 8k, 0.98-1.03x at
    2k and 0.97-1.00x at 1k (B = 16 whole, B = 1 to 8 cut); D = 64 1.02-1.34x, paged
    builds 1.16-1.26x (docs/decode.md has the measured times). The caller checks that the
    cache's sequences (or pages) lie one stride apart, as the forward's packed batch
    needs, and the page size (:func:`flashscope.kvcache.forward_layout`)."""
    t = problem.target_record()
    if t.name != "sm90" or problem.head_dim not in (64, 128, 256):
        return False
    if narrow_rows(problem):
        return True
    if packed_rows(problem) < FORWARD_ROWS:
        return False
    return forward_blocks(problem) * problem.n_k >= FORWARD_SM_KEYS * problem.units


def narrow_rows(problem: Problem) -> bool:
    """Whether a call's packed rows, at most :data:`NARROW_ROWS` of a group dividing 64
    (the forward reads q and writes its output in place, :func:`~.sm90_fwd.grouped_ok`),
    run on the sm_90 forward's 64-row tile where it reads each row block whole: a cache
    of fewer than ``sm90_fwd.SHORT_CUT_TILES`` key tiles (:func:`forward_grid`) on
    a grid that leaves each block fewer than :data:`WHOLE_IDLE_SMS` SMs. Up to
    :data:`STREAM_ROWS` rows (this family's 16-row tiles), dense or paged, on no more
    blocks than SMs. From there to :data:`NARROW_ROWS` (its 32-row mma.sync tiles): a
    dense cache on any such grid but, at D = 64, no more blocks than SMs; a paged cache
    unless the forward would read each block whole (:func:`~.sm90_fwd.packed_pieces`)
    with :data:`PAGED_IDLE_SMS` SMs or more to itself.

    Why: this family's 32-row tiles split a short read to fill the SMs and merge the
    splits; the forward's one program a block reads it whole through its TMA pipeline,
    about 1k keys (512 KB at D = 128) in 8 us a program, so a grid of fewer programs
    than about a third of the SMs streams slower than the split one. H200, bf16,
    causal, full caches, 3 rounds interleaved, GPU time of the forward over this
    family's default, GQA 8:1 x 4 tokens unless named. Dense, 768-3584 keys (under 32
    key tiles): B = 6-8 (48-64 blocks) 1.02-1.17x, B = 11-128 1.01-1.12x (4:1 x 5 and x
    8, 8:1 x 3 1.04-1.15x), D = 64 at B = 8-16 1.01-1.22x, D = 256 1.00-1.16x; B = 5 (3
    SMs a block) 1.15x at 1k keys but 0.93x at 3k, B = 3-4 0.92-1.09x, B = 1-2
    0.79-1.01x; D = 64 past one block an SM 0.86-0.99x; at 4k-8k keys (the forward
    cuts or reads 32 tiles) 0.98-1.03x. Paged (16-key pages), over this family's paged
    default, which reads pages at 0.72-0.98 of the dense speed: 1.02-1.34x at B = 3-64
    but 0.96x at B = 5 with 3k keys, cut grids 0.94-1.11x; whole blocks at B = 1-2 (8-16
    SMs a block) 0.81-0.90x. Up to 16 rows at 1k-2k keys on 48-128 blocks: GQA 4:1 and
    8:1 at one token and 4:1 at 4 (B = 6-16) dense 1.00-1.10x, paged 1.00-1.20x; one
    head a kv head and two (B = 2-6) dense 1.01-1.09x, paged 1.03-1.11x; past the SMs
    (B = 24-128) 0.92-1.01x, B = 4 0.94x and 0.99x; at 8k-32k keys 0.94-1.16x (D = 128
    0.95-1.03x)."""
    from . import sm90_fwd

    rows = packed_rows(problem)
    if not (rows <= NARROW_ROWS and sm90_fwd.grouped_ok(max(1, problem.group))):
        return False
    blocks, tiles, sms = forward_grid(problem)
    idle = sms // blocks
    whole = idle < WHOLE_IDLE_SMS and tiles < sm90_fwd.SHORT_CUT_TILES
    if rows <= STREAM_ROWS:
        return whole and blocks <= sms
    if problem.paged:
        return idle < PAGED_IDLE_SMS or sm90_fwd.packed_pieces(blocks, tiles, sms) > 1
    if problem.head_dim == 64 and blocks > sms:
        return False
    return whole


def forward_problem(problem: Problem) -> Problem:
    """A decoding problem as the sm_90 forward's packed batch: a sequence per kv head of
    each batch entry, its packed rows as the queries."""
    return replace(problem, n_q=packed_rows(problem),
                   heads=problem.heads // max(1, problem.group), group=1, varlen=True)


class ForwardGrid(NamedTuple):
    """A decoding problem on the sm_90 forward: its row blocks (:func:`forward_blocks`),
    the key tiles of the cache's capacity, and the SMs."""
    blocks: int
    tiles: int
    sms: int


def forward_grid(problem: Problem, key_tile: int = 0) -> ForwardGrid:
    """:class:`ForwardGrid` with ``key_tile`` keys a tile (0: the forward's rule's for the
    decoding rows)."""
    from . import sm90_fwd

    if not key_tile:
        fwd = forward_problem(problem)
        key_tile = sm90_fwd.fit(sm90_fwd.select(fwd), fwd).BLOCK_N
    return ForwardGrid(forward_blocks(problem), -(-max(1, problem.n_k) // key_tile),
                       problem.units)


def forward_blocks(problem: Problem) -> int:
    """Row blocks of a decoding problem on the sm_90 forward: one per kv head of each
    sequence and :data:`FORWARD_ROWS` packed rows."""
    kv_heads = max(1, problem.heads // max(1, problem.group))
    return kv_heads * -(-packed_rows(problem) // FORWARD_ROWS)


# -- launches ------------------------------------------------------------------------------

class Cache(NamedTuple):
    """A KV cache as the kernels read it: K and V, the block table (None: dense), the
    sequences' lengths before the call, and its geometry."""
    k: object
    v: object
    seqlens: object
    table: object  #: (B, max pages) int32, or None for a dense cache
    page: int  #: keys a page (0: dense)
    capacity: int  #: keys a sequence can hold
    pages: int  #: pages in the cache (dense: B)

    @classmethod
    def of(cls, k, v, seqlens, table=None) -> "Cache":
        """The kernels read the lengths, and each row of the block table, as int32 values
        one after another: lengths or table columns laid out otherwise (every other one
        of a wider tensor, say) are copied; a table's rows may lie any stride apart."""
        if seqlens.dim() == 1 and seqlens.shape[0] > 1 and seqlens.stride(0) != 1:
            seqlens = seqlens.contiguous()
        if table is None:
            return cls(k, v, seqlens, None, 0, k.shape[1], k.shape[0])
        if table.dim() == 2 and table.shape[1] > 1 and table.stride(1) != 1:
            table = table.contiguous()
        page = k.shape[1]
        return cls(k, v, seqlens, table, page, table.shape[1] * page, k.shape[0])

    @property
    def table_arg(self):
        """The block table, or the lengths in its slot (unread) when dense."""
        return self.seqlens if self.table is None else self.table

    @property
    def table_stride(self) -> int:
        return 0 if self.table is None else self.table.stride(0)


def workspace_size(q_shape, cache: Cache, cfg: TritonDecodeConfig) -> int:
    """Float32 values of the split workspace: a slot (BLOCK_M x (D_pad + 2)) for every
    split of every work tile; 0 without splits."""
    if cfg.SPLITS <= 1:
        return 0
    return _tiles(q_shape, cache, cfg) * cfg.SPLITS * cfg.BLOCK_M * \
        (head_dim_pad(q_shape[3]) + 2)


def _tiles(q_shape, cache: Cache, cfg) -> int:
    B, Nq, H, _ = q_shape
    hkv = cache.k.shape[2]
    return B * hkv * -(-(H // hkv) * Nq // cfg.BLOCK_M)


# Each launch's arguments are its tensors, then integers and floats fixed by the shapes,
# strides, mask and config (what a plan keeps, :func:`plan`).

def append_tensors(k_new, v_new, cache: Cache) -> tuple:
    return k_new, v_new, cache.k, cache.v, cache.seqlens, cache.table_arg


def attend_tensors(q, cache: Cache, out, lse, part) -> tuple:
    """``lse``/``part`` None: ``out`` in their slots (unread)."""
    return (q, cache.k, cache.v, out, out if lse is None else lse,
            out if part is None else part, cache.seqlens, cache.table_arg)


def merge_tensors(out, lse, part) -> tuple:
    return part, out, out if lse is None else lse


def append_call(k_new, v_new, cache: Cache):
    """(grid, positional args, constexpr keywords) of the append of ``k_new``/``v_new``
    (B, N_new, Hkv, D) at each sequence's length."""
    B, n_new, hkv, D = k_new.shape
    grid = (n_new, B)
    args = (*append_tensors(k_new, v_new, cache), *k_new.stride(), *v_new.stride(),
            *cache.k.stride(), *cache.v.stride(), cache.table_stride, hkv, cache.capacity,
            cache.pages)
    consts = dict(HKV_PAD=_next_pow2(hkv), HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad(D),
                  PAGE=cache.page, **unit_consts(k_new, v_new, cache.k, cache.v))
    return grid, args, consts


def call(q, cache: Cache, out, lse, part, n_new: int, *, mask, scale: float,
         cfg: TritonDecodeConfig):
    """(grid, positional args, constexpr keywords) of the attention launch. q and out
    (B, Nq, H, D); lse (B, H, Nq) fp32 or None; ``part`` the split workspace (None
    without splits); ``n_new`` keys appended before it."""
    from ..launch import LOG2E

    B, Nq, H, D = q.shape
    hkv = cache.k.shape[2]
    n_m = -(-(H // hkv) * Nq // cfg.BLOCK_M)
    _, left, right = mask.scalars(Nq, cache.capacity)
    sw = mask.switches(Nq, cache.capacity)
    grid = (B * hkv * n_m, cfg.SPLITS)
    args = (*attend_tensors(q, cache, out, lse, part), *q.stride(), *cache.k.stride(),
            *cache.v.stride(), *out.stride(), cache.table_stride, Nq, n_new, cache.capacity,
            cache.pages, n_m, hkv, cfg.SPLITS, scale * LOG2E, left, right,
            *mask.cap_args(scale))
    consts = dict(GROUP=H // hkv, HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad(D),
                  BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, PAGE=cache.page, DOT=bool(cfg.DOT),
                  SPLIT=cfg.SPLITS > 1, RETURN_LSE=lse is not None, CAUSAL=sw["CAUSAL"],
                  HAS_LEFT=sw["HAS_LEFT"], HAS_RIGHT=sw["HAS_RIGHT"], SOFTCAP=sw["SOFTCAP"],
                  **unit_consts(q, cache.k, cache.v, out))
    return grid, args, consts


def merge_call(q, cache: Cache, out, lse, part, cfg: TritonDecodeConfig):
    """(grid, positional args, constexpr keywords) of the merge of the splits: a program
    per (work tile, :data:`MERGE_ROWS` of its real rows, :data:`MERGE_COLS` columns),
    :data:`MERGE_CHUNK` splits loaded at a time."""
    B, Nq, H, D = q.shape
    hkv = cache.k.shape[2]
    n_m = -(-(H // hkv) * Nq // cfg.BLOCK_M)
    real = min(cfg.BLOCK_M, (H // hkv) * Nq)  # rows of a tile that hold queries
    rows = min(MERGE_ROWS, _next_pow2(real))
    pad = head_dim_pad(D)
    cols = min(MERGE_COLS, pad)
    grid = (B * hkv * n_m, -(-real // rows), pad // cols)
    args = (*merge_tensors(out, lse, part), Nq, n_m, hkv, cfg.SPLITS, *out.stride())
    consts = dict(GROUP=H // hkv, HEAD_DIM=D, HEAD_DIM_PAD=pad, BLOCK_M=cfg.BLOCK_M,
                  ROWS=rows, COLS=cols, CHUNK=min(MERGE_CHUNK, _next_pow2(cfg.SPLITS)),
                  RETURN_LSE=lse is not None)
    return grid, args, consts


# -- the launch plan -----------------------------------------------------------------------

class Launch(NamedTuple):
    """One launch of a plan: the kernel's function, its grid, the arguments after its
    tensors, the constexprs and options, and the compiled kernel by device once launched
    (:func:`flashscope.launch.launch_compiled`'s cache)."""
    function: str
    grid: tuple
    scalars: tuple
    consts: dict
    options: dict
    compiled: dict


class DecodePlan(NamedTuple):
    """The launches of a decoding call (the append and the merge None where not run) and
    the float32 values of its split workspace."""
    append: Optional[Launch]
    attend: Optional[Launch]
    merge: Optional[Launch]
    workspace: int


#: plans by :func:`plan_key`; emptied when it reaches 256 keys
_PLANS: dict = {}


def plan_key(q, cache: Cache, out, lse, k_new, v_new, mask, scale: float, cfg,
             attend: bool) -> tuple:
    """What a call's launches depend on besides data addresses: the device, dtype, every
    tensor's shape, strides and 16-byte alignment, the mask, scale, config and whether
    it attends. It fixes every scalar argument, its specialization and every constexpr."""
    tensors = (q, cache.k, cache.v, out, lse, cache.seqlens, cache.table, k_new, v_new)
    return (q.device, q.dtype, cache.page, mask, float(scale), cfg, attend,
            tuple(None if t is None else (t.shape, t.stride(), t.data_ptr() % 16)
                  for t in tensors))


def plan(q, cache: Cache, out, lse, k_new, v_new, *, mask, scale: float,
         cfg: TritonDecodeConfig, attend: bool = True) -> DecodePlan:
    """The :class:`DecodePlan` of a call, built on the first call of its :func:`plan_key`
    and then looked up: a decoding step runs in microseconds, and building its argument
    lists and launch keys on the host took longer."""
    from ..launch import remembered

    key = plan_key(q, cache, out, lse, k_new, v_new, mask, scale, cfg, attend)
    return remembered(_PLANS, key, lambda: _build_plan(q, cache, out, lse, k_new, v_new,
                                                       mask, scale, cfg, attend))


def _launch(name: str, built, n_tensors: int, options: dict, early: bool) -> Launch:
    """A :class:`Launch` of kernel ``name``; ``early``: its EARLY build, launched with
    programmatic stream serialization (:func:`flashscope.launch.early_launch`)."""
    grid, args, consts = built
    if early:
        consts, options = {**consts, "EARLY": True}, {**options, "launch_pdl": True}
    return Launch(FUNCTIONS[name], grid, tuple(args[n_tensors:]), consts, options, {})


def _build_plan(q, cache, out, lse, k_new, v_new, mask, scale, cfg, attend) -> DecodePlan:
    """A step's launches, each started under the one before it on GPUs that can
    (``early``; :func:`flashscope.kernels.common.wait_previous`): a short step is a few
    microseconds of work a kernel, and each kernel's launch and set-up would come between
    them."""
    from ..launch import early_launch, launch_options

    early = early_launch(q.device)
    n_new = 0 if k_new is None else k_new.shape[1]
    append = attend_launch = merge = None
    if n_new:
        append = _launch("decode_append", append_call(k_new, v_new, cache), 6, SMALL_OPTIONS,
                         early)
    size = workspace_size(q.shape, cache, cfg) if attend else 0
    if attend:
        options = {**launch_options(cfg, q.device),
                   "num_stages": triton_stages(cfg, cache.table is not None)}
        attend_launch = _launch(KERNEL, call(q, cache, out, lse, None, n_new, mask=mask,
                                             scale=scale, cfg=cfg), 8, options, early)
    if size:
        merge = _launch("decode_merge", merge_call(q, cache, out, lse, None, cfg), 3,
                        SMALL_OPTIONS, early)
    return DecodePlan(append, attend_launch, merge, size)


def run(q, cache: Cache, out, lse, *, k_new=None, v_new=None, mask, scale: float,
        cfg: TritonDecodeConfig, attend: bool = True) -> None:
    """Append ``k_new``/``v_new`` (if given), then (with ``attend``) attend and merge the
    splits: up to three launches on the current stream (GPU, or Triton's interpreter on
    CPU tensors)."""
    from .. import kernels
    from ..launch import interpreting

    mod = kernels.load(MODULE, interpret=interpreting())
    p = plan(q, cache, out, lse, k_new, v_new, mask=mask, scale=scale, cfg=cfg,
             attend=attend)
    run_plan(p, mod, q, cache, out, lse, k_new, v_new)


def run_plan(p: "DecodePlan", mod, q, cache: Cache, out, lse, k_new, v_new) -> None:
    """The launches of plan ``p`` (:func:`plan`) on these tensors, whose geometry is the
    plan's; ``mod`` the loaded kernel module."""
    import torch

    from ..launch import launch_jit

    def go(launch: Launch, tensors: tuple) -> None:
        launch_jit(getattr(mod, launch.function), launch.grid, (*tensors, *launch.scalars),
                   launch.consts, launch.options, q.device, cache=launch.compiled)

    if p.append is not None:
        go(p.append, append_tensors(k_new, v_new, cache))
    if p.attend is None:
        return
    part = torch.empty(p.workspace, dtype=torch.float32, device=q.device) \
        if p.workspace else None
    go(p.attend, attend_tensors(q, cache, out, lse, part))
    if part is not None:
        go(p.merge, merge_tensors(out, lse, part))
