"""Very long forward cases are checked against sampled row blocks of the reference
(flashscope.bench.validate.SAMPLE_WORK): the sample's rows sit where the masks change
(first and last rows, starts off the tiles), every output element is still checked finite,
and a fault in a sampled block is caught as on a whole reference. Very long backward
cases are checked against the reference of some (batch, kv head) pairs, the last always
among them, under the same rules."""

import pytest
import torch
import torch.nn.functional as F

from flashscope.bench import validate
from flashscope.bench.suite import Case
from flashscope.testing.reference import reference_attention


def test_row_range_is_those_rows_of_the_whole_reference():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 16, generator=g, dtype=torch.float64)
               for n in (70, 90, 90))
    k, v = k[:, :2], v[:, :2]
    for mask in (dict(is_causal=True), dict(window=(20, 3), align="bottom_right"),
                 dict(softcap=5.0)):
        whole = reference_attention(q, k, v, **mask)
        part = reference_attention(q, k, v, row_range=(13, 51), **mask)
        torch.testing.assert_close(part, whole[:, :, 13:51], rtol=0, atol=1e-12)
    with pytest.raises(Exception, match="row_range"):
        reference_attention(q, k, v, row_range=(60, 80))


@pytest.mark.parametrize("n", [4097, 131072, 5000])
def test_sample_starts_cover_both_ends_without_overlap(n):
    starts = validate.sample_starts(n)
    size = validate.SAMPLE_ROWS
    assert starts[0] == 0 and starts[-1] + size == n and len(starts) == validate.SAMPLE_BLOCKS
    assert all(b - a >= size for a, b in zip(starts, starts[1:]))
    assert any(s % 64 for s in starts[1:-1])  # not every block starts on a tile


def _sampled(monkeypatch):
    monkeypatch.setattr(validate, "SAMPLE_WORK", 0)
    monkeypatch.setattr(validate, "SAMPLE_BLOCKS", 3)
    monkeypatch.setattr(validate, "SAMPLE_ROWS", 8)


CASE = Case(1, 2, 100, 100, 16, 2, causal=True, dtype="float16")


def _honest(q, k, v):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                          is_causal=True).to(q.dtype)


def _check(fn):
    return validate.check_step(lambda inp: validate.make_step(fn, CASE, inp), CASE,
                               "bhnd", "cpu")


def test_a_sampled_case_passes_an_honest_provider(monkeypatch):
    _sampled(monkeypatch)
    inp = validate.make_inputs(CASE, "bhnd", "cpu")
    ref = validate.reference_for(CASE, inp)[0]
    assert isinstance(ref, validate.RowSample) and ref.values.shape[2] == 24
    assert ref.rows[0] == 0 and ref.rows[-1] == CASE.Nq - 1
    *_, err = _check(_honest)
    assert err < 1e-2


@pytest.mark.parametrize("where,fault", [
    ("last", "relative error"),    # the last block is always in the sample
    ("first", "relative error"),
    ("unwritten", "NaN/inf"),      # every element is checked finite, sampled or not
])
def test_a_sampled_case_still_catches_faults(monkeypatch, where, fault):
    _sampled(monkeypatch)

    def fn(q, k, v):
        out = _honest(q, k, v)
        if where == "last":
            out[:, :, -1] += 1.0
        elif where == "first":
            out[:, :, 0] = 0.0
        else:
            out[:, :, 50] = float("nan")
        return out

    with pytest.raises(validate.ValidationFailure, match=fault):
        _check(fn)


# -- backward cases: (batch, kv head) pairs ---------------------------------------------------

@pytest.mark.parametrize("batch,kv,keep", [(1, 8, 1), (1, 8, 2), (2, 8, 3), (4, 2, 8),
                                           (3, 1, 5), (2, 3, 100)])
def test_sample_pairs_spread_over_the_batch_with_the_last_pair(batch, kv, keep):
    pairs = validate.sample_pairs(batch, kv, keep)
    flat = [b * kv + h for b, h in pairs]
    assert flat == sorted(set(flat)) and len(flat) == min(keep, batch * kv)
    assert all(0 <= b < batch and 0 <= h < kv for b, h in pairs)
    assert flat[-1] == batch * kv - 1
    if keep > 1:
        assert flat[0] == 0


BWD = Case(2, 4, 36, 40, 16, 2, causal=True, dtype="float16", mode="bwd",
           align="bottom_right")


def _sampled_bwd(monkeypatch, keep: int):
    """SAMPLE_WORK set so that ``keep`` of BWD's four (batch, kv head) pairs are kept."""
    work = BWD.B * BWD.H * BWD.Nq * BWD.Nk * BWD.D
    monkeypatch.setattr(validate, "SAMPLE_WORK", work * keep // (BWD.B * BWD.Hkv))


def _honest_bwd(q, k, v):
    k2, v2 = (t.repeat_interleave(BWD.H // BWD.Hkv, dim=1) for t in (k, v))
    bias = torch.ones(BWD.Nq, BWD.Nk, dtype=torch.bool).tril(BWD.Nk - BWD.Nq)
    return F.scaled_dot_product_attention(q.float(), k2.float(), v2.float(),
                                          attn_mask=bias).to(q.dtype)


def _check_bwd(fn, layout="bhnd"):
    return validate.check_step(lambda inp: validate.make_step(fn, BWD, inp), BWD,
                               layout, "cpu")


@pytest.mark.parametrize("keep", [1, 2])
def test_a_sampled_backward_is_the_whole_reference_at_its_pairs(monkeypatch, keep):
    whole_inp = validate.make_inputs(BWD, "bhnd", "cpu")
    whole = validate.reference_for(BWD, whole_inp)
    _sampled_bwd(monkeypatch, keep)
    sample = validate.reference_for(BWD, whole_inp)
    assert all(isinstance(s, validate.GroupSample) for s in sample)
    assert sample[0].pairs == validate.sample_pairs(BWD.B, BWD.Hkv, keep)
    for name, s, w in zip(validate.OUTPUT_NAMES, sample, whole):
        assert s.shape == tuple(w.shape), name
        assert s.values.shape[0] == keep * (BWD.H // BWD.Hkv if name in ("out", "dq") else 1)
        torch.testing.assert_close(s.values, s.pick(w), rtol=0, atol=1e-9)


@pytest.mark.parametrize("keep", [1, 3])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_a_sampled_backward_passes_an_honest_provider(monkeypatch, keep, layout):
    _sampled_bwd(monkeypatch, keep)
    if layout == "bnhd":  # (B, N, H, D) in the provider's hands, as FlashAttention's
        def fn(q, k, v):
            return _honest_bwd(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    else:
        fn = _honest_bwd
    *_, err = _check_bwd(fn, layout)
    assert 0 < err < 1e-2


@pytest.mark.parametrize("where,fault", [
    ("sampled", "dk: relative error"),  # the last pair is always in the sample
    ("unsampled", "dv: 1 of"),          # every element is checked finite, sampled or not
])
def test_a_sampled_backward_still_catches_faults(monkeypatch, where, fault):
    _sampled_bwd(monkeypatch, 1)

    class Faulty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, k, v):
            return k.view_as(k), v.view_as(v)

        @staticmethod
        def backward(ctx, dk, dv):
            dk, dv = dk.clone(), dv.clone()
            if where == "sampled":
                dk[-1, -1] += 1.0
            else:
                dv[0, 0, 0, 0] = float("nan")
            return dk, dv

    with pytest.raises(validate.ValidationFailure, match=fault):
        _check_bwd(lambda q, k, v: _honest_bwd(q, *Faulty.apply(k, v)))
