"""sm90-fwd on packed (variable-length) batches against the float64 reference, sequence by
sequence (sm_90 GPU only; the device-built work list runs offline in
``tests/test_packed_worklist.py``).

The batches hold an empty query sequence, sequences without keys, length 1, lengths one
short of, equal to and one past the tiles (so full 64-row slabs go out through TMA and the
slabs that cross a sequence's end through the masked register store), Nq != Nk, on every
schedule the kernel runs packed (one, two and three consumers, ping-pong, the lazy
rescale, early hand-backs, masked tiles first, Q in registers) and every mask (causal,
windows, bottom-right alignment, softcap), GQA, fp16 and bf16, head dims 64, 128, 256
and two padded ones. Outputs are poisoned and must be written in full; rows that see no
key are zero with a log-sum-exp of -inf. A packed batch of equal lengths matches the
dense kernel on the same config to the bit.
"""

import pytest
import torch

import flashscope
from flashscope import varlen
from flashscope.families.sm90_fwd import Sm90FwdConfig
from flashscope.masks import Mask
from flashscope.testing.inputs import fresh_seed
from flashscope.testing.reference import ERROR_BOUND

from .test_gluon import _needs_sm90, _tile_id
from .test_gluon_masked import _config, _head_dim
from .test_varlen import check, packed_batch, poisoned, reference  # noqa: F401

#: (query lengths, key lengths)
LENGTHS = [((5, 0, 200, 1, 64, 129, 65), (7, 3, 130, 0, 64, 129, 300)),
           ((127, 128, 191, 192, 193), (127, 128, 191, 192, 193))]
#: packed-compatible schedules: (BLOCK_M, BLOCK_N, stages, flags of test_gluon._flags)
TILES = [(128, 128, 2, "lhkfiq"), (128, 128, 2, ""), (192, 128, 3, "xlhkfi"),
         (128, 64, 2, "xl"), (64, 64, 3, "hq")]
MASKS = [  # (is_causal, window, align, softcap)
    (False, None, "top_left", None),
    (True, None, "top_left", None),
    (True, None, "bottom_right", None),
    (False, (40, 10), "top_left", None),
    (True, (70, None), "bottom_right", 5.0),
]


def _run(device, lengths, cfg, D, H, Hkv, dtype, mask):
    seed = fresh_seed()
    lq, lk = lengths
    q, k, v, cu_q, cu_k = packed_batch(device, lq, lk, H=H, Hkv=Hkv, D=D, dtype=dtype,
                                       scale_inputs=4.0 if mask["softcap"] else 1.0)
    out, lse = flashscope.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                           return_lse=True, config=cfg, **mask)
    ref_out, ref_lse, *_ = reference(q, k, v, cu_q, cu_k, **mask)
    check(f"out (seed {seed})", out, ref_out, ERROR_BOUND[dtype])
    got = lse.double().cpu()
    assert not torch.isnan(got).any(), f"lse unwritten (seed {seed})"
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref_lse)), f"-inf rows ({seed})"
    finite = torch.isfinite(ref_lse)
    assert (got - ref_lse)[finite].abs().max() < 2e-3, f"lse (seed {seed})"


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window,align,softcap", MASKS)
@pytest.mark.parametrize("tiles", TILES, ids=_tile_id)
@pytest.mark.parametrize("lengths", LENGTHS, ids=["ragged", "tile-edges"])
def test_packed_matches_float64_per_sequence(device, poisoned, lengths, tiles, causal,
                                             window, align, softcap):
    _needs_sm90(device)
    cfg = _config(tiles)
    banded = window is not None or align == "bottom_right"
    if banded:  # a band runs its masked tiles in place
        cfg = cfg.replace(MASKED_FIRST=False)
    i = TILES.index(tiles) + MASKS.index((causal, window, align, softcap))
    D = _head_dim(cfg, (128, 64, 80)[i % 3])
    dtype = (torch.bfloat16, torch.float16)[i % 2]
    _run(device, lengths, cfg, D, 4, (4, 2, 1)[i % 3], dtype,
         dict(is_causal=causal, window=window, align=align, softcap=softcap))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_default_config_runs_sm90(device, poisoned, causal, D, dtype):
    _needs_sm90(device)
    lq = (300, 1, 0, 1000, 77)
    lk = (300, 5, 9, 1000, 0)
    q, k, v, cu_q, cu_k = packed_batch(device, lq, lk, H=8, Hkv=2, D=D, dtype=dtype)
    mask = Mask.of(causal)
    packed = varlen._packed(cu_q, cu_k, max(lq), max(lk))
    cfg = varlen._default_config(q, k, v, mask, packed, D ** -0.5)
    assert isinstance(cfg, Sm90FwdConfig) and not cfg.BALANCE and not cfg.SPLIT_KV
    _run(device, (lq, lk), None, D, 8, 2, dtype,
         dict(is_causal=causal, window=None, align="top_left", softcap=None))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_equal_lengths_match_the_dense_kernel_to_the_bit(device, causal):
    _needs_sm90(device)
    fresh_seed()
    B, N, H, D = 3, 333, 4, 128
    cfg = Sm90FwdConfig(BALANCE=False)
    q, k, v, cu_q, cu_k = packed_batch(device, (N,) * B, (N,) * B, H=H, Hkv=H, D=D,
                                       dtype=torch.bfloat16)
    got = flashscope.attention_varlen(q, k, v, cu_q, cu_k, N, N, is_causal=causal,
                                      config=cfg)
    dense = flashscope.attention(*(t.view(B, N, H, D).transpose(1, 2) for t in (q, k, v)),
                                 is_causal=causal, config=cfg)
    assert torch.equal(got, dense.transpose(1, 2).reshape(B * N, H, D))
