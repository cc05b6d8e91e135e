"""SPLIT_KV: the merge of a cut block's pieces (any device: Triton's interpreter on CPU),
the plan a SPLIT_KV launch builds, and on an sm_90 GPU the whole forward against the
float64 reference on shapes whose lists cut blocks."""

import math

import pytest
import torch

from flashscope import kernels, launch
from flashscope.errors import ConfigError
from flashscope.families import sm90_fwd

from .test_forward import run_case
from .test_gluon import BARE

G = BARE.replace(SPLIT_KV=True)


def _pieces(s, v, cuts, block_m):
    """(O, m, l) of each key range [cuts[i], cuts[i+1]) of float64 scores s [R, N]
    (base 2, scaled) and values v [N, D], rows padded to block_m."""
    out = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        m = s[:, lo:hi].max(dim=1).values
        p = torch.exp2(s[:, lo:hi] - m[:, None])
        o = torch.zeros(block_m, v.shape[1], dtype=torch.float64)
        ml = torch.zeros(block_m, 2, dtype=torch.float64)
        o[:s.shape[0]] = p @ v[lo:hi]
        ml[:s.shape[0], 0] = m
        ml[:s.shape[0], 1] = p.sum(dim=1)
        out.append(torch.cat([o.flatten(), ml.flatten()]))
    return out


@pytest.mark.parametrize("mode", ["rows", "chunked", "grouped"])
@pytest.mark.parametrize("block_m,D", [(128, 64), (192, 128)])
def test_merge_matches_float64(device, block_m, D, mode):
    """Two cut blocks of a (B=2, H=3, Nq=200) output, 3 and 2 pieces with uneven ranges,
    merged into a NaN-poisoned, non-contiguous output and log-sum-exp: the cut rows
    match the float64 softmax of all keys (and its log-sum-exp), rows past Nq are not
    written, and every other row is left as it was; ``chunked``: the decoding merge's
    programs (16 rows, 32 columns, pieces two at a time); ``grouped``: those programs
    writing a decoding call's rows in the caller's layout (GROUP = 4: row r is token
    r / 4 of query head 4 h + r % 4 of an output (B, 50, 3, 4, D), log-sum-exp (B, 12,
    50))."""
    B, H, n_q, n_k = 2, 3, 200, 300
    n_m = math.ceil(n_q / block_m)
    gen = torch.Generator().manual_seed(torch.seed() % 2 ** 31)
    blocks = [(4 * n_m + n_m - 1, [0, 37, 38, 300]), (0, [0, 150, 300])]
    parts, merges, refs = [], [], []
    for t, cuts in blocks:
        rows = min(block_m, n_q - (t % n_m) * block_m)
        s = torch.randn(rows, n_k, generator=gen, dtype=torch.float64) * 3
        v = torch.randn(n_k, D, generator=gen, dtype=torch.float64)
        merges.append((t, len(parts), len(cuts) - 1))
        parts += _pieces(s, v, cuts, block_m)
        p = torch.softmax(s * math.log(2), dim=1)
        refs.append((t, rows, p @ v, torch.logsumexp(s * math.log(2), dim=1)))
    part = torch.cat(parts).float().to(device)
    table = torch.tensor(merges, dtype=torch.int32, device=device)
    merge = kernels.load("attention_merge", interpret=device == "cpu")._merge_parts
    chunked = dict(HEAD_DIM=D, BLOCK_M=block_m, ROWS=16, RETURN_LSE=True, COLS=32, CHUNK=2)
    if mode == "grouped":
        out5 = torch.full((B, n_q // 4, 4, H, D), float("nan"), device=device,
                          dtype=torch.float16).transpose(2, 3)
        lse5 = torch.full((B, H * 4, n_q // 4), float("nan"), device=device)
        o, l_ = out5.stride(), lse5.stride()
        merge[(len(blocks), block_m // 16, D // 32)](
            part, table, out5, lse5, H, n_q, n_m, D, o[0], o[2], o[1], o[4], l_[0],
            4 * l_[1], o[3], l_[1], GROUP=4, **chunked)
        # as (B, H, n_q, D) and (B, H, n_q): packed row r = 4 t + g
        out = out5.permute(0, 2, 1, 3, 4).reshape(B, H, n_q, D)
        lse = lse5.view(B, H, 4, n_q // 4).transpose(2, 3).reshape(B, H, n_q)
    else:
        out = torch.full((B, n_q, H, D), float("nan"), device=device,
                         dtype=torch.float16).transpose(1, 2)
        lse = torch.full((H, B, n_q), float("nan"), device=device).transpose(0, 1)
        args = (part, table, out, lse, H, n_q, n_m, D, *out.stride(), *lse.stride()[:2],
                0, 0)
        if mode == "chunked":  # a decoding call's merge: 16 rows and 32 columns a program
            merge[(len(blocks), block_m // 16, D // 32)](*args, **chunked)
        else:
            merge[(len(blocks), block_m // 64)](*args, HEAD_DIM=D, BLOCK_M=block_m, ROWS=64,
                                                RETURN_LSE=True)
    written = torch.zeros(B, H, n_q, dtype=torch.bool)
    for t, rows, ref_o, ref_lse in refs:
        bh, m = divmod(t, n_m)
        b, h = divmod(bh, H)
        r0 = m * block_m
        got = out[b, h, r0:r0 + rows].double().cpu()
        assert not torch.isnan(got).any()
        err = ((got - ref_o).norm() / ref_o.norm()).item()
        assert err < 2e-3, err
        lse_err = (lse[b, h, r0:r0 + rows].double().cpu() - ref_lse).abs().max().item()
        assert lse_err < 1e-4, lse_err
        written[b, h, r0:r0 + rows] = True
    assert torch.isnan(out.cpu()[~written]).all() and torch.isnan(lse.cpu()[~written]).all()


def test_plan_cuts_and_sizes_its_workspace():
    """A SPLIT_KV plan (meta tensors: the list is built, nothing runs) for 32 heads of
    128 queries over 16k keys: one block per head on 132 programs, so every block is cut;
    its workspace holds BLOCK_M x (D + 2) floats per slot; the same config without
    SPLIT_KV has no merge."""
    q = torch.empty(1, 32, 128, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(1, 32, 16384, 64, device="meta", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    plan = sm90_fwd.plan(q, k, k, out, None, causal=False, scale=0.125, cfg=G)
    assert plan.consts["SPLIT"] and plan.consts["LPT"]
    assert plan.split.merges.shape == (32, 3) and plan.split.slots >= 64
    assert plan.workspace(q).numel() == plan.split.slots * 128 * 66
    plain = sm90_fwd.plan(q, k, k, out, None, causal=False, scale=0.125,
                          cfg=G.replace(SPLIT_KV=False))
    assert plain.split is None and not plain.consts["SPLIT"] and plain.workspace(q) is None


def _needs_sm90(device):
    if device != "cuda":
        pytest.skip("Gluon kernels run on an sm_90 GPU only")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles", [(128, 128, 2, {}), (192, 128, 3, {"PINGPONG": True}),
                                   (192, 128, 3, {"LAZY_RESCALE": True, "EARLY_Q": True,
                                                  "K_EARLY": True, "MASKED_FIRST": True}),
                                   (128, 128, 2, {"Q_IN_REGS": True, "LAZY_RESCALE": True,
                                                  "EARLY_Q": True, "K_EARLY": True,
                                                  "MASKED_FIRST": True, "OUT_RCP": True}),
                                   (192, 128, 3, {"PINGPONG": True, "EARLY_Q": True,
                                                  "OUT_RCP": True, "BALANCE": True}),
                                   (128, 64, 2, {"PINGPONG": True})],
                         ids=lambda t: "m{}n{}s{}".format(*t[:3]) + "".join(
                             k[0].lower() for k in t[3]))
@pytest.mark.parametrize("programs", [7, 13, None])
def test_split_forward_matches_float64_reference(device, monkeypatch, causal, tiles,
                                                 programs):
    """Shapes whose lists cut blocks (checked: the plans' merge tables are not all empty;
    causal, only on all SMs) on 7, 13 or all SMs: few long rows (Nq = 130 over 4097 keys), Nq != Nk, GQA, a last
    block of padding rows (Nq = 200 with 192-row blocks: never cut, passed)."""
    _needs_sm90(device)
    if programs is not None:
        monkeypatch.setattr(launch, "sm_count", lambda dev: programs)
    bm, bn, st, knobs = tiles
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=bn, num_stages=st, **knobs)
    cut = 0
    for B, H, Hkv, Nq, Nk, D in [(2, 4, 2, 130, 4097, 64), (1, 6, 6, 200, 2000, 128),
                                 (2, 4, 1, 1000, 1000, 64), (1, 2, 2, 3000, 3000, 128)]:
        try:
            sm90_fwd.check(cfg, "sm90", D)
        except ConfigError as e:
            assert "shared memory" in str(e), e
            continue
        run_case(device, B=B, H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal,
                 dtype=torch.bfloat16, bnhd=Nq % 2 == 0, cfg=cfg, with_lse=True)
        q = torch.empty(B, H, Nq, D, device="meta", dtype=torch.bfloat16)
        k = torch.empty(B, Hkv, Nk, D, device="meta", dtype=torch.bfloat16)
        n_prog = programs or launch.sm_count(torch.device(device))
        cut += sm90_fwd.split_tensors(q, Nk, cfg, n_prog, causal).slots
    # causal lists on 7 or 13 programs already end within a piece of even: nothing cut
    assert cut > 0 or (causal and programs is not None)
