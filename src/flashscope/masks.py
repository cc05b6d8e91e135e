"""Which keys a query sees: the one description of a mask, and the key ranges it gives.

A :class:`Mask` also carries the logit cap (``softcap``), the one change to the scores
themselves that the kernels make: both travel from the API to every kernel together.

Query row i sits at position p_i = i + offset in the key sequence: ``offset`` is 0 with
``align="top_left"`` (SDPA's ``is_causal``) and N_K - N_Q with ``align="bottom_right"``
(FlashAttention's, where the last query sits at the last key). It sees key j when

    0 <= j < N_K,   p_i - left <= j  (if left is bounded),   j <= p_i + right  (if right is)

``is_causal`` bounds the right side at 0; a window ``(left, right)`` bounds either side
(None or a negative value: unbounded). A row that sees no key returns zeros and a
log-sum-exp of -inf.

For a block of rows, :func:`key_range` gives the key range [lo, hi) the block visits and the
part [full_lo, full_hi) that no row of it masks (tile-aligned): the kernels run the tiles of
[lo, full_lo) and [full_hi, hi) with masks, the rest without. :func:`query_range` is the
same question from the keys' side (which query rows see a block of keys), for the
backward's dK/dV pass. The kernels compute the same ranges on the device with
:mod:`flashscope.kernels.keyrange`, from :meth:`Mask.scalars` and :meth:`Mask.switches`; a
test checks that host and device agree on every tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

from .errors import FlashscopeError

ALIGNS = ("top_left", "bottom_right")


class Range(NamedTuple):
    """Tile-aligned key (or query) offsets: visit [lo, hi), no mask needed in
    [full_lo, full_hi) (lo <= full_lo <= full_hi <= hi, or all equal when empty)."""

    lo: int
    full_lo: int
    full_hi: int
    hi: int

    @property
    def empty(self) -> bool:
        return self.hi <= self.lo


@dataclass(frozen=True)
class Mask:
    """A mask: ``causal`` (right side bounded at 0), ``left``/``right`` window bounds in
    keys (None: unbounded), and the alignment of queries to keys."""

    causal: bool = False
    left: Optional[int] = None
    right: Optional[int] = None
    align: str = "top_left"
    softcap: Optional[float] = None  #: scores become c tanh(s / c) (c > 0)

    def __post_init__(self):
        if self.align not in ALIGNS:
            raise FlashscopeError(f"align: expected one of {', '.join(ALIGNS)}, got "
                                  f"{self.align!r}")
        for name in ("left", "right"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise FlashscopeError(f"window {name}: expected an integer >= 0 or None, "
                                      f"got {v!r}")
        c = self.softcap
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float))
                              or not math.isfinite(c) or c <= 0):
            raise FlashscopeError(f"softcap: expected a finite number > 0 or None, got {c!r}")

    @classmethod
    def of(cls, causal: bool = False, window=None, align: str = "top_left",
           softcap=None) -> "Mask":
        """The mask of ``attention``'s keywords: ``window=(left, right)`` with None or a
        negative side unbounded, causal clamping the right side to 0."""
        left = right = None
        if window is not None:
            if not isinstance(window, (tuple, list)) or len(window) != 2:
                raise FlashscopeError(f"window: expected (left, right), got {window!r}")
            sides = []
            for name, v in zip(("left", "right"), window):
                if v is None:
                    sides.append(None)
                    continue
                if isinstance(v, bool) or not isinstance(v, int):
                    raise FlashscopeError(f"window {name}: expected an integer or None, got "
                                          f"{v!r}")
                sides.append(None if v < 0 else v)
            left, right = sides
        if causal:
            right = 0 if right is None else min(right, 0)
        return cls(bool(causal), left, right, align,
                   None if softcap is None or softcap == 0 else softcap)

    @property
    def right_bounded(self) -> bool:
        return self.right is not None

    @property
    def left_bounded(self) -> bool:
        return self.left is not None

    @property
    def plain(self) -> bool:
        """No bound at all: every row sees every key."""
        return not (self.left_bounded or self.right_bounded)

    def banded(self, n_q: "int | None" = None, n_k: "int | None" = None) -> bool:
        """Whether the mask is more than causal or none: a left bound, a right bound other
        than causal's, or bounds that bottom-right alignment moves (Nq != Nk; ``None``
        lengths, a packed batch's: any bottom-right bound). What a kernel's tile schedule
        must follow beyond a causal one (:class:`~flashscope.families.base.Problem`'s
        ``window``)."""
        if self.left_bounded or (self.right_bounded and not self.causal):
            return True
        if self.plain or self.align != "bottom_right":
            return False
        return n_q is None or n_k is None or n_q != n_k

    @property
    def span(self) -> int:
        """Keys a row's band spans besides its own, left + right, when both sides are
        bounded; 0 when either is not (a band as wide as the sequence)."""
        if self.left is None or self.right is None:
            return 0
        return self.left + self.right

    def problem_fields(self, n_q: "int | None" = None, n_k: "int | None" = None) -> dict:
        """The :class:`~flashscope.families.base.Problem` fields this mask sets on lengths
        (n_q, n_k) (None: a packed batch's): ``window`` (:meth:`banded`), ``softcap`` and
        ``band_keys`` (:attr:`span`)."""
        return {"window": self.banded(n_q, n_k), "softcap": self.softcap is not None,
                "band_keys": self.span}

    def offset(self, n_q: int, n_k: int) -> int:
        """p_i - i: 0 top-left, n_k - n_q bottom-right."""
        return n_k - n_q if self.align == "bottom_right" else 0

    def visible(self, i: int, j: int, n_q: int, n_k: int) -> bool:
        """Whether query i sees key j (the definition the ranges and kernels follow)."""
        if not (0 <= j < n_k and 0 <= i < n_q):
            return False
        p = i + self.offset(n_q, n_k)
        if self.left_bounded and j < p - self.left:
            return False
        return not (self.right_bounded and j > p + self.right)

    def may_empty(self, n_q: "int | None", n_k: "int | None") -> bool:
        """Whether some row 0 <= i < n_q may see no key (the kernels then guard their
        softmax against rows of -inf). ``None`` lengths: any (a packed batch, whose
        lengths the host does not read): a row may then see nothing when a left bound can
        leave the keys behind it or a bottom-right offset can put it before key 0 (a
        sequence without keys is the kernels' own case: it visits no tile)."""
        if n_q is None or n_k is None:
            return self.left_bounded or (self.right_bounded and self.align == "bottom_right")
        if n_k <= 0:
            return True
        off = self.offset(n_q, n_k)  # rows sit at positions off .. off + n_q - 1
        return ((self.right_bounded and off + self.right < 0)
                or (self.left_bounded and off + n_q - 1 - self.left > n_k - 1))

    def scalars(self, n_q: "int | None", n_k: "int | None") -> tuple:
        """The kernels' runtime mask arguments (OFFSET, LEFT, RIGHT), 0 where unused
        (OFFSET too for ``None`` lengths: a packed batch's kernels take each sequence's
        from its lengths)."""
        off = 0 if n_q is None or n_k is None else self.offset(n_q, n_k)
        return off, self.left or 0, self.right or 0

    def cap_args(self, scale: float) -> tuple:
        """(cap_in, cap_out) = (scale / c, c log2(e)) of the logit cap, (0, 0) without."""
        if self.softcap is None:
            return 0.0, 0.0
        return float(scale) / self.softcap, self.softcap * 1.4426950408889634

    def switches(self, n_q: "int | None", n_k: "int | None") -> dict:
        """The kernels' constexpr mask switches: CAUSAL; HAS_LEFT/HAS_RIGHT (window
        bounds; a causal mask's right bound is CAUSAL's); SHIFTED (OFFSET != 0); GUARD
        (a row may meet a masked tile before it has seen any key: some row sees no key at
        all, or a left bound starts rows of one block at different tiles; the softmax then
        guards rows of -inf). ``None`` lengths (a packed batch): SHIFTED whenever a bound
        is aligned bottom-right, GUARD as :meth:`may_empty` says for any lengths."""
        shifted = (self.align == "bottom_right" and not self.plain
                   if n_q is None or n_k is None else self.offset(n_q, n_k) != 0)
        return dict(CAUSAL=self.causal, HAS_LEFT=self.left_bounded,
                    HAS_RIGHT=self.right_bounded and not self.causal,
                    SHIFTED=shifted,
                    GUARD=self.left_bounded or self.may_empty(n_q, n_k),
                    SOFTCAP=self.softcap is not None)


def _floor(x: int, b: int) -> int:
    return (x // b) * b


def _cdiv(x: int, b: int) -> int:
    return -(-x // b)


def key_range(mask: Mask, m0: int, block_m: int, n_q: int, n_k: int,
              block_n: int) -> Range:
    """The keys the query rows [m0, m0 + block_m) visit, and those none of them masks
    (:func:`flashscope.kernels.keyrange.key_range` on the device, formula for formula).
    Rows past n_q count as rows (their output is not stored), as the kernels' blocks do."""
    first = m0 + mask.offset(n_q, n_k)
    n_full = _floor(n_k, block_n)
    if mask.right_bounded:
        r = mask.right
        if first != m0 or not mask.causal:
            hi = max(min(n_k, first + block_m + r), 0)
            full_hi = min(_floor(max(first + r + 1, 0), block_n), n_full)
        else:
            hi = min(n_k, first + block_m)
            full_hi = min(_floor(first, block_n), n_full)
    else:
        hi, full_hi = n_k, n_full
    if mask.left_bounded:
        lo = min(_floor(max(first - mask.left, 0), block_n), hi)
        full_lo = _cdiv(max(first + block_m - 1 - mask.left, 0), block_n) * block_n
        full_lo = min(max(full_lo, lo), hi)
        full_hi = min(max(full_hi, full_lo), hi)
    else:
        lo = full_lo = 0
        full_hi = min(full_hi, hi)
    return Range(lo, full_lo, full_hi, hi)


def query_range(mask: Mask, n0: int, block_n: int, n_q: int, n_k: int,
                block_m: int) -> Range:
    """The query rows that see some key of [n0, n0 + block_n), and those that see all of
    them without a mask and are below n_q (:func:`flashscope.kernels.keyrange.query_range`
    on the device). The backward's dK/dV pass walks these for one key block."""
    shift = mask.offset(n_q, n_k)
    m_full = _floor(n_q, block_m)
    if mask.right_bounded:
        r = mask.right
        lo = min(_floor(max(n0 - shift - r, 0), block_m), n_q)
        full_lo = _cdiv(max(n0 + block_n - 1 - shift - r, 0), block_m)
        full_lo = max(min(full_lo * block_m, m_full), lo)
    else:
        lo = full_lo = 0
    if mask.left_bounded:
        hi = max(min(n_q, n0 + block_n - shift + mask.left), 0)
        full_hi = min(_floor(max(n0 - shift + mask.left + 1, 0), block_m), m_full)
        lo = min(lo, hi)
        full_lo = min(max(full_lo, lo), hi)
        full_hi = min(max(full_hi, full_lo), hi)
    else:
        hi = n_q
        full_hi = max(m_full, full_lo)
    return Range(lo, full_lo, full_hi, hi)


def visible_pairs(mask: Mask, n_q: int, n_k: int) -> int:
    """How many (query, key) pairs the mask keeps: the work a FLOP count should charge."""
    if n_q <= 0 or n_k <= 0:
        return 0
    off = mask.offset(n_q, n_k)
    total = 0
    left = mask.left if mask.left_bounded else None
    right = mask.right if mask.right_bounded else None
    if left is None and right is None:
        return n_q * n_k
    # sum over rows of |[max(0, p - left), min(n_k - 1, p + right)]|, in closed form per
    # stretch would be shorter; n_q is small enough to sum (this is host bookkeeping)
    for i in range(n_q):
        p = i + off
        a = 0 if left is None else max(0, p - left)
        b = n_k - 1 if right is None else min(n_k - 1, p + right)
        total += max(0, b - a + 1)
    return total


def tile_count(r: Range, block: int) -> int:
    return 0 if r.empty else math.ceil((r.hi - r.lo) / block)
