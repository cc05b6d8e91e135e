"""Benchmark cases: the standard shape suite, user shapes, and the small odd shapes every
provider must also get right before any of its timings counts.

A :class:`Case` is one problem: q (B, H, Nq, D), k/v (B, Hkv, Nk, D), a mask, a dtype and a
mode (``fwd``, ``bwd`` = the backward alone, ``fwd+bwd``). The standard suite is the
FlashAttention papers' one: B*N = 16384 tokens and H*D = 2048 model width, so every N does
the same GEMM work per token and TFLOP/s are comparable across N. Named suites are data
(``flashscope/data/suites/<name>.json``, a table of rows with the model each comes from):
``models`` holds the attention shapes of real models, from a ViT's 197 tokens to a
128k-token context, head dims 64 to 256, GQA and MHA; ``decode`` decoding steps against
a KV cache (:mod:`flashscope.bench.decode`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

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

    @property
    def gqa(self) -> bool:
        return self.Hkv != self.H

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
                f"{'bf16' if self.dtype == 'bfloat16' else 'fp16'} {self.mode}")

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
SUITE_NAMES = ("standard", "models", "decode")
_COLUMNS = ["model", "B", "H", "Hkv", "Nq", "Nk", "D", "causal"]


def table_suite(name: str, *, dtypes: Iterable[str] = ("bfloat16",), modes=("fwd",),
                path=None, case: type = Case) -> list:
    """The cases of a suite held as a table (``data/suites/<name>.json``), each row in every
    dtype and mode given, as ``case`` records; FlashscopeError naming the file and row
    when it is malformed."""
    p = Path(path) if path else SUITES_DIR / f"{name}.json"
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise FlashscopeError(f"--suite {name}: cannot read {p} ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:
        raise FlashscopeError(f"--suite {name}: {p} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("columns") != _COLUMNS or \
            not isinstance(data.get("rows"), list):
        raise FlashscopeError(f"--suite {name}: {p}: expected columns {_COLUMNS} and rows")
    out = []
    for i, row in enumerate(data["rows"]):
        ok = (isinstance(row, list) and len(row) == len(_COLUMNS) and isinstance(row[0], str)
              and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                      for v in row[1:7]) and isinstance(row[7], bool) and row[2] % row[3] == 0)
        if not ok:
            raise FlashscopeError(f"--suite {name}: {p}: rows[{i}] {row!r} is not "
                                  f"[model, B, H, Hkv, Nq, Nk, D, causal] with Hkv | H")
        model, B, H, Hkv, Nq, Nk, D, causal = row
        for mode in modes:
            for dtype in dtypes:
                out.append(case(B, H, Nq, Nk, D, Hkv, causal, dtype, mode, name=model))
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


def odd_cases(case: Case, *, gqa: bool = True) -> list:
    """Small shapes a provider must pass alongside ``case`` (same dtype, D, mask, mode):
    a length that is no tile multiple, Nq != Nk both ways, and GQA when supported."""
    base = dict(D=case.D, causal=case.causal, dtype=case.dtype, mode=case.mode)
    out = [Case(2, 3, 127, 127, Hkv=3, **base),
           Case(1, 2, 65, 190, Hkv=2, **base),
           Case(1, 2, 190, 65, Hkv=2, **base)]
    if gqa:
        out.append(Case(1, 4, 129, 97, Hkv=2, **base))
    return out


def validation_key(case: Case) -> tuple:
    """Cases sharing this key share one set of odd-shape validations."""
    return (case.D, case.causal, case.dtype, case.mode, case.gqa)
