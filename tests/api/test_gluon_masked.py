"""sm90-fwd with sliding windows, bottom-right alignment and logit caps, against the
float64 reference (sm_90 GPU only; what runs offline is in ``test_gluon.py``).

Every combination the mask takes: windows one- and two-sided, wider than the sequence,
zero-wide (each row sees its own key), causal or not, top-left and bottom-right alignment
with Nq != Nk both ways (bottom-right with Nq > Nk leaves the first rows without a key:
zeros and a log-sum-exp of -inf), softcap, GQA, fp16 and bf16, head dims 64, 128 and a
padded one, on the band-compatible schedules (:data:`flashscope.families.sm90_fwd.
BAND_KNOBS` off; the narrow bands' 64-key tiles among them) with and without ping-pong,
the lazy rescale, early hand-backs, the output reciprocal and Q in registers, on full and
1/3/7-program grids. Outputs are poisoned before each run and must be written in full.
"""

import pytest
import torch

import flashscope
from flashscope import launch
from flashscope.families import Problem, sm90_fwd
from flashscope.families.sm90_fwd import Sm90FwdConfig
from flashscope.testing.inputs import fresh_seed, make_qkv
from flashscope.testing.reference import ERROR_BOUND, reference_attention, rel_error

from .test_forward import run_case
from .test_gluon import BARE, _flags, _needs_sm90, _tile_id

#: (causal, window): one- and two-sided, wider than any N here, zero-wide, right only
WINDOWS = [(True, (100, None)), (True, (5000, None)), (False, (300, 40)), (False, (0, 0)),
           (False, (None, 77)), (False, (200, None)), (True, (0, None)), (False, (5, 3))]
#: (Nq, Nk, Hkv, D)
SHAPES = [(333, 500, 2, 128), (500, 333, 4, 64), (1, 257, 2, 64), (700, 700, 1, 128),
          (130, 70, 2, 96)]
#: band-compatible schedules: (BLOCK_M, BLOCK_N, stages, flags of test_gluon._flags)
TILES = [(128, 128, 2, ""), (128, 128, 2, "lhkiq"), (192, 128, 3, "xlhki"),
         (128, 64, 2, "xl"), (64, 64, 3, "hq"), (192, 64, 4, "xlhki"), (128, 64, 4, "lhkiq")]


def _config(tiles) -> Sm90FwdConfig:
    bm, bn, st, flags = tiles
    return BARE.replace(BLOCK_M=bm, BLOCK_N=bn, num_stages=st, **_flags(flags))


def _head_dim(cfg, want: int = 128) -> int:
    """``want``, or 64 where the rules refuse the tile at ``want`` (the three-stage
    192-row tile holds too much shared memory at D = 128)."""
    try:
        sm90_fwd.check(cfg, "sm90", want)
        return want
    except Exception:
        sm90_fwd.check(cfg, "sm90", 64)
        return 64


@pytest.mark.gpu
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("causal,window", WINDOWS)
@pytest.mark.parametrize("Nq,Nk,Hkv,D", SHAPES)
def test_windows_match_float64_reference(device, align, causal, window, Nq, Nk, Hkv, D):
    _needs_sm90(device)
    i = WINDOWS.index((causal, window)) + SHAPES.index((Nq, Nk, Hkv, D))
    tiles = TILES[i % len(TILES)]
    cfg = _config(tiles)
    try:
        sm90_fwd.check(cfg, "sm90", D)
    except Exception as e:  # a tile too large for the head dim
        pytest.skip(str(e))
    run_case(device, B=2, H=4, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal,
             dtype=torch.bfloat16 if i % 2 else torch.float16, bnhd=bool(i % 3 == 0),
             cfg=cfg, with_lse=True, window=window, align=align)


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", TILES, ids=_tile_id)
@pytest.mark.parametrize("causal,window,align", [(False, None, "top_left"),
                                                 (True, None, "top_left"),
                                                 (True, (256, None), "bottom_right"),
                                                 (False, (64, 64), "top_left")])
@pytest.mark.parametrize("cap", [2.0, 50.0])
def test_softcap_matches_float64_reference(device, tiles, causal, window, align, cap):
    """Inputs x4 so the cap bites (c = 2 changes every row), alone and with a band."""
    _needs_sm90(device)
    cfg = _config(tiles)
    fresh_seed()
    q, k, v = make_qkv(device, 2, 4, 333, 450, _head_dim(cfg), Hkv=2, dtype=torch.bfloat16,
                       scale_inputs=4.0)
    from .test_forward import check_case

    check_case(q, k, v, causal=causal, cfg=cfg, with_lse=True, window=window, align=align,
               softcap=cap, tag=f"softcap {cap} {window} {align} {cfg.label}")


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 3, 7])
@pytest.mark.parametrize("tiles", TILES[:3], ids=_tile_id)
def test_band_on_persistent_programs(device, monkeypatch, programs, tiles):
    """A band's work tiles have different first key tiles and counts (one for a block
    that sees nothing); the ring's and turns' phases must carry across them on programs
    that loop over many."""
    _needs_sm90(device)
    monkeypatch.setattr(launch, "sm_count", lambda dev: programs)
    cfg = _config(tiles)
    for Nq, Nk, window, align in [(600, 300, (90, 0), "bottom_right"),
                                  (300, 900, (200, 30), "bottom_right"),
                                  (513, 513, (0, 0), "top_left")]:
        run_case(device, B=2, H=4, Hkv=2, Nq=Nq, Nk=Nk, D=_head_dim(cfg),
                 causal=window[1] == 0, dtype=torch.bfloat16, bnhd=False, cfg=cfg,
                 with_lse=True, window=window, align=align)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_default_path_takes_the_hopper_kernel_for_windows(device, dtype, D):
    """flashscope.attention with a window and a cap on an sm_90 GPU runs sm90-fwd with its
    band rule (the tuned entries hold no windows; a band of 300 keys is narrow at both head
    dims) and matches the reference."""
    _needs_sm90(device)
    from flashscope.api import _default_config
    from flashscope.masks import Mask

    fresh_seed()
    q, k, v = make_qkv(device, 1, 8, 1000, 1500, D, Hkv=2, dtype=dtype)
    mask = Mask.of(True, (300, None), "bottom_right", 30.0)
    cfg = _default_config(q, k, v, mask, D ** -0.5)
    assert cfg.KERNEL == "sm90-fwd" and not any(getattr(cfg, k) for k in
                                                sm90_fwd.BAND_KNOBS), cfg.label
    problem = Problem("sm90", str(dtype)[6:], D, True, 1000, 1500, 8, window=True,
                      softcap=True, band_keys=300)
    assert cfg == sm90_fwd.fit(sm90_fwd.select(problem), problem)
    out = flashscope.attention(q, k, v, is_causal=True, window=(300, None),
                               align="bottom_right", softcap=30.0, enable_gqa=True)
    ref = reference_attention(q, k, v, is_causal=True, window=(300, None),
                              align="bottom_right", softcap=30.0)
    assert rel_error(out, ref) <= ERROR_BOUND[dtype]
