"""Decoding benchmarks (``flashscope bench --suite decode``): one decoding step against a
KV cache, validated then timed, with the bandwidth each provider reaches next to a copy of
the same bytes timed in the same run.

A :class:`DecodeCase` is a :class:`~flashscope.bench.suite.Case` read as a decoding step:
Nq new query tokens for each of B sequences, each sequence's cache full with Nk keys (so
dense peers, which take no lengths, compute the same thing), the queries at the cache's
end, causal (bottom-right: query i sees keys up to Nk - Nq + i).

Providers (:data:`DECODE`, registered like the attention ones), each a ``build(case,
options) -> prepare(inputs) -> (step, against)``: ``copy``, a device-to-device copy of
the cache's K and V bytes into one K-sized buffer (the bandwidth the others are measured
against); ``flashscope`` on the dense cache and ``flashscope-paged`` on the same bytes
seen as pages of :data:`PAGE_SIZE` keys handed out in random order by a block table;
``fa2`` (``flash_attn_with_kvcache``) and, where that package is missing, ``sdpa-flash``
(PyTorch SDPA's FlashAttention-2 backend, whose causal mask is aligned top-left: one
query, or none); ``sdpa-cudnn`` (SDPA's cuDNN backend, the causal mask of more than one
query given as a boolean mask); ``fa4`` (``flash_attn.cute.flash_attn_func``, causal
aligned bottom-right). ``against`` names the reference a step's output is checked
against: the dense or the paged cache's, or the copy's source.

Inputs are made once per case and shared by its providers (the largest cases hold 32 GiB
of K and V): fresh unit-normal values from an OS seed, made in the cache's dtype. Each
provider is validated as :mod:`flashscope.bench.validate` does for attention: every
allocation NaN until written, the output finite, not all zeros and within the dtype's
bound of the float64 (float32 past :data:`FLOAT64_WORK`) reference, the inputs unchanged
(their bit patterns' sums compared, since a 32 GiB copy would not fit), then a second call
on new queries (a failure whose output equals the first call's is a stale result), and
the last timed call's output checked too.

Metrics: GB/s = the cache's K and V bytes (2 B Nk Hkv D e) over the time; for ``copy``,
the bytes read and written (twice that) over its time, the copy bandwidth. % copy = a
provider's GB/s over the copy bandwidth of the same case in the same run.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import FlashscopeError
from ..roofline import attention_flops
from .harness import Result, _Runner
from .providers import (Provider, _flashscope_available, _importable, _max_head_dim,
                        _needs_nvidia, provider)
from .suite import Case, table_suite, validation_key
from .validate import (TORCH_DTYPES, ValidationFailure, check_result, poisoned_allocations)

#: keys a page of the paged provider's cache (vLLM's default: the smallest pages, the most
#: block-table reads)
PAGE_SIZE = 16
#: largest B H Nq Nk D whose reference runs in float64 (beyond it float32)
FLOAT64_WORK = 1 << 32
COPY = "copy"
#: the table columns a decoding run shows unless --metrics says otherwise
METRICS = ("latency", "bandwidth", "copy", "speedup", "host", "memory", "error")


@dataclass(frozen=True)
class DecodeCase(Case):
    """A decoding step: Nq query tokens per sequence against Nk cached keys each."""

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V in the cache: what a decoding step must read."""
        return 2 * self.B * self.Nk * self.Hkv * self.D * TORCH_DTYPES[self.dtype].itemsize

    @property
    def label(self) -> str:
        return ((f"{self.name}: " if self.name else "")
                + f"decode B={self.B} Nq={self.Nq} H={self.H}/{self.Hkv} Nk={self.Nk} "
                f"D={self.D} {'bf16' if self.dtype == 'bfloat16' else 'fp16'}")


def suite_cases(*, dtypes=("bfloat16",), head_dims=None, lengths=None, path=None) -> list:
    """The decode suite (``data/suites/decode.json``), in every dtype given, the rows of
    ``head_dims`` and of cache lengths Nk in ``lengths`` only when given."""
    cases = table_suite("decode", dtypes=dtypes, path=path, case=DecodeCase)
    return [c for c in cases if (head_dims is None or c.D in head_dims)
            and (lengths is None or c.Nk in lengths)]


def odd_cases(case: Case) -> list:
    """Small decoding steps a provider must pass alongside ``case`` (same D, dtype, mask):
    a cache length that is no tile multiple under a group of 4, and a group of 3 with 3
    query tokens."""
    base = dict(D=case.D, causal=case.causal, dtype=case.dtype)
    return [DecodeCase(3, 8, case.Nq, 1008, Hkv=2, **base),
            DecodeCase(2, 6, 3, 208, Hkv=2, **base)]


class DecodeInputs:
    """One case's tensors, shared by its providers: q (B, Nq, H, D), the dense cache (B,
    Nk, Hkv, D) full (``seqlens`` = Nk), the same storage as pages of :data:`PAGE_SIZE`
    keys with a shuffled block table, and the references of the current queries."""

    def __init__(self, case: DecodeCase, device):
        if case.Nk % PAGE_SIZE:
            raise FlashscopeError(f"decode case {case.label}: Nk = {case.Nk} is not a "
                                  f"multiple of the {PAGE_SIZE}-key pages")
        self.case, self.device = case, torch.device(device)
        self.seed = secrets.randbits(62)
        self.gen = torch.Generator(device=self.device).manual_seed(self.seed)
        dt = TORCH_DTYPES[case.dtype]
        B, Nk, Hkv, D = case.B, case.Nk, case.Hkv, case.D
        self.q = self._randn(B, case.Nq, case.H, D)
        self.k_cache, self.v_cache = (self._randn(B, Nk, Hkv, D) for _ in range(2))
        self.seqlens = torch.full((B,), Nk, dtype=torch.int32, device=self.device)
        per_seq = Nk // PAGE_SIZE
        order = torch.randperm(B * per_seq, generator=self.gen, device=self.device)
        self.table = order.to(torch.int32).view(B, per_seq)
        self.pages = tuple(c.view(-1, PAGE_SIZE, Hkv, D) for c in (self.k_cache, self.v_cache))
        self.dtype = dt
        self._refs = {}

    def _randn(self, *shape):
        return torch.randn(shape, generator=self.gen, device=self.device,
                           dtype=TORCH_DTYPES[self.case.dtype])

    def new_queries(self) -> None:
        """Fresh queries in place (the steps read ``self.q``); their references anew."""
        self.q.copy_(self._randn(*self.q.shape))
        self._refs.clear()

    def reference(self, against: str):
        """The output a step checked ``against`` must give for the current queries."""
        if against == COPY:
            return self.v_cache
        if against not in self._refs:
            from ..testing.reference import reference_kvcache

            c = self.case
            work = c.B * c.H * c.Nq * c.Nk * c.D
            caches = self.pages if against == "paged" else (self.k_cache, self.v_cache)
            out, _ = reference_kvcache(
                self.q, *caches, self.seqlens, is_causal=c.causal,
                block_table=self.table if against == "paged" else None,
                compute_dtype=torch.float64 if work <= FLOAT64_WORK else torch.float32)
            self._refs[against] = out
        return self._refs[against]

    def checksums(self) -> tuple:
        """Sums of every input's bit patterns (exact integer sums): what a step must leave
        as it found it."""
        out = []
        for t in (self.q, self.k_cache, self.v_cache, self.seqlens, self.table):
            bits = t.view(torch.int16) if t.element_size() == 2 else t
            out.append(int(bits.sum(dtype=torch.int64)))
        return tuple(out)


def check_output(got, want, case: DecodeCase, against: str) -> float:
    """Raise :class:`ValidationFailure` naming the fault; return the relative error."""
    if against == COPY:
        if not (isinstance(got, torch.Tensor) and torch.equal(got, want)):
            raise ValidationFailure("copy: the destination differs from its source")
        return 0.0
    return check_result((got,), (want,), case, _SAME_LAYOUT)


class _SameLayout:
    """What :func:`~flashscope.bench.validate.check_result` asks of inputs: the output is
    in the reference's layout already."""

    @staticmethod
    def bhnd(t):
        return t


_SAME_LAYOUT = _SameLayout()


class DecodeRunner(_Runner):
    """The harness's runner for decoding steps (:func:`flashscope.bench.harness.run_bench`
    with ``runner=DecodeRunner``): shared inputs per case, the decoding checks, and GB/s
    against the copy of the same case."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.inputs: Optional[DecodeInputs] = None
        self.copy_gbps = {}

    def _inputs(self, case: DecodeCase) -> DecodeInputs:
        if self.inputs is None or self.inputs.case != case:
            self.inputs = None  # the previous case's tensors go first
            if self.device.type == "cuda":
                self.torch.cuda.empty_cache()
            self.inputs = DecodeInputs(case, self.device)
        return self.inputs

    def _validate(self, p: Provider, case: DecodeCase, inp: Optional[DecodeInputs] = None):
        """(inputs and what the output is checked against, reference, step, worst error)
        of ``p`` on ``case``: two checked calls (module docstring)."""
        inp = inp or self._inputs(case)
        step, against = p.build(case, self.options)(inp)
        err = 0.0
        first = None
        for call in ("first call", "second call on new queries"):
            if first is not None:
                inp.new_queries()
            before = inp.checksums()
            with poisoned_allocations(case, self.device):
                result = step()
            if inp.checksums() != before:
                if inp is self.inputs:  # the next provider gets fresh ones
                    self.inputs = None
                raise ValidationFailure("modified its inputs")
            try:
                err = max(err, check_output(result, inp.reference(against), case, against))
            except ValidationFailure as e:
                if first is not None and against != COPY and torch.equal(result, first):
                    raise ValidationFailure("stale result: the output on new queries equals "
                                            "the previous call's") from None
                raise ValidationFailure(f"{e} ({call}, seed {inp.seed})") from None
            first = result.clone()
        return (inp, against), inp.reference(against), step, err

    def _check_timed(self, result, ref, case, inp) -> float:
        """The last timed call against the current queries' reference (the providers of a
        case share the inputs, and each one's second call renews the queries)."""
        inputs, against = inp
        try:
            return check_output(result, inputs.reference(against), case, against)
        except ValidationFailure as e:
            raise ValidationFailure(f"last timed call: {e} (less work done while "
                                    "timed?)") from None

    def _odd(self, p: Provider, case: DecodeCase) -> tuple:
        key = (p.name, validation_key(case))
        if key not in self.odd_verdict:
            verdict, shapes = None, []
            for odd in odd_cases(case):
                if p.supports(odd):
                    continue
                try:
                    self._validate(p, odd, DecodeInputs(odd, self.device))
                    shapes.append(odd.label)
                except ValidationFailure as e:
                    verdict = f"validation at {odd.label}: {e}"
                    break
                except Exception as e:  # a provider's own error
                    verdict = f"error at {odd.label}: {type(e).__name__}: {str(e)[:160]}"
                    break
            self.odd_verdict[key] = (verdict, shapes)
        return self.odd_verdict[key]

    def _rate(self, res: Result) -> Result:
        c, seconds = res.case, res.ms * 1e-3
        if res.provider == COPY:
            res.gbps = 2 * c.kv_bytes / seconds / 1e9
            self.copy_gbps[c] = res.gbps
        else:
            res.tflops = attention_flops(c.B, c.H, c.Nq, c.Nk, c.D) / seconds / 1e12
            res.gbps = c.kv_bytes / seconds / 1e9
        copy = self.copy_gbps.get(c)
        res.pct_copy = 100 * res.gbps / copy if copy else None
        return res


# -- providers -------------------------------------------------------------------------

#: decoding providers by name, in the order they run (the copy first: the others' % copy
#: reads its bandwidth)
DECODE: dict = {}


def _any_device(device):
    return None


@provider(COPY, description="device-to-device copy of the cache's K and V bytes (the "
                            "bandwidth baseline)", layout="bnhd", baseline=False,
          available=_any_device, has_backward=False, registry=DECODE)
def _copy(case, options):
    def prepare(inp: DecodeInputs):
        dst = torch.empty_like(inp.k_cache)

        def step():
            dst.copy_(inp.k_cache)
            return dst.copy_(inp.v_cache)
        return step, COPY
    return prepare


def _flashscope(paged: bool):
    def build(case, options):
        import flashscope

        cfg = options.get("config")
        if isinstance(cfg, str):
            cfg = decode_config(cfg, case, options.get("device"))

        def prepare(inp: DecodeInputs):
            caches = inp.pages if paged else (inp.k_cache, inp.v_cache)
            table = inp.table if paged else None

            def step():
                return flashscope.attention_with_kvcache(
                    inp.q, *caches, cache_seqlens=inp.seqlens, block_table=table,
                    is_causal=case.causal, config=cfg)
            return step, "paged" if paged else "dense"
        return prepare
    return build


def decode_config(text: str, case: DecodeCase, device=None):
    """``--config`` text on top of the decoding family's default for ``case``, or, as
    ``sm90-fwd:KEY=VALUE,...``, on top of the sm_90 forward's config for its packed rows
    (:func:`flashscope.kvcache.forward_config`: the route the call then takes)."""
    from ..api import device_target
    from ..families import Problem, config_from_text
    from ..families.sm90_fwd import KERNEL as FORWARD
    from ..kvcache import forward_config

    target = device_target(torch.device(device or "cuda"))
    problem = Problem(target or "sm90", case.dtype, case.D, case.causal, case.Nq, case.Nk,
                      case.B * case.H, group=case.H // case.Hkv)
    forward = str(text).partition(":")[0] == FORWARD
    return config_from_text(text, problem, "triton-decode",
                            base=forward_config(problem) if forward else None)


provider("flashscope", description="flashscope.attention_with_kvcache, dense cache "
                                   "(default config, or --config)",
         layout="bnhd", baseline=False, available=_flashscope_available,
         supports=_max_head_dim(256), has_backward=False, registry=DECODE)(_flashscope(False))
provider("flashscope-paged", description=f"flashscope.attention_with_kvcache, the same "
                                         f"cache as {PAGE_SIZE}-key pages in random order",
         layout="bnhd", baseline=False, available=_flashscope_available,
         supports=_max_head_dim(256), has_backward=False, registry=DECODE)(_flashscope(True))


@provider("fa2", description="flash-attn 2 package, flash_attn_with_kvcache on the dense "
                             "cache", layout="bnhd", supports=_max_head_dim(256),
          available=_importable("flash_attn", "flash_attn_with_kvcache", _needs_nvidia(80)),
          has_backward=False, registry=DECODE)
def _fa2(case, options):
    from flash_attn import flash_attn_with_kvcache

    def prepare(inp: DecodeInputs):
        return (lambda: flash_attn_with_kvcache(inp.q, inp.k_cache, inp.v_cache,
                                                cache_seqlens=inp.seqlens,
                                                causal=case.causal)), "dense"
    return prepare


def _top_left_only(case) -> Optional[str]:
    """SDPA's FlashAttention-2 backend aligns a causal mask top-left and has no kernel for
    a causal Nq != Nk: one query (which sees every key) or no causal mask only."""
    if case.causal and case.Nq > 1:
        return "causal with Nq > 1 (its causal mask is aligned top-left)"
    return None


def _sdpa(backend_name: str):
    def build(case, options):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def prepare(inp: DecodeInputs):
            q, k, v = (t.transpose(1, 2) for t in (inp.q, inp.k_cache, inp.v_cache))
            mask = None
            if case.causal and case.Nq > 1:  # bottom-right: query i sees keys <= Nk - Nq + i
                rows = torch.arange(case.Nq, device=inp.device)[:, None]
                mask = torch.arange(case.Nk, device=inp.device)[None, :] <= \
                    rows + case.Nk - case.Nq

            def step():
                with sdpa_kernel(backend):
                    return sdpa(q, k, v, attn_mask=mask, enable_gqa=case.gqa).transpose(1, 2)
            return step, "dense"
        return prepare
    return build


provider("sdpa-flash", description="PyTorch SDPA, FlashAttention-2 backend forced, on the "
                                   "dense cache (one query)",
         layout="bnhd", available=_needs_nvidia(80),
         supports=lambda c: _max_head_dim(256)(c) or _top_left_only(c),
         has_backward=False, registry=DECODE)(_sdpa("FLASH_ATTENTION"))
provider("sdpa-cudnn", description="PyTorch SDPA, cuDNN backend forced, on the dense cache "
                                   "(a boolean mask for more than one causal query)",
         layout="bnhd", available=_needs_nvidia(80), supports=_max_head_dim(256),
         has_backward=False, registry=DECODE)(_sdpa("CUDNN_ATTENTION"))


@provider("fa4", description="FlashAttention-4 (flash_attn.cute.flash_attn_func) on the "
                             "dense cache", layout="bnhd",
          available=_importable("flash_attn.cute", "flash_attn_func", _needs_nvidia(90)),
          has_backward=False, registry=DECODE)
def _fa4(case, options):
    from flash_attn.cute import flash_attn_func

    def prepare(inp: DecodeInputs):
        def step():
            out = flash_attn_func(inp.q, inp.k_cache, inp.v_cache, causal=case.causal)
            return out[0] if isinstance(out, tuple) else out
        return step, "dense"
    return prepare
