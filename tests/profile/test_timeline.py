import numpy as np
import pytest

from flashscope.profile import timeline


def _synthetic(programs=3, tiles=5, consumers=2, fixed=700, per_tile=900, gap=40, seed=0):
    """A stamp buffer whose phases are known: Q 100 cycles, first K 50, the first scores
    what makes a one-key-tile work tile take ``fixed``, per_tile per loop step, the last
    P V 200, the output 300, ``gap`` between work tiles; 1-8 key tiles each."""
    rng = np.random.default_rng(seed)
    tr = np.zeros((programs, 4, tiles + 2, timeline.SLOTS), dtype=np.int64)
    for p in range(programs):
        for c in range(consumers):
            t = 1000 + 17 * p
            for r in range(tiles):
                n = int(rng.integers(1, 9))
                first = fixed - 100 - 50 - 200 - 300
                stamps = [t, t + 100, t + 150, t + 150 + first,
                          t + 150 + first + per_tile * (n - 1)]
                stamps += [stamps[-1] + 200, stamps[-1] + 500]
                tr[p, c, r, :7] = stamps
                tr[p, c, r, 7] = n
                t = stamps[-1] + gap
    return tr


def test_phases_recover_known_costs():
    tr = _synthetic()
    rows = {(r.consumer, r.phase): r for r in timeline.consumer_phases(tr, 2)}
    assert rows[(0, "q_wait")].cycles == pytest.approx(100)
    assert rows[(1, "k0_wait")].cycles == pytest.approx(50)
    assert rows[(0, "last_pv")].cycles == pytest.approx(200)
    assert rows[(1, "output")].cycles == pytest.approx(300)
    assert rows[(0, "between")].cycles == pytest.approx(40)
    assert rows[(0, "per_key_tile")].cycles == pytest.approx(900)
    # the shares of the phases and the gaps between tiles make up the whole span
    total = sum(r.share for r in rows.values() if r.consumer == 0)
    assert total == pytest.approx(1.0)


def test_fixed_cost_is_the_intercept():
    tr = _synthetic(fixed=700, per_tile=900)
    slope, icpt = timeline.fixed_cost(tr, 0)
    assert slope == pytest.approx(900)
    assert icpt == pytest.approx(700 - 900)  # a work tile of n key tiles: 700 + 900 (n - 1)
    counts = timeline.by_key_tiles(tr, 1)
    assert sum(w for w, _ in counts.values()) == 3 * 5
    assert all(d == pytest.approx(700 + 900 * (n - 1))
               for n, (_, d) in counts.items())


def test_unrecorded_tiles_are_ignored():
    tr = _synthetic(tiles=4)
    tr[0, 0, 1, 6] = 0  # a tile whose end stamp never landed
    ok = timeline.tiles_recorded(tr, 0)
    assert ok[0].tolist() == [True, False, True, True, False, False]
    rows = {(r.consumer, r.phase): r for r in timeline.consumer_phases(tr, 1)}
    assert rows[(0, "q_wait")].cycles == pytest.approx(100)


def test_bad_buffers_are_named():
    with pytest.raises(ValueError, match="trace: expected an int64 array"):
        timeline.consumer_phases(np.zeros((3, 4, 8)), 1)
    with pytest.raises(ValueError, match="consumer 0 recorded no work tile"):
        timeline.consumer_phases(np.zeros((2, 4, 3, 8), dtype=np.int64), 1)
    tr = _synthetic()
    tr[..., 7] = np.where(tr[..., 7] > 0, 3, 0)
    with pytest.raises(ValueError, match="all have 3 key tiles"):
        timeline.fixed_cost(tr, 0)


def test_table_names_every_phase():
    text = timeline.format_phases(timeline.consumer_phases(_synthetic(), 2))
    for name, _, _ in timeline.CONSUMER_PHASES:
        assert name in text
    assert "consumer 1" in text and "per_key_tile" in text


def _grid(n_m=3, lone=0.6, whole=1000):
    """Two programs of two consumers: program 0 runs blocks 0, 1, 2 (2 is a head's last,
    lone-consumer block, ``lone`` of a whole one's time), program 1 blocks 3, 4."""
    tr = np.zeros((2, 4, 4, timeline.SLOTS), dtype=np.int64)
    for p, blocks in enumerate([(0, 1, 2), (3, 4)]):
        t = 5000 + 333 * p  # each SM its own clock
        for r, b in enumerate(blocks):
            d = int(whole * (lone if b % n_m == n_m - 1 else 1.0))
            tr[p, timeline.PRODUCER, r, [0, 3, 5]] = [t, t + d // 2, b]
            for c in range(2):
                tr[p, c, r, :7] = np.linspace(t, t + d - 10, 7).astype(np.int64)
                tr[p, c, r, 7] = 4
            t += d
    return tr


def test_program_spans_and_last_block_cost():
    tr = _grid()
    spans = timeline.program_spans(tr, 2, 3)
    assert [(s.program, s.tiles, s.last_blocks) for s in spans] == [(0, 3, 1), (1, 2, 0)]
    assert spans[0].cycles == 1000 + 1000 + 600 - 10 and spans[1].cycles == 2000 - 10
    whole, last = timeline.block_cycles(tr, 2, 3)
    assert whole == pytest.approx(1000, abs=10) and last == pytest.approx(590)
    text = timeline.format_spans(spans)
    assert "last blocks" in text and text.count("\n") == 2


def test_spans_refuse_gaps_and_empty_buffers():
    tr = _grid()
    tr[0, 1, 1, 6] = 0  # the middle tile of program 0 lost its end stamp
    with pytest.raises(ValueError, match="program 0 has a gap"):
        timeline.program_spans(tr, 2, 3)
    with pytest.raises(ValueError, match="no program recorded"):
        timeline.program_spans(np.zeros((2, 4, 3, 8), dtype=np.int64), 2, 3)
