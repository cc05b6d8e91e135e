"""The sm_90 forward's work tiles: which ones a program runs, and what each one covers.

A work tile is one row block of one head, t = pid_bh * n_m + pid_m (n_m = cdiv(N_Q,
BLOCK_M)). A program takes every P-th tile from its own index (round robin), or with LPT
its share of the host's list (:mod:`flashscope.schedule`: int32, P + 1 offsets, then the
tiles, then with SPLIT each entry's key range and workspace slot), or a packed batch's
built on the device; a KV cache's grid of a program an entry takes none (its entries in
index order, each sequence's length read where the entry starts). :func:`_share` and
:func:`_tile` read that list, one tile ahead of the one running; :func:`_work` turns a
tile into its head, rows and key tiles with the host's multipliers (:func:`_divmod`);
:func:`_range` gives the positions of a SPLIT piece (a decoding call's: piece j of S);
:func:`_key_tile` maps a position to the key tile loaded there (MASKED_FIRST: the masked
tiles first), counted from the work tile's first key tile (a band's, else 0);
:func:`_own_tiles` says which of them a consumer's 64 rows need, and :func:`_band_own`
which of them a band's consumer computes and masks. Producer and consumers call the
same functions on the same list, so they agree on every tile without talking.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashscope.kernels.keyrange import key_range


@gluon.jit
def _share(pid, nprog, total, Sched, LPT: gl.constexpr, SPLIT: gl.constexpr,
           VARLEN: gl.constexpr):
    """(n, base, L): how many work tiles program ``pid`` takes and where :func:`_tile`
    finds them: with LPT its share of the list (:mod:`flashscope.schedule`, or a packed
    batch's, :mod:`flashscope.kernels.packed_worklist`), else every nprog-th tile from
    pid; with SPLIT, L = the list's length (its key ranges and slots follow its tiles, L
    entries each); with VARLEN, L = total, the packed list's slots per field (with
    SPLIT too, its live entries)."""
    L = 0
    if LPT:
        start = gl.load(Sched + pid)
        n = gl.load(Sched + pid + 1) - start
        base = start + nprog + 1
        if SPLIT:  # a decoding call's packed list too (its live entries)
            L = gl.load(Sched + nprog)
        elif VARLEN:
            L = total
    else:
        n = total // nprog + (pid < total % nprog).to(gl.int32)
        base = pid
    return n, base, L


@gluon.jit
def _tile(r, n, base, L, nprog, Sched, Cache, LPT: gl.constexpr, SPLIT: gl.constexpr,
          VARLEN: gl.constexpr):
    """(t, key range, slot, q0, n_q, k0, n_k) of the program's r-th work tile, t = pid_bh
    * n_m + pid_m (r past its last tile: the last one). Without SPLIT the range is 0 (the
    whole block, :func:`_range`) and the slot -1 (written out). With VARLEN its sequence's
    first query row, query rows, first key row and keys in the packed tensors, from the
    packed list; else 0 (unread). The loops read each tile one work tile ahead, so the
    list's global loads are not waited for where the tile starts.

    VARLEN without LPT: a KV cache's entries in index order, no list (the host takes this
    where every program runs one entry, so their order is moot): entry e is piece e % S of
    row block e // S (S = 1 without SPLIT), written to workspace slot e, as the list would
    hold them; ``Sched`` is then the cache's lengths, sequence b's keys its first
    ``Sched[b] + added`` slots of ``capacity``, its rows ``rows`` (Cache = (added, S,
    row blocks a sequence, rows, capacity))."""
    kr = 0
    slot = -1
    q0 = 0
    n_q = 0
    k0 = 0
    n_k = 0
    if LPT:
        at = Sched + base + gl.minimum(r, n - 1)
        t = gl.load(at)
        if SPLIT:
            if VARLEN:  # after the sequence's four fields
                kr = gl.load(at + 5 * L)
                slot = gl.load(at + 6 * L)
            else:
                kr = gl.load(at + L)
                slot = gl.load(at + 2 * L)
        if VARLEN:
            q0 = gl.load(at + L)
            n_q = gl.load(at + 2 * L)
            k0 = gl.load(at + 3 * L)
            n_k = gl.load(at + 4 * L)
    elif VARLEN:
        added, pieces, per_seq, rows, capacity = Cache
        e = gl.maximum(gl.minimum(r, n - 1), 0) * nprog + base
        t = e // pieces
        if SPLIT:
            kr = (e - t * pieces) | (pieces << 16)
            slot = e
        b = t // per_seq
        q0 = b * rows
        n_q = rows
        k0 = b * capacity
        n_k = gl.minimum(gl.maximum(gl.load(Sched + b) + added, 0), capacity)
    else:
        t = r * nprog + base
    return t, kr, slot, q0, n_q, k0, n_k


@gluon.jit
def _range(kr, n_tiles, SPLIT: gl.constexpr, VARLEN: gl.constexpr):
    """(lo, hi, live): the positions of a work tile's order of key tiles
    (:func:`_key_tile`) it runs: all of them, or with SPLIT those of its list entry
    (``lo | hi << 16``; :func:`flashscope.schedule.split_schedule` cuts a block only
    where every consumer keeps a tile of its own on each side).

    With VARLEN the entry is piece j of S (``j | S << 16``, a decoding call's list,
    :func:`flashscope.kernels.packed_worklist._packed_list`), whose host knows neither
    the sequence's keys nor so its tiles: the piece is positions [j n / S, (j + 1) n /
    S) of the block's n. Where n < S some pieces hold none: such a piece runs position
    j n / S (another piece's) and is not ``live``, so its partial output weighs nothing
    in the merge (every work tile runs at least one key tile)."""
    live = True
    if SPLIT:
        if VARLEN:
            j = kr & 0xFFFF
            pieces = kr >> 16
            lo = j * n_tiles // pieces
            hi = (j + 1) * n_tiles // pieces
            live = hi > lo
            hi = gl.maximum(hi, lo + 1)
        else:
            lo = kr & 0xFFFF
            hi = kr >> 16
    else:
        lo = 0
        hi = n_tiles
    return lo, hi, live


@gluon.jit
def _sequence(seq, N_Q, N_K, Band, VARLEN: gl.constexpr, SHIFTED: gl.constexpr,
              ROW_GROUP: gl.constexpr):
    """(q0, n_q, k0, n_k, Band): where a work tile's sequence starts in the packed tensors
    and how long it is, from the packed list's fields ``seq`` (:func:`_tile`) with
    VARLEN, and the band with bottom-right alignment's OFFSET on the sequence's own
    lengths (n_q rows are n_q / ROW_GROUP positions, :func:`_positions`); else the dense
    (0, N_Q, 0, N_K) and the band as given."""
    if VARLEN:
        q0, n_q, k0, n_k = seq
        if SHIFTED:
            if ROW_GROUP > 1:
                Band = (n_k - n_q // ROW_GROUP, Band[1], Band[2])
            else:
                Band = (n_k - n_q, Band[1], Band[2])
    else:
        q0 = 0
        n_q = N_Q
        k0 = 0
        n_k = N_K
    return q0, n_q, k0, n_k, Band


@gluon.constexpr_function
def _position_count(rows, group):
    """Positions that ``rows`` consecutive rows starting at a multiple of 64 (a multiple
    of 64 themselves) span, where ``group`` consecutive rows share a position: rows /
    group when group divides 64, else a bound (a block may start inside a group)."""
    rows, group = int(rows), int(group)
    if 64 % group == 0:
        return rows // group
    return (rows + group - 2) // group + 1


@gluon.jit
def _positions(row0, ROW_GROUP: gl.constexpr):
    """The position of row ``row0`` (a block's first; :func:`_position_count` says how
    many its rows span):
    with ROW_GROUP = G > 1 a decoding call's packed rows, row r holding query token r // G
    of one of the G query heads that share a kv head; else the row itself."""
    if ROW_GROUP > 1:
        row0 = row0 // ROW_GROUP
    return row0


@gluon.jit
def _divmod(n, d, m, k):
    """(n // d, n % d) for 0 <= n < 2^31 and a d >= 1 that is the same for every work
    tile: n // d = (n (m + 2^31)) >> k with (m, k) from
    :func:`flashscope.launch.divider`, kernel arguments that stay in the constant bank.
    A division by a value the compiler does not know costs a reciprocal on MUFU and about
    twenty dependent integer instructions, redone for every work tile: two of them took
    most of the 470 clocks between one work tile's output and the next one's start at
    N = 1024; computed in the kernel once, the
    multipliers take registers the D = 128 consumers do not have (spills). One asm block
    keeps the 64-bit steps on the per-tile value: widened in Triton, the arguments' 64-bit
    copies are hoisted to the kernel's start and spilled on the way into the partitions."""
    q = gl.inline_asm_elementwise(
        "{ .reg .u64 p, s; mul.wide.u32 p, $1, $2; cvt.u64.u32 s, $1; shl.b64 s, s, 31; "
        "add.u64 p, p, s; shr.u64 p, p, $3; cvt.u32.u64 $0, p; }",
        "=r,r,r,r", [n, m, k], dtype=gl.int32, is_pure=True, pack=1)
    return q, n - q * d


@gluon.jit
def _work(t, n_m, H, GROUP, N_K, Div, Band, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          IS_CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
          SHIFTED: gl.constexpr, VARLEN: gl.constexpr, ROW_GROUP: gl.constexpr):
    """Work tile t = pid_bh * n_m + pid_m -> (pid_bh, b, h, kv head, first row, first key
    tile, key tiles, first masked key, sequence). Div: (m, k) of n_m, H and GROUP for
    :func:`_divmod`. b is the descriptors' batch coordinate: with VARLEN 0 (the packed
    tensors are one batch); the sequence is pid_bh // H either way (with VARLEN the
    packed sequence, a KV cache's batch entry).

    Tiles run in index order on each program, so the order is the schedule. Round robin,
    the row blocks of one head are adjacent: programs running together share K and V in
    L2. A host list (causal, or non-causal with BALANCE or SPLIT) already orders and
    places the tiles (:mod:`flashscope.schedule`: sections of heads that fit in L2,
    longest first, assigned greedily).

    A band (a window bound, or bottom-right alignment: HAS_LEFT, HAS_RIGHT, SHIFTED, with
    Band = (OFFSET, LEFT, RIGHT) as :func:`flashscope.kernels.keyrange.key_range` takes
    them) visits the key tiles its rows see, from the first one; a block that sees no key
    at all still takes one (fully masked: its rows come out zero), so every work tile
    has a first tile to peel, and so does a packed sequence without keys (VARLEN; N_K
    is then the sequence's own). Without a band the first tile is 0. A band over packed
    rows (ROW_GROUP > 1) takes the keys of the rows' positions (:func:`_positions`)."""
    pid_bh, pid_m = _divmod(t, n_m, Div[0], Div[1])
    seq, off_h = _divmod(pid_bh, H, Div[2], Div[3])
    off_hkv, _ = _divmod(off_h, GROUP, Div[4], Div[5])
    off_b = seq
    if VARLEN:
        off_b = 0
    start_m = pid_m * BLOCK_M
    if HAS_LEFT or HAS_RIGHT or SHIFTED:
        lo, _, _, hi = key_range(_positions(start_m, ROW_GROUP), N_K, Band[0],
                                 Band[1], Band[2], _position_count(BLOCK_M, ROW_GROUP),
                                 BLOCK_N, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
        first = gl.minimum(lo // BLOCK_N, (N_K - 1) // BLOCK_N)
        n_tiles = gl.maximum(gl.cdiv(hi, BLOCK_N) - first, 1)
        mask_from = 0  # unread: a band's consumers read their own (:func:`_band_own`)
    else:
        first = 0
        # mask_from: the first tile holding a key some row of the block does not see
        _, _, mask_from, hi = key_range(start_m, N_K, 0, 0, 0, BLOCK_M, BLOCK_N, IS_CAUSAL,
                                        False, False, False)
        n_tiles = gl.cdiv(hi, BLOCK_N)
        if VARLEN:  # a sequence without keys takes one tile too (fully masked)
            n_tiles = gl.maximum(n_tiles, 1)
    return pid_bh, off_b, off_h, off_hkv, start_m, first, n_tiles, mask_from, seq


@gluon.jit
def _key_tile(pos, n_tiles, mask_from, BLOCK_N: gl.constexpr, MASKED_FIRST: gl.constexpr):
    """The key tile loaded and consumed pos-th in a work tile: pos itself, or with
    MASKED_FIRST the masked ones first, the last first (n_tiles - 1, n_tiles - 2, ..
    mask_from / BLOCK_N), then 0, 1, .. in order.

    In that order each consumer meets the key tiles past its own rows
    (:func:`_own_tiles`), which it passes, then the one tile it masks (at most one: its
    diagonal tile, or the partial last tile), which the peeled first step of its loop
    takes, then only whole tiles: the loop carries no mask and no branch around one."""
    if MASKED_FIRST:
        n_edge = n_tiles - mask_from // BLOCK_N
        edge = (pos < n_edge).to(gl.int32)
        pos = edge * (n_tiles - 1 - pos) + (1 - edge) * (pos - n_edge)
    return pos


@gluon.jit
def _own_tiles(row0, N_Q, N_K, n_tiles, mask_from, ROWS: gl.constexpr,
               BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, LPT: gl.constexpr,
               BAND: gl.constexpr, VARLEN: gl.constexpr):
    """(key tiles, first masked key) of a consumer's own rows [row0, row0 + ROWS).

    A causal work tile loads the key tiles its last row needs, cdiv(min(N_K, start_m +
    BLOCK_M), BLOCK_N). A consumer whose rows end earlier needs cdiv(min(N_K, row0 +
    ROWS), BLOCK_N) and starts masking at the tile holding key row0; rows all at or past
    N_Q take one tile (its store is clipped). With BLOCK_M = 192 and BLOCK_N = 128 a
    work tile holds 1.5 consumer tiles above the diagonal on average and the last one of
    a head two consumers of padding: 23%, 8.2% and 2.3% of the consumer tiles at
    N = 1024, 4096 and 16384, none with BLOCK_M = 128 (passing them measured 5% and 2-3%
    less time at 4096 and 16384). Non-causal work tiles need every
    key tile; only the padding rows of a last work tile can pass. Dealt round-robin that
    saves nothing (the programs holding those tiles are not the last to finish) and
    measured 5% slower than computing them at N = 1024, so they pass only with
    LPT = 2, whose list (BALANCE) puts the cheaper tiles where they shorten the grid.
    With VARLEN, N_Q and N_K are the sequence's own. A BAND's consumers take their own
    range of the work tile's tiles instead (:func:`_band_own`)."""
    if IS_CAUSAL and not BAND:
        _, _, mask_own, hi = key_range(row0, N_K, 0, 0, 0, ROWS, BLOCK_N, True, False,
                                       False, False)
        n_own = gl.cdiv(hi, BLOCK_N)
    else:
        n_own = n_tiles
        mask_own = mask_from
    if VARLEN:  # a packed sequence without keys: one fully masked tile (:func:`_work`)
        n_own = gl.maximum(n_own, 1)
    if IS_CAUSAL or LPT == 2:  # rows all at or past N_Q: one tile, the rest passed
        n_own = 1 + (n_own - 1) * (row0 < N_Q).to(gl.int32)
    return n_own, mask_own


@gluon.jit
def _band_own(row0, N_K, Band, t0, n_tiles, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
              IS_CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
              SHIFTED: gl.constexpr, ROW_GROUP: gl.constexpr):
    """(first, end, full_lo, full_hi) of a band's consumer, rows [row0, row0 + ROWS):
    it computes positions [first, end) of its work tile (whose first key tile is t0, of
    n_tiles), the key tiles its own rows see, and passes the others, which only the work
    tile's other rows see; of those it computes, the tiles of keys [full_lo, full_hi)
    hold only keys every one of its rows sees (tile multiples) and the rest are masked
    (:func:`flashscope.kernels.sm90_softmax._masked`): the one or two tiles each edge of
    the band crosses, whatever the window's width. A consumer whose rows see no key
    (or lie past the keys) still computes one tile, fully masked.

    Why per consumer: a work tile of 192 rows under a causal band of w keys loads the
    w + 192 keys its rows see together, each consumer's 64 rows only w + 64 of them; at
    w = 512 that is 5 key tiles of 128 a consumer instead of 6 or 7. Packed rows
    (ROW_GROUP > 1) see the keys of their positions (:func:`_positions`)."""
    lo, full_lo, full_hi, hi = key_range(_positions(row0, ROW_GROUP), N_K, Band[0],
                                         Band[1], Band[2], _position_count(ROWS, ROW_GROUP),
                                         BLOCK_N, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, SHIFTED)
    first = gl.minimum(gl.maximum(lo // BLOCK_N - t0, 0), n_tiles - 1)
    end = gl.minimum(gl.maximum(gl.cdiv(hi, BLOCK_N) - t0, first + 1), n_tiles)
    return first, end, full_lo, full_hi
