"""Validation a provider must pass before any of its timings counts.

For one case the harness builds a *step*: the exact callable it later times (forward; the
backward alone through ``torch.autograd.grad`` on a recorded graph; or both). A step is
validated by :func:`check_step`:

1. fresh random inputs (seed from the OS, recorded in the reason for replay);
2. every allocation made during the call is poisoned with NaN: PyTorch's deterministic mode
   fills each ``torch.empty`` with NaN (CPU and GPU; ``warn_only`` so nothing refuses to
   run), and on a GPU a NaN block the size of each expected output is freed into the
   caching allocator first, so an output that reuses it is NaN where it is not written;
3. the output must be finite everywhere (an unwritten element stays NaN), not all zeros,
   of the right shape and dtype, and within the dtype's relative-error bound of the
   reference (:mod:`flashscope.testing.reference`; float64, or float32 when
   B H Nq Nk D exceeds :data:`FLOAT64_WORK`; a forward beyond :data:`SAMPLE_WORK`, such
   as 128k tokens, against the reference of sampled row blocks, :class:`RowSample`, a
   backward against that of sampled (batch, kv head) pairs, :class:`GroupSample`);
4. the inputs must be bit-identical to saved copies afterwards;
5. after the reference has run, the step runs again on NEW inputs and is checked again; a
   failure there whose output equals the first call's is reported as a stale (cached)
   result.

The harness runs this on the benchmark shape and on small odd shapes
(:func:`flashscope.bench.suite.odd_cases`), then times the same step and checks the output
of the last timed call too, so a provider cannot do less work once it is being timed.
Windows, alignments and logit caps are the reference's own (written from their
definitions); a packed case's inputs are (total, H, D) in every provider's hands and
its reference is computed sequence by sequence.
Gradients are bounded by :data:`GRAD_BOUND`: twice the forward bound (a flash-style
emulation gave bf16 dq/dk/dv errors up to 7.7e-3 and fp16 up to 7.8e-4 for N <= 1024).
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Optional

import torch

from ..testing.inputs import nan_allocations
from ..testing.reference import (ERROR_BOUND, reference_attention, reference_attention_grads,
                                 rel_error)
from .suite import Case

TORCH_DTYPES = MappingProxyType({"bfloat16": torch.bfloat16, "float16": torch.float16})
GRAD_BOUND = MappingProxyType({dt: 2 * b for dt, b in ERROR_BOUND.items()})

#: Largest B*H*Nq*Nk*D computed in float64 (beyond it float32, still far below the bounds).
FLOAT64_WORK = MappingProxyType({"cpu": 1 << 30, "cuda": 1 << 36})
#: A forward case with more B*H*Nq*Nk*D than this is checked against the reference of
#: :data:`SAMPLE_BLOCKS` blocks of :data:`SAMPLE_ROWS` query rows spread over its length
#: (first and last rows included, starts on no tile boundary), every output element still
#: checked finite. Llama-3-8B at 128k tokens: with whole float32 references (two input
#: sets per provider) it had not finished validating four providers after 250 s on an
#: H100; the sample is 1/32 of that work.
SAMPLE_WORK = 1 << 43
SAMPLE_BLOCKS, SAMPLE_ROWS = 8, 512
#: A backward case (``bwd``, ``fwd+bwd``) over :data:`SAMPLE_WORK` is checked against the
#: reference of some (batch, kv head) pairs, each with its group's query heads
#: (:class:`GroupSample`), as many as keep the reference's work under SAMPLE_WORK; every
#: element is still checked finite. A backward cannot be sampled by query rows as a
#: forward is: dK and dV of one key row take every query row. With whole references
#: ``bench --suite models --mode bwd`` ran its first three rows (Llama-3-8B at 2k, 8k and
#: 32k) for three providers and had not finished the 128k row when its 270 s ran out
#: (H200, 2026-11-29): a whole reference there is 16 times the 32k row's, two a provider.


@dataclass(frozen=True)
class RowSample:
    """A reference of some query rows of a (B, H, Nq, D) output: ``rows`` (indices into
    Nq, in order) and their values (B, H, len(rows), D)."""

    rows: torch.Tensor
    values: torch.Tensor
    shape: tuple  #: the whole output's shape

    def pick(self, got: torch.Tensor) -> torch.Tensor:
        return got.index_select(2, self.rows.to(got.device))


@dataclass(frozen=True)
class GroupSample:
    """A reference of some (batch, kv head) pairs of a (B, H, N, D) output: ``pairs`` ((b,
    kv head), in order), ``heads`` heads of the tensor a pair holds (the GQA group for a
    tensor shaped like q, 1 for one shaped like k), and their values (len(pairs) * heads,
    N, D), pair by pair."""

    pairs: tuple
    heads: int
    values: torch.Tensor
    shape: tuple  #: the whole output's shape

    def pick(self, got: torch.Tensor) -> torch.Tensor:
        h = self.heads
        return torch.cat([got[b, kv * h:(kv + 1) * h] for b, kv in self.pairs])


def sample_pairs(batch: int, kv_heads: int, keep: int) -> tuple:
    """``keep`` of the batch's (b, kv head) pairs spread evenly over them in order, the
    last pair always among them and the first too where two or more are kept."""
    total = batch * kv_heads
    keep = max(1, min(total, keep))
    if keep == 1:
        picks = [total - 1]
    else:
        picks = sorted({round(i * (total - 1) / (keep - 1)) for i in range(keep)})
    return tuple(divmod(i, kv_heads) for i in picks)


def sample_starts(n: int) -> list:
    """First rows of :data:`SAMPLE_BLOCKS` blocks of :data:`SAMPLE_ROWS` rows spread evenly
    over n rows, the first at row 0 and the last ending at row n ([0] where n is short)."""
    blocks, size = SAMPLE_BLOCKS, SAMPLE_ROWS
    if n <= blocks * size:
        return [0]
    return sorted({round(i * (n - size) / (blocks - 1)) for i in range(blocks)})

OUTPUT_NAMES = ("out", "dq", "dk", "dv")


class ValidationFailure(Exception):
    """A provider's result that must not be timed; the message names the fault."""


@dataclass
class Inputs:
    """q, k, v (and dout for backward modes) in the provider's layout, and the seed."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: Optional[torch.Tensor]
    seed: int
    layout: str

    def bhnd(self, t: torch.Tensor) -> torch.Tensor:
        """A (B, H, N, D) view of ``t``; a packed (total, H, D) tensor stays as it is."""
        return t.transpose(1, 2) if self.layout == "bnhd" else t

    @property
    def tensors(self) -> dict:
        d = {"q": self.q, "k": self.k, "v": self.v}
        if self.dout is not None:
            d["dout"] = self.dout
        return d


#: the layout of a packed case's tensors, whatever the provider's: (total, H, D)
PACKED = "thd"


def make_inputs(case: Case, layout: str, device) -> Inputs:
    """Unit-normal q, k, v (and dout) from a fresh OS seed, stored in ``layout`` (a packed
    case: (total, H, D))."""
    seed = secrets.randbits(62)
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]
    if case.varlen:
        layout = PACKED

    def one(h, n):
        if layout == PACKED:
            shape = (sum(case.seqlens), h, case.D)
        else:
            shape = (case.B, n, h, case.D) if layout == "bnhd" else (case.B, h, n, case.D)
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    q, k, v = one(case.H, case.Nq), one(case.Hkv, case.Nk), one(case.Hkv, case.Nk)
    dout = one(case.H, case.Nq) if case.mode != "fwd" else None
    if dout is not None:
        for t in (q, k, v):
            t.requires_grad_(True)
    return Inputs(q, k, v, dout, seed, layout)


def make_step(fn: Callable, case: Case, inp: Inputs) -> Callable:
    """The timed callable. Returns (out, dq, dk, dv) in the provider layout, grads None for
    ``fwd``. For ``bwd`` the forward runs once here and each call is one backward."""
    q, k, v, dout = inp.q, inp.k, inp.v, inp.dout
    if case.mode == "fwd":
        return lambda: (fn(q, k, v), None, None, None)
    if case.mode == "fwd+bwd":
        def fwd_bwd():
            out = fn(q, k, v)
            return (out, *torch.autograd.grad(out, (q, k, v), dout, allow_unused=True))
        return fwd_bwd
    out = fn(q, k, v)

    def bwd():
        return (out, *torch.autograd.grad(out, (q, k, v), dout, retain_graph=True,
                                          allow_unused=True))
    return bwd


def reference_for(case: Case, inp: Inputs) -> tuple:
    """(out, dq, dk, dv) of the reference in (B, H, N, D) (a packed case: (total, H, D)),
    grads None for ``fwd``."""
    work = case.H * case.D * sum(nq * nk for nq, nk in case.lengths)
    dev = inp.q.device.type
    cdt = torch.float64 if work <= FLOAT64_WORK.get(dev, FLOAT64_WORK["cuda"]) else torch.float32
    q, k, v = (inp.bhnd(t).detach() for t in (inp.q, inp.k, inp.v))
    dout = None if inp.dout is None else inp.bhnd(inp.dout)
    if case.varlen:
        return _packed_reference(case, q, k, v, dout, cdt)
    mask = dict(is_causal=case.causal, window=case.window, align=case.align,
                softcap=case.softcap, compute_dtype=cdt)
    with highest_fp32_precision():
        if case.mode == "fwd" and work > SAMPLE_WORK and case.Nq > SAMPLE_BLOCKS * SAMPLE_ROWS:
            return _sampled_reference(q, k, v, mask), None, None, None
        if case.mode == "fwd":
            return reference_attention(q, k, v, **mask), None, None, None
        pairs = case.B * case.Hkv
        if work > SAMPLE_WORK and pairs > 1:
            return _grouped_reference(q, k, v, dout, mask, -(-pairs * SAMPLE_WORK // work))
        return reference_attention_grads(q, k, v, dout, **mask)


def _sampled_reference(q, k, v, mask: dict) -> RowSample:
    """:func:`reference_for` of a forward case over :data:`SAMPLE_WORK`: the reference of
    :func:`sample_starts`' row blocks."""
    parts, rows = [], []
    for a in sample_starts(q.shape[2]):
        parts.append(reference_attention(q, k, v, row_range=(a, a + SAMPLE_ROWS), **mask))
        rows.append(torch.arange(a, a + SAMPLE_ROWS))
    return RowSample(torch.cat(rows), torch.cat(parts, dim=2), tuple(q.shape))


def _grouped_reference(q, k, v, dout, mask: dict, keep: int) -> tuple:
    """:func:`reference_for` of a backward case over :data:`SAMPLE_WORK`: (out, dq, dk, dv)
    of ``keep`` (batch, kv head) pairs (:func:`sample_pairs`) as :class:`GroupSample`."""
    group = q.shape[1] // k.shape[1]
    pairs = sample_pairs(q.shape[0], k.shape[1], keep)
    parts = ([], [], [], [])
    for b, kv in pairs:
        heads = slice(kv * group, (kv + 1) * group)
        one = reference_attention_grads(q[b:b + 1, heads], k[b:b + 1, kv:kv + 1],
                                        v[b:b + 1, kv:kv + 1], dout[b:b + 1, heads], **mask)
        for whole, part in zip(parts, one):
            whole.append(part[0])
    return tuple(GroupSample(pairs, h, torch.cat(p), tuple(t.shape))
                 for p, h, t in zip(parts, (group, group, 1, 1), (q, q, k, v)))


def _packed_reference(case: Case, q, k, v, dout, cdt) -> tuple:
    """:func:`reference_for` of a packed case: each sequence (rows cu[b] .. cu[b + 1] of
    the (total, H, D) tensors) on its own."""
    mask = dict(is_causal=case.causal, window=case.window, align=case.align,
                softcap=case.softcap, compute_dtype=cdt)
    outs = [torch.empty(t.shape, dtype=cdt, device=t.device) for t in (q, q, k, v)]
    start = 0
    with highest_fp32_precision():
        for n in case.seqlens:
            rows = slice(start, start + n)
            start += n
            seq = [t[rows].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
            if dout is None:
                parts = (reference_attention(*seq, **mask),)
            else:
                parts = reference_attention_grads(
                    *seq, dout[rows].transpose(0, 1).unsqueeze(0), **mask)
            for whole, part in zip(outs, parts):
                whole[rows] = part[0].transpose(0, 1)
    if dout is None:
        return outs[0], None, None, None
    return tuple(outs)


@contextlib.contextmanager
def highest_fp32_precision():
    """float32 matmuls without TF32 (the reference must not round to 10-bit mantissas)."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


@contextlib.contextmanager
def poisoned_allocations(case: Case, device):
    """Every tensor allocated inside is NaN until written (see the module docstring)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        dtype = TORCH_DTYPES[case.dtype]
        rows = sum(nq for nq, _ in case.lengths)
        keys = sum(nk for _, nk in case.lengths)
        sizes = [(rows, case.H, case.D)]
        if case.mode != "fwd":
            sizes += [(keys, case.Hkv, case.D)] * 2
        blocks = [torch.full(s, float("nan"), dtype=dtype, device=dev) for s in sizes]
        del blocks
    with nan_allocations():
        yield


def snapshot(inp: Inputs) -> dict:
    return {n: t.detach().clone() for n, t in inp.tensors.items()}


def check_inputs_unchanged(inp: Inputs, saved: dict) -> None:
    for name, t in inp.tensors.items():
        if not torch.equal(t.detach(), saved[name]):
            n = int((t.detach() != saved[name]).sum())
            raise ValidationFailure(f"modified its input {name} ({n} elements changed)")


def check_result(result: tuple, ref: tuple, case: Case, inp: Inputs) -> float:
    """Raise :class:`ValidationFailure` naming the first fault; return the worst error."""
    dtype = TORCH_DTYPES[case.dtype]
    worst = 0.0
    for name, got, want in zip(OUTPUT_NAMES, result, ref):
        if want is None:
            continue
        if not isinstance(got, torch.Tensor):
            raise ValidationFailure(f"{name}: returned {type(got).__name__}, not a tensor")
        got = inp.bhnd(got).detach()
        if tuple(got.shape) != tuple(want.shape):  # a RowSample holds the whole shape
            raise ValidationFailure(f"{name}: shape {tuple(got.shape)}, expected "
                                    f"{tuple(want.shape)}")
        if got.dtype != dtype:
            raise ValidationFailure(f"{name}: dtype {got.dtype}, expected {dtype}")
        bad = int((~torch.isfinite(got)).sum())
        if bad:
            raise ValidationFailure(f"{name}: {bad} of {got.numel()} elements NaN/inf "
                                    "(unwritten output or non-finite result)")
        if isinstance(want, (RowSample, GroupSample)):  # every element checked finite
            got, want = want.pick(got), want.values
        if got.numel() and not bool(got.any()) and bool(want.any()):
            raise ValidationFailure(f"{name}: all zeros")
        err = rel_error(got, want)
        bound = (ERROR_BOUND if name == "out" else GRAD_BOUND)[dtype]
        if not err <= bound:
            raise ValidationFailure(f"{name}: relative error {err:.2e} > bound {bound:.1e}")
        worst = max(worst, err)
    return worst


def run_checked(build_step: Callable, case: Case, inp: Inputs, device) -> tuple:
    """Build the step and call it once, both poisoned, then check the inputs; returns
    (step, result)."""
    saved = snapshot(inp)
    with poisoned_allocations(case, device):
        step = build_step(inp)
        result = step()
    check_inputs_unchanged(inp, saved)
    return step, result


def _same(a: tuple, b: tuple) -> bool:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return all(x.shape == y.shape and torch.equal(x.detach(), y.detach()) for x, y in pairs)


def check_step(build_step: Callable, case: Case, layout: str, device) -> tuple:
    """Validate on two fresh input sets (the second after the reference ran); returns the
    second set, its reference, its step and the worst error. ``build_step(inputs)`` gives
    the step for a set of inputs."""
    inp_a = make_inputs(case, layout, device)
    _, res_a = run_checked(build_step, case, inp_a, device)
    try:
        err_a = check_result(res_a, reference_for(case, inp_a), case, inp_a)
    except ValidationFailure as e:
        raise ValidationFailure(f"{e} (first call, seed {inp_a.seed})") from None
    res_a = tuple(None if t is None else t.detach().clone() for t in res_a)
    inp_b = make_inputs(case, layout, device)
    step_b, res_b = run_checked(build_step, case, inp_b, device)
    ref_b = reference_for(case, inp_b)
    try:
        err_b = check_result(res_b, ref_b, case, inp_b)
    except ValidationFailure as e:
        if _same(res_a, res_b):
            raise ValidationFailure("stale result: the output on new inputs "
                                    "equals the previous call's (cached or reused result)"
                                    ) from None
        raise ValidationFailure(f"{e} (second call on new inputs, seed "
                                f"{inp_b.seed})") from None
    return inp_b, ref_b, step_b, max(err_a, err_b)


def check_timed_result(result: tuple, ref: tuple, case: Case, inp: Inputs) -> float:
    """The output of the last timed call, against the reference of the timed inputs."""
    try:
        return check_result(result, ref, case, inp)
    except ValidationFailure as e:
        raise ValidationFailure(f"last timed call: {e} (less work done "
                                "while timed?)") from None
