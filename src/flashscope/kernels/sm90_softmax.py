"""The sm_90 forward's softmax pieces, on a consumer's 64 x BLOCK_N score tile.

Scores live in the wgmma accumulator layout (``NVMMADistributedLayout`` v3: each thread
holds two rows' values in pairs of adjacent columns), so row reductions are a thread's
own values then two quad shuffles. In base 2 with c = scale * log2(e):
m = max_j s_ij c, p_ij = 2^(s_ij c - m), l = sum_j p_ij (:func:`_quad_sums` keeps each
thread's quad shares until the epilogue). :func:`_masked` sets keys past N_K, above the
causal diagonal or outside a window to -inf; :func:`_row_max` keeps a row that has seen
no key at 0 instead of NaN; :func:`_p_operand` packs P to 16 bits as the register A operand
of P V; :func:`_lazy_rescale` multiplies O by alpha = 2^(m_old - m_new) only in
warps where some row's maximum moved (LAZY_RESCALE).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

from flashscope.compat import cta_barrier
from flashscope.kernels.keyrange import visible


@gluon.jit
def _masked(s, j, start_m, N_K, mask_from, mask_lo, Band,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
            HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SHIFTED: gl.constexpr,
            s_layout: gl.constexpr, ROW_GROUP: gl.constexpr, shift):
    """-inf where key >= N_K or the mask hides the key from the query: (causal) key >
    query, or with a band (a window bound, bottom-right alignment; Band = (OFFSET, LEFT,
    RIGHT)) what :func:`flashscope.kernels.keyrange.visible` hides. Only tiles at or
    past ``mask_from`` (the first that can hold such a key), and with a band those before
    ``mask_lo``, pay for it. Rows and keys may both be counted from ``shift`` keys on
    (the caller's loop counter); a band over packed rows (ROW_GROUP = G > 1) compares
    each row's position, (row + shift) // G - shift, instead of the row."""
    BAND: gl.constexpr = HAS_LEFT or HAS_RIGHT or SHIFTED
    if BAND:
        edge = (j * BLOCK_N < mask_lo) | (j * BLOCK_N >= mask_from)
    else:
        edge = j * BLOCK_N >= mask_from
    if edge:
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = gl.expand_dims(cols < N_K, 0)
        if BAND:
            rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            if ROW_GROUP > 1:
                rows = (rows + shift) // ROW_GROUP - shift
            keep = keep & visible(gl.expand_dims(rows, 1), gl.expand_dims(cols, 0), Band[0],
                                  Band[1], Band[2], IS_CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
        elif IS_CAUSAL:
            rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            keep = keep & (gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0))
        s = gl.where(keep, s, float("-inf"))
    return s


@gluon.jit
def _zero_past(v, key0, n_k, BLOCK_N: gl.constexpr):
    """Zero the rows of V tile ``v`` (shared [BLOCK_N, D], keys from ``key0``) at
    or past key n_k, before a P V product reads it, where the tile holds such rows. Their
    scores are masked, so P is 0 there, but 0 times a NaN or an infinity is NaN: a KV
    cache's slots past a sequence's length hold whatever was last written there (or never
    was: torch.empty), and a TMA copy reads the whole tile (FlashAttention-3 and -4
    propagate such NaNs; their issues #1745 and #2374). The consumers sharing the slot
    may each zero it: every write stores the value the slot ends with, so none can make
    another's product read anything but that."""
    if key0 + BLOCK_N > n_k:
        CHUNK: gl.constexpr = 16
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
        for c in gl.static_range(BLOCK_N // CHUNK):
            if key0 + (c + 1) * CHUNK > n_k:
                part = v.slice(c * CHUNK, CHUNK)
                x = part.load(layout)
                keep = gl.expand_dims(key0 + c * CHUNK + rows < n_k, 1)
                part.store(gl.where(keep, x, gl.zeros_like(x)))
        fence_async_shared()
        cta_barrier()


@gluon.jit
def _row_max(m, GUARD: gl.constexpr):
    """The row maximum ``m`` to subtract from scores: 0 with GUARD for a row that has
    seen no key yet (m = -inf, whose scores are all -inf: 2^(-inf - 0) = 0, where
    2^(-inf + inf) would be NaN)."""
    if GUARD:
        m = gl.where(m == float("-inf"), 0.0, m)
    return m


@gluon.jit
def _quad_sums(p):
    """[64, N] -> [64, 4]: each thread's share of its rows' sums. In the wgmma accumulator
    layout the four lanes of a quad hold a row's columns 8k + 2c and 8k + 2c + 1 (c the
    lane in the quad, k = 0 .. N/8 - 1), so summing over k and the pair stays in the
    thread. The running l is kept this way and summed across the quad (two shuffles and
    two adds per row) once per work tile instead of once per key tile."""
    R: gl.constexpr = p.shape[0]
    N: gl.constexpr = p.shape[1]
    return gl.sum(gl.sum(gl.reshape(p, [R, N // 8, 4, 2]), 3), 1)


@gluon.constexpr_function
def _cvt_pair(dtype):
    """PTX rounding two fp32 values ($1 low, $2 high) into one register of dtype pairs."""
    return f"cvt.rn.{'bf16' if dtype == gl.bfloat16 else 'f16'}x2.f32 $0, $2, $1;"


@gluon.jit
def _p_operand(p, dtype: gl.constexpr, layout: gl.constexpr):
    """P (fp32 [64, BLOCK_N], accumulator layout) -> the register A operand of P V.

    Columns 2i and 2i+1 of a row sit in one thread, and the operand holds them as one
    32-bit register, 2i in the low half. One ``cvt.rn.{bf16,f16}x2.f32`` per pair says so
    to ptxas. From per-element conversions, ptxas builds some pairs the other way round in
    worker partitions and then swaps the halves of each with a PRMT (32 per tile)."""
    R: gl.constexpr = p.shape[0]
    C: gl.constexpr = p.shape[1]
    lo, hi = gl.split(gl.reshape(p, [R, C // 2, 2]))
    pk = gl.inline_asm_elementwise(_cvt_pair(dtype), "=r,r,r", [lo, hi], dtype=gl.int32,
                                   is_pure=True, pack=1)
    lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [pk],
                                       dtype=(gl.int16, gl.int16), is_pure=True, pack=1)
    pair = gl.join(lo, hi).to(dtype, bitcast=True)
    return gl.convert_layout(gl.reshape(pair, [R, C]), layout)


@gluon.constexpr_function
def _lazy_rescale_asm(n):
    """PTX of :func:`_lazy_rescale` over n accumulator values ($0..$n-1, tied to inputs
    $n..$2n-1) and their rows' factors ($2n..$3n-1)."""
    a = 2 * n
    lines = ["{", ".reg .pred p;",
             f"setp.lt.f32 p, ${a}, 0f3F800000;",
             f"setp.lt.or.f32 p, ${a + 2}, 0f3F800000, p;",
             "vote.sync.any.pred p, p, 0xffffffff;",
             "@!p bra.uni SKIP;"]
    lines += [f"mul.f32 ${i}, ${i}, ${a + i};" for i in range(n)]
    lines += ["SKIP:", "}"]
    return "\n".join(lines)


@gluon.constexpr_function
def _lazy_rescale_constraints(n):
    return ",".join(["=f"] * n + [str(i) for i in range(n)] + ["f"] * n)


@gluon.jit
def _lazy_rescale(acc, alpha):
    """acc * alpha[:, None] ([64, D] accumulator, alpha per row, 1 where the row kept its
    maximum), skipped by every warp none of whose rows has alpha < 1.

    Each thread holds two rows of the wgmma accumulator layout (elements 0-1 are row r,
    2-3 row r + 8, then the pattern repeats every 8 columns), so its elements 0 and 2
    give its rows' factors; ``vote.any`` makes the test warp-uniform and ``bra.uni``
    jumps over the D/2 multiplies. One asm block holds all of a thread's elements, each
    output tied to its input, so nothing is copied when the jump is taken. A branch in
    Gluon itself would need a scalar condition, a reduction across the warpgroup
    through shared memory (two ``bar.sync`` a tile); that version measured no better
    (docs/experiments.md)."""
    N: gl.constexpr = acc.shape[1] // 2
    a, _ = gl.broadcast(gl.convert_layout(gl.expand_dims(alpha, 1), acc.type.layout), acc)
    return gl.inline_asm_elementwise(_lazy_rescale_asm(N), _lazy_rescale_constraints(N),
                                     [acc, a], dtype=gl.float32, is_pure=True, pack=N)


@gluon.jit
def _rescaled(acc, alpha, RESCALE_TAU: gl.constexpr):
    """acc * alpha per row (alpha in the scores' row layout): every time, or with the lazy
    rescale only in warps where a row moved (:func:`_lazy_rescale`)."""
    a = gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))
    if RESCALE_TAU > 0:
        return _lazy_rescale(acc, a)
    return acc * gl.expand_dims(a, 1)
