"""Very long forward cases are checked against sampled row blocks of the reference
(flashscope.bench.validate.SAMPLE_WORK): the sample's rows sit where the masks change
(first and last rows, starts off the tiles), every output element is still checked finite,
and a fault in a sampled block is caught as on a whole reference."""

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
