"""Per-phase timelines of the persistent sm90 forward, read from its clock stamps.

A ``TRACE = R`` build of :mod:`flashscope.kernels.attention_fwd_sm90` writes the SM's
``clock64`` at fixed points of each of a program's first R work tiles into an int64
buffer shaped (P, 4, R, 8): program, part (consumers 0-2, 3 the producer), work tile,
slot. All parts of a program share one SM and so one clock. The slots:

consumer: 0 tile start (after the work-list read), 1 Q ready, 2 first K ready, 3 first
scores done, 4 key-tile loop done, 5 last P V done, 6 output issued, 7 the key tiles the
consumer computes (a count, not a clock: a band's consumer passes the work tile's others);
producer: 0 tile start, 1 Q issued, 2 first K and V issued, 3 all issued, 4 first K
issued (from the second tile on), 5 the work tile's index, 6 its key tiles (counts).
A paged cache's build with two loaders (``LOADERS = 2``) stamps the Q and K loader's
points only: slots 2 and 3 then mean K's, V's own warp records nothing.

The phases of :data:`CONSUMER_PHASES` split each consumer's time between its first
tile start and its last output into what it waited for and what it computed; the time
from one tile's output to the next tile's start (``between``) is the work-list read and
the index arithmetic. Everything here is plain numpy, so a trace saved on a GPU machine
(``scripts/gpu/trace_fwd.py``) is read anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Parts of a program in the buffer: consumers 0..2, then the producer.
PRODUCER = 3
SLOTS = 8

#: (name, from slot, to slot) of a consumer's phases within one work tile.
CONSUMER_PHASES = (
    ("q_wait", 0, 1),  # its Q slot loaded
    ("k0_wait", 1, 2),  # the first key tile loaded
    ("first_scores", 2, 3),  # the turn (PINGPONG), Q K_0^T issued and completed
    ("loop", 3, 4),  # the n - 1 pipelined key-tile steps
    ("last_pv", 4, 5),  # the last V loaded, P V issued and completed
    ("output", 5, 6),  # passed tiles (in key order), O / l, the staged store
)


@dataclass(frozen=True)
class PhaseRow:
    """One phase of one consumer, summed over the recorded work tiles of all programs."""

    consumer: int
    phase: str
    cycles: float  # mean per work tile
    share: float  # of the consumer's span, first tile start to last output


def _check(trace: np.ndarray) -> np.ndarray:
    trace = np.asarray(trace)
    if trace.ndim != 4 or trace.shape[1] != 4 or trace.shape[3] != SLOTS:
        raise ValueError(f"trace: expected an int64 array shaped (programs, 4, tiles, "
                         f"{SLOTS}), got shape {trace.shape}")
    return trace.astype(np.int64)


def tiles_recorded(trace: np.ndarray, part: int) -> np.ndarray:
    """(P, R) bool: which work tiles of each program ``part`` recorded (a tile start and
    an end stamp, both nonzero: the buffer starts zeroed)."""
    trace = _check(trace)
    end = 3 if part == PRODUCER else 6
    return (trace[:, part, :, 0] != 0) & (trace[:, part, :, end] != 0)


def consumer_phases(trace: np.ndarray, consumers: int) -> list[PhaseRow]:
    """Mean cycles per work tile of each phase in :data:`CONSUMER_PHASES`, plus
    ``between`` (output issued to the next tile's start) and ``per_key_tile`` (the loop
    over its n - 1 steps, for tiles with n > 1; its share is left 0), per consumer."""
    trace = _check(trace)
    rows = []
    for c in range(consumers):
        t = trace[:, c]
        ok = tiles_recorded(trace, c)
        if not ok.any():
            raise ValueError(f"trace: consumer {c} recorded no work tile")
        span = 0.0
        for p in range(t.shape[0]):
            idx = np.flatnonzero(ok[p])
            if idx.size:
                span += float(t[p, idx[-1], 6] - t[p, idx[0], 0])
        n = ok.sum()
        for name, a, b in CONSUMER_PHASES:
            total = float((t[..., b] - t[..., a])[ok].sum())
            rows.append(PhaseRow(c, name, total / n, total / span if span else 0.0))
        nxt = ok[:, :-1] & ok[:, 1:]
        gap = float((t[:, 1:, 0] - t[:, :-1, 6])[nxt].sum())
        rows.append(PhaseRow(c, "between", gap / max(1, nxt.sum()),
                             gap / span if span else 0.0))
        steps = t[..., 7] - 1
        multi = ok & (steps > 0)
        per = ((t[..., 4] - t[..., 3])[multi] / steps[multi]).mean() if multi.any() else 0.0
        rows.append(PhaseRow(c, "per_key_tile", float(per), 0.0))
    return rows


def by_key_tiles(trace: np.ndarray, consumer: int) -> dict[int, tuple[int, float]]:
    """{key tiles n: (work tiles, mean cycles from tile start to output issued)} for one
    consumer: the fixed cost per work tile is the intercept of that time against n."""
    trace = _check(trace)
    t = trace[:, consumer]
    ok = tiles_recorded(trace, consumer)
    n = t[..., 7][ok]
    dur = (t[..., 6] - t[..., 0])[ok]
    return {int(k): (int((n == k).sum()), float(dur[n == k].mean())) for k in np.unique(n)}


def fixed_cost(trace: np.ndarray, consumer: int) -> tuple[float, float]:
    """(cycles per key tile, fixed cycles per work tile): a least-squares line through a
    consumer's work-tile durations against its key tiles. Needs two distinct counts."""
    trace = _check(trace)
    t = trace[:, consumer]
    ok = tiles_recorded(trace, consumer)
    n = t[..., 7][ok].astype(float)
    dur = (t[..., 6] - t[..., 0])[ok].astype(float)
    if np.unique(n).size < 2:
        raise ValueError(f"trace: consumer {consumer}'s work tiles all have {int(n[0])} key "
                         "tiles; a fixed cost needs two different counts")
    slope, intercept = np.polyfit(n, dur, 1)
    return float(slope), float(intercept)


def format_phases(rows: list[PhaseRow]) -> str:
    """The rows as a text table, one column per consumer (cycles, and % of the span)."""
    consumers = sorted({r.consumer for r in rows})
    names = list(dict.fromkeys(r.phase for r in rows))
    cell = {(r.consumer, r.phase): r for r in rows}
    out = ["phase".ljust(14) + "".join(f"consumer {c}".rjust(20) for c in consumers)]
    for name in names:
        line = name.ljust(14)
        for c in consumers:
            r = cell[(c, name)]
            text = f"{r.cycles:9.0f}" + (f" ({100 * r.share:4.1f}%)" if r.share else " " * 8)
            line += text.rjust(20)
        out.append(line)
    return "\n".join(out)


@dataclass(frozen=True)
class ProgramSpan:
    """One program of a persistent grid: its work tiles and how long it ran."""

    program: int
    cycles: int  # first consumer's first tile start to the last output issued
    tiles: int  # work tiles recorded
    last_blocks: int  # of them, a head's last row block (index mod n_m = n_m - 1)


def _program_tiles(trace: np.ndarray, consumers: int):
    """(program, work tile indices, start cycles, end cycles) of each program that
    recorded a tile, its tiles in run order: those the producer and every consumer
    recorded (start: the earliest consumer's, end: the latest consumer's output)."""
    ok = tiles_recorded(trace, PRODUCER)
    for c in range(consumers):
        ok &= tiles_recorded(trace, c)
    for p in range(trace.shape[0]):
        r = np.flatnonzero(ok[p])
        if not r.size:
            continue
        if r[-1] != r.size - 1:
            raise ValueError(f"trace: program {p} has a gap in its recorded work tiles")
        cons = trace[p, :consumers][:, r]
        yield p, trace[p, PRODUCER, r, 5], cons[..., 0].min(0), cons[..., 6].max(0)


def program_spans(trace: np.ndarray, consumers: int, n_m: int) -> list[ProgramSpan]:
    """Each program's span and work tiles; the spans of programs with as many tiles set
    the grid's end (all programs start together on a persistent grid; each span is read
    on its own SM's clock, so spans compare and end times would not). n_m: row blocks
    per head. The buffer must hold every tile (TRACE >= the longest program's count)."""
    out = [ProgramSpan(p, int(end[-1] - start[0]), int(t.size),
                       int((t % n_m == n_m - 1).sum()))
           for p, t, start, end in _program_tiles(_check(trace), consumers)]
    if not out:
        raise ValueError("trace: no program recorded a work tile")
    return out


def block_cycles(trace: np.ndarray, consumers: int, n_m: int) -> tuple[float, float]:
    """(median cycles of a work tile that is not a head's last row block, median cycles of
    one that is; nan where none ran). A tile's time runs from its start to the next
    one's, or to its output for a program's last: with the next tile's loads under way
    in its epilogue, this is what it adds to the program's span. Non-causal, their ratio
    is the cost of a last block whose padding consumers pass (``LONE_SHARE`` in
    :mod:`flashscope.schedule`)."""
    whole, last = [], []
    for _, t, start, end in _program_tiles(_check(trace), consumers):
        for ti, d in zip(t, np.append(start[1:], end[-1:]) - start):
            (last if ti % n_m == n_m - 1 else whole).append(float(d))
    med = lambda x: float(np.median(x)) if x else float("nan")  # noqa: E731
    return med(whole), med(last)


def format_spans(spans: list[ProgramSpan]) -> str:
    """Programs grouped by (work tiles, last blocks): count, mean and longest span."""
    groups = {}
    for s in spans:
        groups.setdefault((s.tiles, s.last_blocks), []).append(s.cycles)
    out = ["tiles  last blocks  programs   mean span  longest span"]
    for (n, k), c in sorted(groups.items()):
        out.append(f"{n:5d}  {k:11d}  {len(c):8d}  {np.mean(c):10.0f}  {max(c):12.0f}")
    return "\n".join(out)

