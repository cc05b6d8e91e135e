"""Forward correctness against a float64 reference, on fresh random inputs each run.

On CPU the kernel runs in Triton's interpreter, so shapes are small but every switch is
covered: causal or not, head dims that need padding, lengths that are not multiples of the
tiles (including 1), Nq != Nk, GQA, (B, N, H, D) strided views, the log-sum-exp output,
Q re-read vs Q in registers, BLOCK_M < BLOCK_N. Outputs are poisoned with NaN first and
must be fully written.
"""

import math

import pytest
import torch

import flashscope
from flashscope import TritonFwdConfig, launch
from flashscope.masks import Mask
from flashscope.testing.inputs import fresh_seed, make_qkv
from flashscope.testing.reference import ERROR_BOUND, reference_attention, rel_error

SMALL = TritonFwdConfig(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)

# (Nq, Nk): lengths that are not tile multiples, length 1, Nq != Nk both ways.
LENGTHS = [(1, 1), (1, 37), (17, 33), (129, 77), (257, 130), (64, 64)]
HEAD_DIMS = [32, 64, 80, 128]


def reference_lse(q, k, *, is_causal, scale, window=None, align="top_left", softcap=None):
    from flashscope.testing.reference import _hidden

    qd, kd = q.double(), k.double()
    if kd.shape[1] != qd.shape[1]:
        kd = kd.repeat_interleave(qd.shape[1] // kd.shape[1], dim=1)
    s = (qd @ kd.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = s.shape[-2:]
    hidden = _hidden(0, n_q, n_q, n_k, is_causal, window, align, s.device)
    if hidden is not None:
        s = s.masked_fill(hidden, float("-inf"))
    return torch.logsumexp(s, dim=-1)


def run_case(device, *, B, H, Hkv, Nq, Nk, D, causal, dtype, bnhd, cfg, with_lse,
             window=None, align="top_left", softcap=None):
    seed = fresh_seed()
    q, k, v = make_qkv(device, B, H, Nq, Nk, D, Hkv=Hkv, dtype=dtype, bnhd=bnhd)
    return check_case(q, k, v, causal=causal, cfg=cfg, with_lse=with_lse, window=window,
                      align=align, softcap=softcap,
                      tag=f"seed={seed} B={B} H={H}/{Hkv} Nq={Nq} Nk={Nk} D={D} "
                          f"causal={causal} window={window} {align} {dtype} {cfg.label}")


def check_case(q, k, v, *, causal, cfg, with_lse, tag, window=None, align="top_left",
               softcap=None):
    """The forward of q, k, v (B, H, N, D) into a NaN-poisoned output, against the float64
    reference: every element written, relative error within the dtype's bound, and the
    log-sum-exp within 2e-3 (-inf exactly where a row sees no key)."""
    B, H, Nq, D = q.shape
    scale = 1.0 / math.sqrt(D)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    out, lse = launch.forward(q, k, v, mask=Mask.of(causal, window, align, softcap),
                              scale=scale, cfg=cfg, return_lse=with_lse, out=out)
    ref = reference_attention(q, k, v, is_causal=causal, window=window, align=align,
                              softcap=softcap)
    assert not torch.isnan(out).any(), f"unwritten or NaN output elements ({tag})"
    err = rel_error(out, ref)
    bound = ERROR_BOUND[q.dtype]
    assert err <= bound, f"relative error {err:.2e} > {bound:.0e} ({tag})"
    if with_lse:
        ref_lse = reference_lse(q, k, is_causal=causal, scale=scale, window=window,
                                align=align, softcap=softcap).cpu()
        got = lse.double().cpu()
        assert lse.shape == (B, H, Nq) and lse.dtype == torch.float32
        assert torch.equal(torch.isneginf(got), torch.isneginf(ref_lse)), f"-inf rows ({tag})"
        finite = torch.isfinite(ref_lse)
        lse_err = (got - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
        assert lse_err < 2e-3, f"lse max abs error {lse_err:.2e} ({tag})"
    return out


CASES = [
    pytest.param(causal, D, nq, nk, id=f"{'causal' if causal else 'full'}-d{D}-q{nq}-k{nk}")
    for causal in (False, True) for D in HEAD_DIMS for (nq, nk) in LENGTHS
]


@pytest.mark.parametrize("causal,D,Nq,Nk", CASES)
def test_fp16_matches_float64_reference(device, causal, D, Nq, Nk):
    # Rotate GQA / strided layout / lse / Q-in-registers through the cases so each
    # combination of them appears with both masks and several lengths.
    i = CASES.index(next(c for c in CASES if c.values == (causal, D, Nq, Nk)))
    gqa, bnhd, with_lse, q_regs = (i & 1, (i >> 1) & 1, (i >> 2) & 1, (i % 3) != 0)
    run_case(device, B=2, H=4, Hkv=2 if gqa else 4, Nq=Nq, Nk=Nk, D=D, causal=causal,
             dtype=torch.float16, bnhd=bool(bnhd), cfg=SMALL.replace(Q_IN_REGS=q_regs),
             with_lse=bool(with_lse))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk", [(17, 33), (129, 77)])
def test_bf16_matches_float64_reference(device, causal, Nq, Nk):
    run_case(device, B=1, H=2, Hkv=1, Nq=Nq, Nk=Nk, D=64, causal=causal,
             dtype=torch.bfloat16, bnhd=True, cfg=SMALL, with_lse=True)


@pytest.mark.parametrize("cfg", [
    TritonFwdConfig(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1),   # BLOCK_M < BLOCK_N
    TritonFwdConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1, Q_IN_REGS=False),
    TritonFwdConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),  # sm90 default
], ids=lambda c: c.label.replace(" ", "_"))
@pytest.mark.parametrize("causal", [False, True])
def test_tile_shapes(device, cfg, causal):
    run_case(device, B=1, H=2, Hkv=2, Nq=150, Nk=97, D=48, causal=causal,
             dtype=torch.float16, bnhd=False, cfg=cfg, with_lse=True)


def test_head_dims_16_and_256(device):
    for D in (16, 256):
        run_case(device, B=1, H=1, Hkv=1, Nq=33, Nk=40, D=D, causal=True,
                 dtype=torch.float16, bnhd=False, cfg=SMALL, with_lse=False)


def test_mqa_single_kv_head(device):
    run_case(device, B=1, H=6, Hkv=1, Nq=20, Nk=45, D=32, causal=False,
             dtype=torch.float16, bnhd=True, cfg=SMALL, with_lse=True)


def test_public_api_defaults(device):
    fresh_seed()
    q, k, v = make_qkv(device, 2, 4, 70, 70, 64, dtype=torch.float16)
    out = flashscope.attention(q, k, v, is_causal=True)
    ref = reference_attention(q, k, v, is_causal=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert rel_error(out, ref) <= ERROR_BOUND[torch.float16]


def test_output_keeps_query_layout(device):
    q, k, v = make_qkv(device, 1, 3, 16, 16, 32, dtype=torch.float16, bnhd=True)
    out = flashscope.attention(q, k, v)
    assert out.stride() == q.stride(), "output should be laid out like query (no copy needed)"


def test_explicit_scale(device):
    fresh_seed()
    q, k, v = make_qkv(device, 1, 2, 40, 24, 64, dtype=torch.float16)
    out = flashscope.attention(q, k, v, scale=0.3)
    ref = reference_attention(q, k, v, scale=0.3)
    assert rel_error(out, ref) <= ERROR_BOUND[torch.float16]
    unscaled = reference_attention(q, k, v)
    assert rel_error(out, unscaled) > 10 * ERROR_BOUND[torch.float16], "scale was ignored"


def test_large_scores_stay_finite(device):
    # Scores of order 1e3: exp() would overflow without the running maximum.
    fresh_seed()
    q, k, v = make_qkv(device, 1, 2, 65, 70, 64, dtype=torch.float16, scale_inputs=30.0)
    out = flashscope.attention(q, k, v, is_causal=True)
    ref = reference_attention(q, k, v, is_causal=True)
    s_max = (q.double() @ k.double().transpose(-1, -2)).abs().max().item() / 8
    assert s_max > 500, "test inputs must produce large scores"
    assert torch.isfinite(out).all()
    assert rel_error(out, ref) <= ERROR_BOUND[torch.float16]


@pytest.mark.parametrize("where", ["q_nan", "k_nan", "v_nan", "q_neginf", "k_neginf"])
@pytest.mark.parametrize("causal", [False, True])
def test_nonfinite_inputs_follow_sdpa(device, where, causal):
    """NaN/-inf in q, k or v give NaN exactly where SDPA's math path gives NaN."""
    fresh_seed()
    q, k, v = make_qkv(device, 1, 1, 24, 24, 32, dtype=torch.float16)
    target = {"q": q, "k": k, "v": v}[where[0]]
    target[0, 0, 7, 3] = float("nan") if where.endswith("nan") else float("-inf")
    out = flashscope.attention(q, k, v, is_causal=causal)
    ref = reference_attention(q, k, v, is_causal=causal)
    assert torch.equal(torch.isnan(out).cpu(), torch.isnan(ref).cpu()), \
        f"NaN pattern differs from SDPA's ({where}, causal={causal})"
    finite = torch.isfinite(ref).cpu()
    if finite.any():
        diff = (out.double().cpu() - ref.cpu())[finite].abs().max().item()
        assert diff < 2e-2


def test_empty_inputs_like_sdpa(device):
    q, k, v = make_qkv(device, 2, 2, 0, 5, 32, dtype=torch.float16)
    out = flashscope.attention(q, k, v)
    assert out.shape == (2, 2, 0, 32)
    q, k, v = make_qkv(device, 2, 2, 3, 0, 32, dtype=torch.float16)
    out = flashscope.attention(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float().cpu(), k.float().cpu(),
                                                           v.float().cpu())
    assert out.shape == (2, 2, 3, 32)
    assert torch.equal(out.float().cpu(), ref), "no keys: SDPA returns zeros"
    _, lse = flashscope.attention(q, k, v, return_lse=True)
    assert torch.isneginf(lse).all()
