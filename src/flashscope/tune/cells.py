"""Cells: the problems a tuner times, named so that a person and a file name can carry them.

A cell is one forward problem, a :class:`flashscope.bench.suite.Case`, under a name:

- a cell of the standard suite, ``d<D><c|n><N>k``: ``d64c1k`` is D = 64, causal,
  N = 1024, with the suite's B = 16384 / N and H = 2048 / D (``n``: no mask);
- any other shape, ``<B>x<H>x<Nq>x<D>[x<Nk>[x<Hkv>]]<c|n>``: ``1x32x128x64x16384n`` is 32
  heads of 128 queries over 16384 keys, no mask (the dimensions of ``--shape``, joined
  by ``x`` so the name is also a file name);
- either, followed by the rest of its mask: ``w<L>_<R>`` a sliding window of L keys left
  and R right (``u``: unbounded), ``br`` bottom-right alignment, ``s<C>`` a logit cap:
  ``2x16x32768x128cw512_0`` is a causal window of 512 keys, ``8x16x8192x128ns30`` a
  cap of 30 (``--window``, ``--align``, ``--softcap``).

A named suite gives its dense forward shapes as cells (:func:`suite_cells`): ``standard``
in the first form, ``models`` in the second.

Each cell maps to the tuned entry it would decide (:func:`problem`): its key length's
class, head dim, mask and dtype. A cell with a window, bottom-right alignment or a cap
poses its band to the rule (tuned entries hold none: ``adopt`` skips such cells).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..bench.suite import SUITE_TOKENS, SUITE_WIDTH, Case, parse_shape
from ..errors import FlashscopeError
from ..families import Problem

_MASK = r"(?:w(\d+|u)_(\d+|u))?(br)?(?:s(\d+(?:\.\d+)?))?"
_SUITE = re.compile(r"d(\d+)([cn])(\d+)k" + _MASK)
_SHAPE = re.compile(r"(\d+(?:x\d+){3,5})([cn])" + _MASK)
FORMS = ("d<D><c|n><N>k (e.g. d64c1k) or BxHxNqxD[xNk[xHkv]]<c|n> (e.g. 4x16x4096x128n), "
         "then optionally w<L>_<R>, br, s<C>")


@dataclass(frozen=True)
class Cell:
    name: str
    case: Case

    @property
    def label(self) -> str:
        return f"{self.name} ({self.case.label})"


def _mask_of(m, at: int) -> dict:
    """The window, alignment and cap of a name's mask groups starting at group ``at``."""
    left, right, br, cap = m.group(at, at + 1, at + 2, at + 3)
    out = {}
    if left is not None:
        out["window"] = tuple(None if v == "u" else int(v) for v in (left, right))
    if br:
        out["align"] = "bottom_right"
    if cap is not None:
        out["softcap"] = float(cap)
    return out


def mask_suffix(case: Case) -> str:
    """The name's mask part of a case (module docstring): '' for a causal or unmasked one."""
    out = ""
    if case.window is not None:
        out += "w" + "_".join("u" if v is None or v < 0 else str(v) for v in case.window)
    if case.align == "bottom_right":
        out += "br"
    if case.softcap is not None:
        out += "s" + f"{case.softcap:g}"
    return out


def mask_meta(case: Case) -> dict:
    """A result file's record of a cell's mask beyond ``causal``, where it has one:
    ``window`` [left, right] (None: unbounded), ``align``, ``softcap``."""
    out = {}
    if case.window is not None:
        out["window"] = [None if v is None or v < 0 else v for v in case.window]
    if case.align != "top_left":
        out["align"] = case.align
    if case.softcap is not None:
        out["softcap"] = case.softcap
    return out


def parse_cell(text: str, dtype: str = "bfloat16") -> Cell:
    """The cell a name stands for (module docstring); FlashscopeError naming the form
    expected otherwise."""
    name = str(text).strip()
    m = _SUITE.fullmatch(name)
    if m:
        D, causal, N = int(m.group(1)), m.group(2) == "c", int(m.group(3)) * 1024
        if not (0 < N <= SUITE_TOKENS and SUITE_TOKENS % N == 0 and 0 < D <= SUITE_WIDTH
                and SUITE_WIDTH % D == 0):
            raise FlashscopeError(f"cell {name!r}: the standard suite has B = 16384 / N and "
                                  f"H = 2048 / D, so N in 1k..16k and D dividing 2048; name "
                                  f"other shapes as {FORMS.split(' or ')[1]}")
        B, H = SUITE_TOKENS // N, SUITE_WIDTH // D
        case = _masked(Case(B, H, N, N, D, H, causal, dtype), _mask_of(m, 4), name, "cell")
        return Cell(name, case)
    m = _SHAPE.fullmatch(name)
    if m:
        try:
            cell = shape_cell(m.group(1).replace("x", ","), m.group(2) == "c", dtype, "cell",
                              **_mask_of(m, 3))
        except FlashscopeError as e:
            raise FlashscopeError(f"cell {name!r}: {str(e).split(': ', 1)[-1]}") from None
        return Cell(name, cell.case)
    raise FlashscopeError(f"cell {name!r}: expected {FORMS}")


def _masked(case: Case, mask: dict, text: str, what: str) -> Case:
    """``case`` with the window, alignment and cap of ``mask``, checked as the API checks
    them (FlashscopeError naming ``what``)."""
    if not mask:
        return case
    from ..masks import Mask

    out = case.with_(**mask)
    try:
        if out.softcap is not None and not out.softcap > 0:
            raise FlashscopeError(f"softcap: expected a number > 0, got {out.softcap:g}")
        Mask.of(out.causal, out.window, out.align, out.softcap)
    except FlashscopeError as e:
        raise FlashscopeError(f"{what} {text!r}: {e}") from None
    return out


def shape_cell(shape: str, causal: bool, dtype: str = "bfloat16", what="--shape",
               window=None, align: str = "top_left", softcap=None) -> Cell:
    """The cell of a ``B,H,N,D[,Nk[,Hkv]]`` shape and mask, named in the ``x`` form."""
    try:
        B, H, N, D, Nk, Hkv = parse_shape(shape)
    except FlashscopeError as e:
        raise FlashscopeError(str(e).replace("--shape", what, 1)) from None
    if causal and Nk != N and align != "bottom_right":
        raise FlashscopeError(f"{what} {shape!r}: causal with Nq != Nk aligns the mask "
                              "differently across providers; time it without the mask, or "
                              "aligned bottom-right (--align bottom_right; br in a name)")
    mask = {k: v for k, v in (("window", window), ("softcap", softcap)) if v is not None}
    if align != "top_left":
        mask["align"] = align
    case = _masked(Case(B, H, N, Nk, D, Hkv, causal, dtype), mask, shape, what)
    name = case.shape.replace(",", "x") + ("c" if causal else "n") + mask_suffix(case)
    return Cell(name, case)


def parse_cells(text: str, dtype: str = "bfloat16") -> list:
    """``--cells`` (comma-separated) -> cells, in order; a name given twice is refused."""
    cells = [parse_cell(x, dtype) for x in str(text).split(",") if x.strip()]
    if not cells:
        raise FlashscopeError(f"--cells {text!r}: expected a comma-separated list of {FORMS}")
    names = [c.name for c in cells]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise FlashscopeError(f"--cells: {', '.join(twice)} given twice")
    return cells


def suite_cells(name: str, dtype: str = "bfloat16") -> list:
    """The cells of a bench suite (``standard`` or a table suite of dense shapes such as
    ``models``); a suite whose rows need more than a dense forward (windows, packed
    batches, decoding) or whose causal rows have Nq != Nk is refused by name."""
    from ..bench.suite import SUITE_NAMES, standard_suite, table_suite

    if name == "standard":  # d<D><c|n><N>k where N is whole kilo-tokens
        return [parse_cell(f"d{c.D}{'c' if c.causal else 'n'}{c.Nq // 1024}k", dtype)
                if c.Nq % 1024 == 0 else shape_cell(f"{c.B},{c.H},{c.Nq},{c.D}", c.causal,
                                                    dtype)
                for c in standard_suite(dtypes=(dtype,), modes=("fwd",))]
    if name not in SUITE_NAMES or name == "decode":
        raise FlashscopeError(f"--suite {name!r}: expected a suite of dense forward shapes "
                              "(standard, models)")
    out = []
    for case in table_suite(name, dtypes=(dtype,)):
        extra = sorted(case.needs)
        if extra or case.align != "top_left" or (case.causal and case.Nq != case.Nk):
            raise FlashscopeError(f"--suite {name}: row {case.name!r} is not a dense forward "
                                  f"cell ({', '.join(extra) or 'causal with Nq != Nk'}); "
                                  "expected standard or models")
        shape = f"{case.B},{case.H},{case.Nq},{case.D},{case.Nk},{case.Hkv}"
        out.append(Cell(shape_cell(shape, case.causal, dtype).name, case))
    return out


def problem(cell: Cell, target: str) -> Problem:
    """The :class:`~flashscope.families.Problem` a cell poses on ``target``."""
    c = cell.case
    return Problem(target, c.dtype, c.D, c.causal, c.Nq, c.Nk, c.B * c.H,
                   **c.mask().problem_fields(c.Nq, c.Nk))
