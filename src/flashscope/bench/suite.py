"""Benchmark cases: the standard shape suite, user shapes, and the small odd shapes every
provider must also get right before any of its timings counts.

A :class:`Case` is one problem: q (B, H, Nq, D), k/v (B, Hkv, Nk, D), a mask, a dtype and a
mode (``fwd``, ``bwd`` = the backward alone, ``fwd+bwd``). The mask is causal or not, and
may add a sliding window, an alignment and a logit cap; a packed case (``seqlens``) holds
B sequences of those lengths one after another ((total, H, D) tensors, FlashAttention's
varlen layout), Nq = Nk its longest. The standard suite is the
FlashAttention papers' one: B*N = 16384 tokens and H*D = 2048 model width, so every N does
the same GEMM work per token and TFLOP/s are comparable across N. Named suites are data
(``flashscope/data/suites/<name>.json``, a table of rows with the model each comes from):
``models`` holds the attention shapes of real models, from a ViT's 197 tokens to a
128k-token context, head dims 64 to 256, GQA and MHA; ``varlen`` packed batches of 64k
tokens (mixed lengths 128-8192 drawn by :func:`draw_seqlens`, and equal lengths beside
their dense twins); ``windows`` sliding windows of 128-4096 keys on 8k-128k tokens and
logit caps (Mistral, Gemma 2); ``decode`` decoding steps against a KV cache
(:mod:`flashscope.bench.decode`).

FLOPs (:func:`case_flops`): the papers' 4 B H Nq Nk D, halved when causal, per sequence of
a packed case; with a window, 4 H D times the (query, key) pairs the mask keeps
(:func:`flashscope.masks.visible_pairs`), so a band is charged its own work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Optional

from ..errors import FlashscopeError

MODES = ("fwd", "bwd", "fwd+bwd")
DTYPES = ("bfloat16", "float16")
DTYPE_ALIASES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
                 "float16": "float16", "half": "float16"}

#: The standard suite's axes.
SUITE_TOKENS = 16384
SUITE_WIDTH = 2048
SUITE_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
SUITE_HEAD_DIMS = (64, 128, 256)


@dataclass(frozen=True)
class Case:
    B: int
    H: int
    Nq: int
    Nk: int
    D: int
    Hkv: int
    causal: bool
    dtype: str = "bfloat16"
    mode: str = "fwd"
    name: str = ""  #: the model a suite row comes from
    window: Optional[tuple] = None  #: (left, right) keys, None sides unbounded
    align: str = "top_left"
    softcap: Optional[float] = None
    seqlens: Optional[tuple] = None  #: a packed batch: its sequences' lengths (q and k)

    @property
    def gqa(self) -> bool:
        return self.Hkv != self.H

    @property
    def varlen(self) -> bool:
        return self.seqlens is not None

    def mask(self):
        """The case's :class:`~flashscope.masks.Mask`."""
        from ..masks import Mask

        return Mask.of(self.causal, self.window, self.align, self.softcap)

    @property
    def masked(self) -> bool:
        """Some row does not see some key (causal or a window bound)."""
        return not self.mask().plain

    @property
    def needs(self) -> frozenset:
        """What a provider must handle beyond a plain causal or full dense case:
        ``window``, ``softcap``, ``varlen``."""
        return frozenset(name for name, on in (("window", self.window is not None),
                                               ("softcap", self.softcap is not None),
                                               ("varlen", self.varlen)) if on)

    @property
    def lengths(self) -> tuple:
        """(Nq, Nk) of every sequence: the packed ones, else B times (Nq, Nk)."""
        if self.varlen:
            return tuple((n, n) for n in self.seqlens)
        return ((self.Nq, self.Nk),) * self.B

    @property
    def kind(self) -> str:
        """The mask's and layout's additions to ``causal``/``full``, as the label shows them
        ("" for a plain case)."""
        parts = []
        if self.window is not None:
            parts.append("window " + ",".join("-" if w is None else str(w)
                                              for w in self.window))
        if self.align != "top_left":
            parts.append(self.align.replace("_", "-"))
        if self.softcap is not None:
            parts.append(f"softcap {self.softcap:g}")
        if self.varlen:
            parts.append(f"varlen {len(self.seqlens)} seqs")
        return " ".join(parts)

    @property
    def shape(self) -> str:
        """``B,H,Nq,D[,Nk[,Hkv]]`` as ``--shape`` takes it."""
        s = f"{self.B},{self.H},{self.Nq},{self.D}"
        if self.Nk != self.Nq or self.gqa:
            s += f",{self.Nk}"
        if self.gqa:
            s += f",{self.Hkv}"
        return s

    @property
    def label(self) -> str:
        return ((f"{self.name}: " if self.name else "")
                + f"{self.shape} {'causal' if self.causal else 'full'} "
                + (f"{self.kind} " if self.kind else "")
                + f"{'bf16' if self.dtype == 'bfloat16' else 'fp16'} {self.mode}")

    def with_(self, **changes) -> "Case":
        return replace(self, **changes)


def standard_suite(*, dtypes: Iterable[str] = ("bfloat16",), head_dims=SUITE_HEAD_DIMS,
                   lengths=SUITE_LENGTHS, causal=(False, True), modes=("fwd",)) -> list:
    """B = 16384 / N, H = 2048 / D, every combination of the axes (mode outermost)."""
    out = []
    for mode in modes:
        for dtype in dtypes:
            for D in head_dims:
                for c in causal:
                    for N in lengths:
                        out.append(Case(SUITE_TOKENS // N, SUITE_WIDTH // D, N, N, D,
                                        SUITE_WIDTH // D, c, dtype, mode))
    return out


SUITES_DIR = Path(__file__).resolve().parent.parent / "data" / "suites"
#: suites by name: the standard one is built from its axes, the others are data files
SUITE_NAMES = ("standard", "models", "varlen", "windows", "decode")
_COLUMNS = ["model", "B", "H", "Hkv", "Nq", "Nk", "D", "causal"]
#: columns a table may add after :data:`_COLUMNS`, each null in a row that leaves it out:
#: name -> (what a value must be, the check)
_EXTRA_COLUMNS = {
    "window": ("[left, right] of integers >= 0 or null",
               lambda v: isinstance(v, list) and len(v) == 2 and all(
                   w is None or (_is_int(w) and w >= 0) for w in v)),
    "align": ("top_left or bottom_right", lambda v: v in ("top_left", "bottom_right")),
    "softcap": ("a number > 0", lambda v: isinstance(v, (int, float))
                and not isinstance(v, bool) and 0 < v < float("inf")),
    "seqlens": ("B lengths >= 1, the longest Nq = Nk",
                lambda v: isinstance(v, list) and v and all(_is_int(n) and n > 0 for n in v)),
}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def draw_seqlens(seed: int, total: int, lo: int, hi: int) -> tuple:
    """Sequence lengths drawn log-uniformly in [lo, hi] from ``numpy.random.default_rng(
    seed)`` until they sum to ``total``; where a draw would leave less than ``lo`` to
    go, it takes the rest (or leaves exactly ``lo``), so every length stays in [lo, hi]
    (for ``total >= lo``). How the ``varlen`` suite's mixed batches were made."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out, left = [], total
    while left > 0:
        n = min(int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi)))))), left)
        if left - n < lo and left - n > 0:
            n = left if left <= hi else left - lo
        out.append(n)
        left -= n
    return tuple(out)


def _row_case(name: str, p, i: int, row: list, columns: list) -> dict:
    """The Case fields of one table row (FlashscopeError naming the file and row)."""
    ok = (isinstance(row, list) and len(row) == len(columns) and isinstance(row[0], str)
          and all(_is_int(v) and v > 0 for v in row[1:7]) and isinstance(row[7], bool)
          and row[2] % row[3] == 0)
    if not ok:
        raise FlashscopeError(f"--suite {name}: {p}: rows[{i}] {row!r} is not "
                              f"[model, B, H, Hkv, Nq, Nk, D, causal, ...] with Hkv | H")
    model, B, H, Hkv, Nq, Nk, D, causal = row[:8]
    fields = dict(B=B, H=H, Nq=Nq, Nk=Nk, D=D, Hkv=Hkv, causal=causal, name=model)
    for col, v in zip(columns[8:], row[8:]):
        if v is None:
            continue
        what, good = _EXTRA_COLUMNS[col]
        if not good(v):
            raise FlashscopeError(f"--suite {name}: {p}: rows[{i}] {col} {v!r}: expected "
                                  f"{what}")
        fields[col] = tuple(v) if isinstance(v, list) else v
    lens = fields.get("seqlens")
    if lens is not None and (len(lens) != B or max(lens) != Nq or Nq != Nk):
        raise FlashscopeError(f"--suite {name}: {p}: rows[{i}] seqlens: expected B = {B} "
                              f"lengths whose longest is Nq = Nk")
    return fields


def table_suite(name: str, *, dtypes: Iterable[str] = ("bfloat16",), modes=("fwd",),
                path=None, case: type = Case, head_dims=None) -> list:
    """The cases of a suite held as a table (``data/suites/<name>.json``), each row in every
    dtype and mode given, as ``case`` records; only the rows of ``head_dims`` when given
    (FlashscopeError when none is). FlashscopeError naming the file and row when it is
    malformed. Columns: :data:`_COLUMNS`, then any of :data:`_EXTRA_COLUMNS` (window,
    align, softcap, seqlens)."""
    p = Path(path) if path else SUITES_DIR / f"{name}.json"
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise FlashscopeError(f"--suite {name}: cannot read {p} ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:
        raise FlashscopeError(f"--suite {name}: {p} is not valid JSON ({e})") from None
    columns = data.get("columns") if isinstance(data, dict) else None
    if not isinstance(columns, list) or columns[:8] != _COLUMNS or \
            any(c not in _EXTRA_COLUMNS for c in columns[8:]) or \
            len(set(columns)) != len(columns) or not isinstance(data.get("rows"), list):
        raise FlashscopeError(f"--suite {name}: {p}: expected columns {_COLUMNS} (then any "
                              f"of {', '.join(_EXTRA_COLUMNS)}) and rows")
    out, dims = [], set()
    for i, row in enumerate(data["rows"]):
        fields = _row_case(name, p, i, row, columns)
        dims.add(fields["D"])
        if head_dims is not None and fields["D"] not in head_dims:
            continue
        for mode in modes:
            for dtype in dtypes:
                out.append(case(dtype=dtype, mode=mode, **fields))
    if not out and head_dims is not None:
        raise FlashscopeError(f"--head-dim {','.join(map(str, head_dims))}: the {name} suite "
                              f"has rows of head dims {', '.join(map(str, sorted(dims)))}")
    return out


def parse_shape(text: str) -> tuple:
    """``B,H,N,D[,Nk[,Hkv]]`` -> (B, H, Nq, D, Nk, Hkv)."""
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if len(vals) not in (4, 5, 6) or any(v <= 0 for v in vals):
        raise FlashscopeError(f"--shape {text!r}: expected B,H,N,D[,Nk[,Hkv]] as positive "
                              "integers, e.g. 4,16,4096,128 or 1,32,1000,128,4000,8")
    B, H, N, D = vals[:4]
    Nk = vals[4] if len(vals) > 4 else N
    Hkv = vals[5] if len(vals) > 5 else H
    if H % Hkv:
        raise FlashscopeError(f"--shape {text!r}: Hkv = {Hkv} must divide H = {H}")
    return B, H, N, D, Nk, Hkv


def user_cases(shapes: Iterable[str], *, dtypes, causal, modes) -> list:
    out = []
    for text in shapes:
        B, H, N, D, Nk, Hkv = parse_shape(text)
        for mode in modes:
            for dtype in dtypes:
                for c in causal:
                    out.append(Case(B, H, N, Nk, D, Hkv, c, dtype, mode))
    return out


def parse_dtype(text: str) -> str:
    """``bf16``/``fp16`` or the torch names (``bfloat16``, ``torch.float16``, ``half``)."""
    try:
        return DTYPE_ALIASES[text.strip().lower().removeprefix("torch.")]
    except KeyError:
        raise FlashscopeError(f"--dtype {text!r}: expected bf16 or fp16") from None


def parse_mode(text: str) -> str:
    if text not in MODES:
        raise FlashscopeError(f"--mode {text!r}: expected one of {', '.join(MODES)}")
    return text


#: the widest window side the odd shapes keep, so that their band has edges to mask
ODD_WINDOW = 24
#: the sequences of a packed case's odd shape: length 1, tile edges crossed, Nq = Nk each
ODD_SEQLENS = (1, 37, 129, 64)


def odd_cases(case: Case, *, gqa: bool = True) -> list:
    """Small shapes a provider must pass alongside ``case`` (same dtype, D, mask, mode):
    a length that is no tile multiple, Nq != Nk both ways, and GQA when supported; with a
    window its sides cut to :data:`ODD_WINDOW` keys; a packed case validates on a small
    packed batch (:data:`ODD_SEQLENS`) instead."""
    window = None if case.window is None else tuple(
        None if w is None else min(w, ODD_WINDOW) for w in case.window)
    base = dict(D=case.D, causal=case.causal, dtype=case.dtype, mode=case.mode,
                window=window, align=case.align, softcap=case.softcap)
    if case.varlen:
        n, lens = max(ODD_SEQLENS), ODD_SEQLENS
        out = [Case(len(lens), 3, n, n, Hkv=3, seqlens=lens, **base)]
        if gqa:
            out.append(Case(len(lens), 4, n, n, Hkv=2, seqlens=lens[::-1], **base))
        return out
    out = [Case(2, 3, 127, 127, Hkv=3, **base),
           Case(1, 2, 65, 190, Hkv=2, **base),
           Case(1, 2, 190, 65, Hkv=2, **base)]
    if gqa:
        out.append(Case(1, 4, 129, 97, Hkv=2, **base))
    return out


def validation_key(case: Case) -> tuple:
    """Cases sharing this key share one set of odd-shape validations."""
    return (case.D, case.causal, case.dtype, case.mode, case.gqa, case.window, case.align,
            case.softcap, case.varlen)


def case_flops(case: Case) -> float:
    """The FLOPs a case is charged (module docstring)."""
    from ..masks import visible_pairs
    from ..roofline import attention_flops

    if case.window is None:
        return sum(attention_flops(1, case.H, nq, nk, case.D, case.causal, case.mode)
                   for nq, nk in case.lengths)
    mask = case.mask()
    pairs = sum(visible_pairs(mask, nq, nk) for nq, nk in case.lengths)
    return attention_flops(1, case.H, pairs, 1, case.D, False, case.mode)


def case_min_bytes(case: Case) -> float:
    """The minimum DRAM bytes of a case (:func:`flashscope.roofline.attention_min_bytes`),
    over its total tokens."""
    from ..roofline import attention_min_bytes

    total_q = sum(nq for nq, _ in case.lengths)
    total_k = sum(nk for _, nk in case.lengths)
    return attention_min_bytes(1, case.H, total_q, total_k, case.D, case.Hkv, 2, case.mode)
