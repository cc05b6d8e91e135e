"""The sm_90 forward's synchronization: ring slots, slot hand-backs, and wgmma turns.

The K/V ring has STAGES slots; a consumer walks them with :func:`_next_slot` (slot and
mbarrier phase, the phase flipping on each wrap). A slot goes back to the producer once
the products reading it have completed (:func:`_release`, :func:`_scores_done`; the
producer waits in :func:`_acquire`), on Gluon's mbarriers. With
PINGPONG the consumers issue their wgmma in turn on hardware named barriers
(:func:`_take_turn`, :func:`_pass_turn`). :func:`_pass_tiles` hands back, and passes the
turns of, key tiles a consumer's rows do not need; :func:`_pin` orders the softmax
around the P V wait. :func:`_grid_wait` holds a decoding call's programs until the kernel
before them (its work list's) has finished; :func:`_grid_launch_next` lets the merge
after a cut grid start early.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def _next_slot(slot, phase, STAGES: gl.constexpr):
    """The ring slot after ``slot`` and its mbarrier phase (flipped on wrapping): two
    integer ops a tile where ``(g + j) % 3`` and ``// 3`` cost a wide multiply each."""
    wrap = (slot == STAGES - 1).to(gl.int32)
    return slot + 1 - STAGES * wrap, phase ^ wrap


@gluon.jit
def _release(empty, s):
    """Hand ring slot ``s`` back on ``empty`` (Gluon puts a warpgroup bar.sync before the
    one thread that arrives)."""
    mbarrier.arrive(empty.index(s), count=1)


@gluon.jit
def _acquire(empty, s, parity, pred):
    """Wait (if ``pred``) for phase ``parity`` of slot ``s``'s free barrier
    (:func:`_release`)."""
    mbarrier.wait(empty.index(s), parity, pred=pred)


@gluon.constexpr_function
def _turn_asm(take, bar, first_open):
    """PTX of a turn on named barrier ``bar`` (256 threads: the waiting warpgroup and the
    one before it). Taking syncs (with ``first_open``, only when $1 = k > 0); passing
    arrives without waiting. $0 is a dummy result: inline asm must return a value."""
    if not take:
        return f"bar.arrive {bar}, 256; mov.u32 $0, 0;"
    if not first_open:
        return f"bar.sync {bar}, 256; mov.u32 $0, 0;"
    return ("{ .reg .pred p; setp.gt.s32 p, $1, 0; " + f"@p bar.sync {bar}, 256; "
            "mov.u32 $0, 0; }")


@gluon.jit
def _grid_wait(x):
    """Wait for the kernels queued before this one to finish and their writes to be
    visible (``griddepcontrol.wait``; ``x``: a dummy operand, inline asm must take and
    return values). A launch with programmatic stream serialization (Triton's
    ``launch_pdl``) may start while the kernel before it runs: what comes before this
    wait (shared memory and barriers set up) overlaps that kernel's tail, and nothing
    after it reads or writes memory too early. Without that launch attribute it returns
    at once."""
    gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [x],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _grid_launch_next(x):
    """Let the kernel queued after this one start now (``griddepcontrol.launch_dependents``):
    a cut grid's merge, launched with programmatic stream serialization, then takes each
    SM this kernel's programs leave and waits there for the whole grid to finish
    (:func:`flashscope.kernels.common.wait_previous`). ``x``: a dummy operand."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r,r",
                              [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _take_turn(C: gl.constexpr, k, PINGPONG: gl.constexpr):
    """With PINGPONG, wait for consumer C's turn number k (from 0); without, nothing.
    Turns go 0, 1, .., C-1, 0, 1, ..: consumer C's turn opens when consumer C-1 (cyclic)
    passes its own, except consumer 0's first, which is open. A turn is hardware named
    barrier 8 + C over 256 threads, FlashAttention-3's warpgroup ping-pong: the 128
    threads of consumer C sync on it, those of consumer C-1 arrive on it
    (:func:`_pass_turn`). Between two syncs of C exactly one pass of C-1 arrives, since
    C-1's next pass follows C's; consumer 0 takes one turn past its last, so every
    arrival has its sync. Ids 8.. sit above the ones Triton 3.6 gives its
    partitions (0 the CTA, 1 the join, 2.. one per partition). Against an mbarrier per
    consumer (a warpgroup bar.sync and a polled try_wait to take, a bar.sync and one
    thread's arrive to pass) 0.7-1.4% faster on the six PINGPONG cells of the suite."""
    if PINGPONG:
        gl.inline_asm_elementwise(_turn_asm(True, 8 + C, C == 0), "=r,r", [k],
                                  dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pass_turn(C: gl.constexpr, CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr):
    """Consumer C has issued its wgmma: with PINGPONG, open the next consumer's turn
    (each warp arrives once its own issue is done)."""
    if PINGPONG:
        gl.inline_asm_elementwise(_turn_asm(False, 8 + (C + 1) % CONSUMERS, False), "=r,r",
                                  [C], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pin(pin, C: gl.constexpr, x):
    """Store x to consumer C's [64, 4] fp32 slot of shared memory (x: [64, 4], or [64, 1]
    into its first column). ptxas keeps shared-memory stores ahead of a wgmma wait, so
    what x depends on stays ahead of the P V wait too and runs under that product; without
    a store, ptxas hoists the wait above it (it places the wait like any instruction, as
    early as its block allows). The consumer stores the row maxima: they run under the
    product and the exponentials follow the wait, the order FlashAttention-4's Hopper
    kernel compiles to (storing the running sums instead, so that the exponentials too run
    under the product, measured slower on every cell)."""
    pin.index(C).slice(0, x.shape[1], 1).store(x)


@gluon.jit
def _scores_done(k_empty, q_empty, k_slot, C: gl.constexpr, q_last,
                 K_EARLY: gl.constexpr, EARLY_Q: gl.constexpr):
    """A Q K^T has completed: with K_EARLY its K slot goes back to the producer; with
    EARLY_Q, where ``q_last`` (the work tile's last Q K^T, or with Q_IN_REGS its first,
    whose operand came from registers loaded before it), consumer C's Q slot too (the
    next Q then loads under the remaining products and the epilogue)."""
    if K_EARLY:
        _release(k_empty, k_slot)
    if EARLY_Q:
        mbarrier.arrive(q_empty.index(C), count=1, pred=q_last)


@gluon.jit
def _pass_tiles(k_ready, v_ready, k_empty, v_empty, slot, phase, n_pass, k,
                C: gl.constexpr, CONSUMERS: gl.constexpr, STAGES: gl.constexpr,
                K_EARLY: gl.constexpr, PINGPONG: gl.constexpr):
    """n_pass key tiles in a row that consumer C's rows do not need (:func:`_own_tiles`):
    each slot goes back once loaded (``ready`` waited first, so each release follows the
    slot's previous phase) and, with PINGPONG, the turns k, k + 1, .. are taken and passed
    at once. ``slot``/``phase``: the first tile's; returns those of the tile after the
    last one passed."""
    for pos in range(0, n_pass):
        mbarrier.wait(k_ready.index(slot), phase)
        mbarrier.wait(v_ready.index(slot), phase)
        if K_EARLY:
            _release(k_empty, slot)
        _release(v_empty, slot)
        _take_turn(C, k + pos, PINGPONG)
        _pass_turn(C, CONSUMERS, PINGPONG)
        slot, phase = _next_slot(slot, phase, STAGES)
    return slot, phase
