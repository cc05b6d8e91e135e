"""Packed variable-length batches (``flashscope.attention_varlen``) against a float64
reference computed sequence by sequence, forward and backward.

The batches hold an empty query sequence, a sequence without keys, length-1 sequences and
Nq != Nk within one sequence, in a packed axis whose sequences are not tile multiples, so
the programs past a sequence's end, the partial tiles and the per-sequence masks all
occur. Masks: causal and not, windows one- and two-sided, wider than any sequence and
zero-wide, softcap, both alignments; GQA, fp16 and bf16. Every output and gradient is
allocated NaN-poisoned and must be written in full; rows that see no key are zero with a
log-sum-exp of -inf. On a GPU: a random 64k-token batch, and the Hopper default path.
"""

import itertools

import pytest
import torch

import flashscope
from flashscope import TritonBwdConfig, TritonFwdConfig
from flashscope.testing.inputs import fresh_seed
from flashscope.testing.reference import (ERROR_BOUND, reference_attention_grads,
                                          rel_error)

from .test_forward import reference_lse

CFG = TritonFwdConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
BWD = TritonBwdConfig(BLOCK_M1=16, BLOCK_N1=16, BLOCK_M2=16, BLOCK_N2=16, num_stages=1,
                      PRE_BLOCK=16)

#: (query lengths, key lengths): an empty query sequence, one without keys, length 1,
#: Nq > Nk and Nq < Nk, lengths that cross tile edges
LENGTHS = ((5, 0, 33, 1, 20, 18), (7, 3, 21, 0, 20, 30))


@pytest.fixture
def poisoned():
    """Every torch.empty inside the test is NaN until written (PyTorch's deterministic
    mode), so an output or gradient element the kernels miss fails the test."""
    det = torch.utils.deterministic
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled(), det.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(was[0], warn_only=was[1])
    det.fill_uninitialized_memory = was[2]


def cu_seqlens(lengths, device) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32,
                        device=device)


def packed_batch(device, lq, lk, H, Hkv, D, dtype, grad=False, scale_inputs=1.0):
    dev = "cuda" if device == "cuda" else "cpu"

    def one(n, h):
        t = (torch.randn(n, h, D, device=dev) * scale_inputs).to(dtype)
        return t.requires_grad_() if grad else t

    return (one(sum(lq), H), one(sum(lk), Hkv), one(sum(lk), Hkv),
            cu_seqlens(lq, dev), cu_seqlens(lk, dev))


def per_sequence(x, cu, b):
    """Sequence b of a packed (total, H, D) tensor as (1, H, n, D)."""
    return x[int(cu[b]):int(cu[b + 1])].transpose(0, 1).unsqueeze(0)


def reference(q, k, v, cu_q, cu_k, dout=None, **mask):
    """(out, lse, dq, dk, dv) packed like the inputs, float64, sequence by sequence (the
    gradients of the loss <out, dout>, zero without ``dout``)."""
    f64 = dict(dtype=torch.float64, device=q.device)
    out, dq, dk, dv = (torch.zeros(t.shape, **f64) for t in (q, q, k, v))
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64)
    d = torch.zeros_like(q) if dout is None else dout
    for b in range(cu_q.shape[0] - 1):
        qs, ks, vs, ds = (per_sequence(t.detach(), c, b) for t, c in
                          ((q, cu_q), (k, cu_k), (v, cu_k), (d, cu_q)))
        if qs.shape[2] == 0 or ks.shape[2] == 0:
            continue  # no pair: zeros, and -inf for the rows of a sequence without keys
        parts = reference_attention_grads(qs, ks, vs, ds, **mask)
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(int(cu_k[b]), int(cu_k[b + 1]))
        for whole, part, sl in zip((out, dq, dk, dv), parts, (rows, rows, keys, keys)):
            whole[sl] = part[0].transpose(0, 1)
        lse[:, rows] = reference_lse(qs, ks, scale=qs.shape[-1] ** -0.5, **mask)[0].cpu()
    return out, lse, dq, dk, dv


def check(name, got, want, bound):
    assert not torch.isnan(got).any(), f"{name}: unwritten (NaN) elements"
    if want.abs().max() == 0:
        assert got.double().abs().max() == 0, name
    else:
        err = rel_error(got, want)
        assert err <= bound, f"{name}: relative error {err:.2e} > {bound:.0e}"


MASKS = [  # (is_causal, window, align, softcap)
    (False, None, "top_left", None),
    (True, None, "top_left", None),
    (True, None, "bottom_right", None),
    (False, (4, 2), "top_left", None),
    (False, (6, None), "bottom_right", None),
    (True, (500, 500), "top_left", None),
    (False, (0, 0), "bottom_right", None),
    (True, (5, None), "bottom_right", 3.0),
]


@pytest.mark.parametrize("causal,window,align,softcap", MASKS)
def test_forward_matches_float64_per_sequence(device, poisoned, causal, window, align,
                                              softcap):
    i = MASKS.index((causal, window, align, softcap))
    dtype = torch.bfloat16 if i % 3 == 2 else torch.float16
    seed = fresh_seed()
    q, k, v, cu_q, cu_k = packed_batch(device, *LENGTHS, H=2, Hkv=1 if i % 2 else 2,
                                       D=24 if i % 2 else 32, dtype=dtype,
                                       scale_inputs=4.0 if softcap else 1.0)
    mask = dict(is_causal=causal, window=window, align=align, softcap=softcap)
    out, lse = flashscope.attention_varlen(q, k, v, cu_q, cu_k, max(LENGTHS[0]),
                                           max(LENGTHS[1]), return_lse=True, config=CFG,
                                           **mask)
    ref_out, ref_lse, *_ = reference(q, k, v, cu_q, cu_k, **mask)
    assert out.shape == q.shape and lse.shape == (2, q.shape[0]) and lse.dtype == torch.float32
    check(f"out (seed {seed})", out, ref_out, ERROR_BOUND[dtype])
    got = lse.double().cpu()
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref_lse)), f"-inf rows (seed {seed})"
    finite = torch.isfinite(ref_lse)
    assert (got - ref_lse)[finite].abs().max() < 2e-3, f"lse (seed {seed})"


@pytest.mark.parametrize("causal,window,align,softcap", MASKS[1::2])
def test_backward_matches_float64_per_sequence(device, poisoned, causal, window, align,
                                               softcap):
    """16 x 16 tiles: several key and query tiles a sequence, partial ones at each end."""
    from flashscope import launch
    from flashscope.masks import Mask
    from flashscope.varlen import _packed, _view

    seed = fresh_seed()
    q, k, v, cu_q, cu_k = packed_batch(device, *LENGTHS, H=2, Hkv=1, D=32,
                                       dtype=torch.float16)
    dout = torch.randn_like(q)
    mask = Mask.of(causal, window, align, softcap)
    packed = _packed(cu_q, cu_k, max(LENGTHS[0]), max(LENGTHS[1]))
    qv, kv, vv = (_view(t) for t in (q, k, v))
    o, lse = launch.forward(qv, kv, vv, mask=mask, scale=32 ** -0.5, cfg=CFG, return_lse=True,
                            packed=packed)
    grads = launch.backward(_view(dout), qv, kv, vv, o, lse, mask=mask, scale=32 ** -0.5,
                            cfg=BWD, packed=packed)
    ref = reference(q, k, v, cu_q, cu_k, dout, is_causal=causal, window=window, align=align,
                    softcap=softcap)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[2:]):
        check(f"{name} (seed {seed})", got[0].transpose(0, 1), want,
              4 * ERROR_BOUND[torch.float16])


def test_delta_covers_every_packed_sequence(device, poisoned):
    """The delta launch over a packed batch (the GQA backward's first launch on a GPU, the
    Hopper backward's always) writes rowsum(dO O) for the rows of every sequence, not the
    first one's alone: its grid has a row per sequence and head."""
    from flashscope import kernels
    from flashscope.families import triton_bwd
    from flashscope.launch import launch_jit
    from flashscope.varlen import _view

    fresh_seed()
    lengths = (5, 0, 33, 1, 20)
    out, dout, _, cu, _ = packed_batch(device, lengths, lengths, H=3, Hkv=3, D=24,
                                       dtype=torch.float16)
    ov, dov = _view(out), _view(dout)
    delta = torch.empty(ov.shape[:3], device=ov.device, dtype=torch.float32)
    fn, grid, args, consts, opts = triton_bwd.preprocess_call(ov, dov, delta, 16,
                                                              max(lengths), cu, True)
    mod = kernels.load(triton_bwd.MODULE, interpret=device == "cpu")
    launch_jit(getattr(mod, fn), grid, args, consts, opts, ov.device)
    want = (ov.double() * dov.double()).sum(-1)
    assert not torch.isnan(delta).any(), "rows left unwritten"
    assert (delta.double() - want).abs().max() < 1e-2


def test_padded_rows_start_every_sequence_on_a_tile(device, poisoned):
    """The delta launch's padded layout (the Hopper backward's packed batches): each
    sequence's delta and log-sum-exp from a multiple of the tile's rows, the rows up to
    its last tile's end 0 and +inf, nothing else written, the vectors as long as
    ``row_shape`` says."""
    from flashscope import kernels
    from flashscope.families import sm90_bwd, triton_bwd
    from flashscope.families.sm90_bwd import Sm90BwdConfig
    from flashscope.launch import launch_jit
    from flashscope.varlen import _packed, _view

    fresh_seed()
    lengths, pad, H = (70, 0, 129, 1, 64, 3), 64, 3
    out, dout, _, cu, _ = packed_batch(device, lengths, lengths, H=H, Hkv=H, D=24,
                                       dtype=torch.float16)
    ov, dov = _view(out), _view(dout)
    lse = torch.randn(ov.shape[:3], device=ov.device)
    shape = sm90_bwd.row_shape(ov, _packed(cu, cu, 129, 129), Sm90BwdConfig(BLOCK_M=pad))
    total = sum(lengths)
    assert shape == (H, -(-(total + len(lengths) * pad) // pad) * pad)
    delta, rows = (torch.full(shape, -7.0, device=ov.device) for _ in range(2))
    fn, grid, args, consts, opts = triton_bwd.preprocess_call(
        ov, dov, delta, 16, max(lengths), cu, True, (lse, rows, pad))
    mod = kernels.load(triton_bwd.MODULE, interpret=device == "cpu")
    launch_jit(getattr(mod, fn), grid, args, consts, opts, ov.device)
    want = (ov.double() * dov.double()).sum(-1)[0].cpu()
    delta, rows, lse = delta.cpu(), rows.cpu(), lse[0].cpu()
    seen = torch.zeros(shape, dtype=torch.bool)
    for b, n in enumerate(lengths):
        q0 = int(cu[b])
        r0 = (q0 + b * pad) // pad * pad
        end = -(-n // pad) * pad
        assert torch.allclose(delta[:, r0:r0 + n].double(), want[:, q0:q0 + n], atol=1e-2)
        assert torch.equal(rows[:, r0:r0 + n], lse[:, q0:q0 + n])
        assert (delta[:, r0 + n:r0 + end] == 0).all()
        assert torch.isposinf(rows[:, r0 + n:r0 + end]).all()
        assert not seen[:, r0:r0 + end].any(), "sequences overlap"
        seen[:, r0:r0 + end] = True
    assert (delta[~seen] == -7).all() and (rows[~seen] == -7).all()


def test_autograd_with_the_default_configs(device, poisoned):
    seed = fresh_seed()
    q, k, v, cu_q, cu_k = packed_batch(device, *LENGTHS, H=2, Hkv=1, D=32,
                                       dtype=torch.bfloat16, grad=True)
    mask = dict(is_causal=True, window=(7, None), align="bottom_right", softcap=None)
    out = flashscope.attention_varlen(q, k, v, cu_q, cu_k, max(LENGTHS[0]), max(LENGTHS[1]),
                                      **mask)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference(q, k, v, cu_q, cu_k, dout, **mask)
    check(f"out (seed {seed})", out, ref[0], ERROR_BOUND[torch.bfloat16])
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[2:]):
        check(f"{name} (seed {seed})", got, want, 2 * ERROR_BOUND[torch.bfloat16])


def test_equal_lengths_match_the_dense_op(device):
    """A packed batch of equal lengths is its dense twin, to the bit: the same tiles in the
    same order."""
    fresh_seed()
    B, N, H, D = 3, 37, 2, 32
    q, k, v, cu_q, cu_k = packed_batch(device, (N,) * B, (N,) * B, H=H, Hkv=H, D=D,
                                       dtype=torch.float16)
    got = flashscope.attention_varlen(q, k, v, cu_q, cu_k, N, N, is_causal=True, config=CFG)
    dense = flashscope.attention(*(t.view(B, N, H, D).transpose(1, 2) for t in (q, k, v)),
                                 is_causal=True, config=CFG)
    assert torch.equal(got, dense.transpose(1, 2).reshape(B * N, H, D))


def test_bad_inputs_are_refused_by_name(device):
    q, k, v, cu_q, cu_k = packed_batch(device, (3, 4), (3, 4), H=2, Hkv=2, D=16,
                                       dtype=torch.float16)
    ok = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=4,
              max_seqlen_k=4)
    dev = cu_q.device
    cases = [
        ({"q": q[None]}, "q: expected rank 3"),
        ({"k": k[:, :, :8], "v": v[:, :, :8]}, "head dim"),
        ({"k": k[:, :1].repeat(1, 3, 1), "v": v[:, :1].repeat(1, 3, 1)}, "must divide"),
        ({"v": v.float()}, "v: expected dtype"),
        ({"cu_seqlens_q": cu_q.long()}, "cu_seqlens_q: expected dtype int32"),
        ({"cu_seqlens_k": cu_k[:2]}, "cu_seqlens_q, cu_seqlens_k: expected one length"),
        ({"cu_seqlens_q": cu_q[:1]}, r"cu_seqlens_q: expected shape \(B \+ 1,\)"),
        ({"max_seqlen_k": -1}, "max_seqlen_k: expected an integer >= 0"),
        ({"max_seqlen_k": 4.0}, "max_seqlen_k: expected an integer"),
        ({"softcap": 0.0}, "softcap"), ({"softcap": float("inf")}, "softcap"),
        ({"window": (1.5, 2)}, "window left"), ({"align": "center"}, "align"),
        ({"config": flashscope.Sm90FwdConfig()}, "sm90-fwd takes head dims 33..256, got 16"),
    ]
    #: what only the prefix sums' values show: checked on CPU tensors, and on a GPU with
    #: validate=True (one host sync)
    values = [
        ({"cu_seqlens_q": torch.tensor([0, 3, 6], dtype=torch.int32, device=dev)},
         "cu_seqlens_q: expected the last prefix sum to equal the packed length 7, got 6"),
        ({"cu_seqlens_k": torch.tensor([1, 3, 7], dtype=torch.int32, device=dev)},
         "cu_seqlens_k: expected prefix sums starting at 0"),
        ({"cu_seqlens_q": torch.tensor([0, 8, 7], dtype=torch.int32, device=dev)},
         "cu_seqlens_q: expected non-decreasing"),
        ({"max_seqlen_q": 3}, "max_seqlen_q: 3 is shorter than sequence 1"),
    ]
    for change, msg, by_value in [(*c, False) for c in cases] + [(*c, True) for c in values]:
        with pytest.raises((TypeError, ValueError), match=msg):
            flashscope.attention_varlen(**{**ok, **change}, validate=True)
        if device == "cpu" or not by_value:
            with pytest.raises((TypeError, ValueError), match=msg):
                flashscope.attention_varlen(**{**ok, **change})
    wide = packed_batch(device, (3, 4), (3, 4), H=2, Hkv=2, D=64, dtype=torch.float16)
    for knob in ("BALANCE", "SPLIT_KV"):  # the Hopper kernel's host-list switches
        with pytest.raises(ValueError, match=f"{knob}=1 shapes the host's work list"):
            flashscope.attention_varlen(*wide, 4, 4,
                                        config=flashscope.Sm90FwdConfig(**{knob: True}))
    if device == "cuda":  # a prefix sum on another device than q
        with pytest.raises(ValueError, match="cu_seqlens_q: expected q's device"):
            flashscope.attention_varlen(**{**ok, "cu_seqlens_q": cu_q.cpu()})


def test_one_graph_under_torch_compile(device):
    fresh_seed()
    q, k, v, cu_q, cu_k = packed_batch(device, (9, 4), (9, 6), H=2, Hkv=1, D=16,
                                       dtype=torch.float16, grad=True)

    def f(q, k, v):
        return flashscope.attention_varlen(q, k, v, cu_q, cu_k, 9, 9, is_causal=True,
                                           window=(3, None))

    torch._dynamo.reset()
    explained = torch._dynamo.explain(f)(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    backend = "aot_eager" if device == "cpu" else "inductor"
    out = torch.compile(f, backend=backend, fullgraph=True)(q, k, v)
    eager = f(q, k, v)
    assert torch.equal(out, eager)
    g = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(not torch.isnan(t).any() for t in g)


def test_custom_ops_pass_opcheck(device):
    from flashscope.api import config_text

    q, k, v, cu_q, cu_k = packed_batch(device, (5, 0, 4), (3, 6, 0), H=2, Hkv=1, D=16,
                                       dtype=torch.float16, grad=True)
    cfg = config_text(CFG)
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(torch.ops.flashscope.attention_varlen_fwd.default,
                          (q, k, v, cu_q, cu_k, 5, 6, True, 3, -1, True, 0.0, 0.25, cfg),
                          test_utils=checks)
    out, lse = torch.ops.flashscope.attention_varlen_fwd(q, k, v, cu_q, cu_k, 5, 6, False,
                                                         -1, -1, False, 2.0, 0.25, cfg)
    torch.library.opcheck(torch.ops.flashscope.attention_varlen_bwd.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(),
                           out.detach(), lse, cu_q, cu_k, 5, 6, False, -1, -1, False, 2.0,
                           0.25, config_text(BWD)),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window,softcap", [(True, None, None), (False, None, None),
                                                   (True, (1024, 0), None),
                                                   (False, (256, 256), 30.0)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_64k_tokens_random_lengths(device, poisoned, causal, window, softcap, dtype):
    """A 64k-token batch of lengths 1..8192 drawn at random (D = 128, GQA 16/4), the
    default configs, forward and gradients against float64 per sequence."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    lengths, total = [], 0
    while total < 65536:
        n = min(int(torch.randint(1, 8193, (1,), generator=gen)), 65536 - total)
        lengths.append(n)
        total += n
    q, k, v, cu_q, cu_k = packed_batch(device, lengths, lengths, H=16, Hkv=4, D=128,
                                       dtype=dtype, grad=True)
    mask = dict(is_causal=causal, window=window, softcap=softcap)
    out = flashscope.attention_varlen(q, k, v, cu_q, cu_k, max(lengths), max(lengths),
                                      validate=True, **mask)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference(q, k, v, cu_q, cu_k, dout, **mask)
    check(f"out (seed {seed})", out, ref[0], ERROR_BOUND[dtype])
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[2:]):
        check(f"{name} (seed {seed})", got, want, 2 * ERROR_BOUND[dtype])


# (query lengths, key lengths, H, Hkv, D, causal, dtype, window, align, softcap): empty query
# sequences and ones without keys, length 1, Nq != Nk within a sequence (top-left causal
# too), lengths off the 64-row query and 128-row key tiles, GQA and MQA; bands (windows
# one- and two-sided, bottom-right alignment on each sequence's own lengths), a logit cap
SM90_PACKED = [
    ((70, 0, 200, 1, 130, 300), (150, 5, 129, 0, 130, 64), 4, 2, 128, False, torch.bfloat16,
     None, "top_left", None),
    ((70, 0, 200, 1, 130, 257), (70, 0, 200, 1, 130, 257), 4, 1, 128, True, torch.float16,
     None, "top_left", None),
    ((300, 64, 129, 7), (200, 64, 300, 7), 2, 2, 64, True, torch.bfloat16,
     None, "top_left", None),
    ((513, 1, 640), (513, 1, 640), 6, 3, 64, False, torch.float16, None, "top_left", None),
    ((70, 0, 200, 1, 130, 300), (150, 5, 129, 0, 130, 700), 4, 2, 128, True, torch.bfloat16,
     None, "bottom_right", None),
    ((300, 64, 129, 700), (300, 64, 129, 700), 4, 4, 128, True, torch.bfloat16,
     (100, None), "top_left", None),
    ((300, 1, 129, 700), (200, 64, 300, 500), 2, 1, 64, False, torch.float16,
     (70, 30), "bottom_right", None),
    ((513, 0, 640), (300, 9, 640), 4, 2, 128, False, torch.bfloat16,
     (None, 60), "top_left", None),
    ((300, 64, 129, 700), (300, 64, 129, 700), 4, 2, 128, True, torch.bfloat16,
     None, "top_left", 2.0),
    ((70, 0, 200, 1, 130, 300), (150, 5, 129, 0, 130, 700), 4, 2, 96, True, torch.bfloat16,
     None, "bottom_right", None),
    ((300, 1, 129, 700), (200, 64, 300, 500), 2, 1, 80, False, torch.float16,
     (70, 30), "top_left", None),
    ((300, 0, 129, 700), (200, 64, 129, 500), 4, 2, 256, True, torch.bfloat16,
     None, "bottom_right", None),
    ((300, 64, 1, 700), (300, 64, 1, 700), 4, 4, 256, False, torch.bfloat16,
     (100, 100), "top_left", 30.0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("lq,lk,H,Hkv,D,causal,dtype,window,align,softcap", SM90_PACKED)
def test_sm90_bwd_packed_grads_match_float64(device, poisoned, lq, lk, H, Hkv, D, causal,
                                             dtype, window, align, softcap):
    """The Hopper backward over packed batches (its VARLEN build, with a band's too),
    gradients against float64 per sequence, NaN-poisoned buffers written in full."""
    from flashscope import launch
    from flashscope.families import sm90_bwd
    from flashscope.masks import Mask
    from flashscope.varlen import _packed, _view, backward_problem

    if launch.device_target(torch.device(device)) != "sm90":
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    q, k, v, cu_q, cu_k = packed_batch(device, lq, lk, H=H, Hkv=Hkv, D=D, dtype=dtype)
    dout = torch.randn_like(q)
    out, lse = flashscope.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                           is_causal=causal, window=window, align=align,
                                           softcap=softcap, return_lse=True)
    mask, packed = Mask.of(causal, window, align, softcap), _packed(cu_q, cu_k, max(lq),
                                                                    max(lk))
    cfg = sm90_bwd.select(backward_problem(q, k, mask, packed, "sm90"))  # D = 64: 128 rows
    grads = launch.backward(_view(dout), _view(q), _view(k), _view(v), _view(out),
                            lse.unsqueeze(0), mask=mask, scale=D ** -0.5, cfg=cfg,
                            packed=packed)
    ref = reference(q, k, v, cu_q, cu_k, dout, is_causal=causal, window=window, align=align,
                    softcap=softcap)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[2:]):
        check(f"{name} (seed {seed})", got[0].transpose(0, 1), want, 2 * ERROR_BOUND[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_default_packed_backward_takes_the_one_pass(device, causal):
    """Through ``attention_varlen``'s autograd on an sm_90 device: a packed batch the
    rule gives to sm90-bwd (GQA 16/4, D = 128, lengths 333-2048), against float64."""
    from flashscope import launch, varlen
    from flashscope.masks import Mask

    if launch.device_target(torch.device(device)) != "sm90":
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    lengths = (1500, 333, 2048, 700)
    q, k, v, cu_q, cu_k = packed_batch(device, lengths, lengths, H=16, Hkv=4, D=128,
                                       dtype=torch.bfloat16, grad=True)
    packed = varlen._packed(cu_q, cu_k, 2048, 2048)
    problem = varlen.problem_of(q, k, Mask.of(causal), packed, "sm90")
    assert flashscope.api.tensors_backward(problem, *(varlen._view(t) for t in (q, k, v))
                                           ).KERNEL == "sm90-bwd"
    out = flashscope.attention_varlen(q, k, v, cu_q, cu_k, 2048, 2048, is_causal=causal)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference(q, k, v, cu_q, cu_k, dout, is_causal=causal)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[2:]):
        check(f"{name} (seed {seed})", got, want, 2 * ERROR_BOUND[torch.bfloat16])


@pytest.mark.parametrize("lengths,causal,kernel", [
    ((1810, 393, 152, 3768, 5699, 129, 8000), False, "sm90-bwd"),  # mean 2865
    ((1810, 393, 152, 3768, 5699, 129, 8000), True, "sm90-bwd"),
    ((1024, 64, 90, 300, 200, 77, 500, 100), False, "sm90-bwd"),  # mean 294: 5 tiles
    ((64, 90, 300, 100, 77, 200), True, "triton-bwd"),  # mean 139: 1.5 causal tiles
])
def test_packed_backward_rule_reads_the_mean_length(lengths, causal, kernel):
    """The one pass against two on a packed batch is chosen on its sequences' mean
    lengths (known from the tensors' totals), not the longest: short sequences run a
    few query tiles a program whatever the longest is."""
    from flashscope.families import default_backward
    from flashscope.masks import Mask
    from flashscope.varlen import _packed, backward_problem

    total = sum(lengths)
    q = torch.empty(total, 16, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(total, 16, 128, dtype=torch.bfloat16, device="meta")
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    problem = backward_problem(q, k, Mask.of(causal), _packed(cu, cu, max(lengths),
                                                              max(lengths)), "sm90")
    assert problem.n_q == -(-total // len(lengths)) and problem.varlen
    assert default_backward(problem).KERNEL == kernel
