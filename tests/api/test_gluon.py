"""sm90-fwd: the Hopper forward written in Gluon (TMA producer warp, one consumer warpgroup
per 64 rows, softmax overlapped with the P V wgmma).

Offline (any machine): its config rules (what its binaries must contain is
``test_gluon_sass.py``'s). On an sm_90 GPU: odd shapes (partial
tiles, Nq != Nk, GQA, strided (B, N, H, D) views, causal or not, fp16 and bf16) against
the float64 reference, with the output poisoned before the run; and a NaN planted in
another head's rows, which TMA's per-head bounds must keep out.
"""

import pytest
import torch

from flashscope import launch
from flashscope.errors import ConfigError
from flashscope.families import Problem, sm90_fwd
from flashscope.families.sm90_fwd import Sm90FwdConfig
from flashscope.masks import Mask
from flashscope.testing.inputs import make_qkv
from flashscope.tuned import load_tuned, lookup

from .test_forward import check_case, run_case

#: every switch off: the kernel's plain schedule, which the flags of :func:`_flags` extend
BARE = Sm90FwdConfig(BLOCK_M=128, BLOCK_N=128, num_stages=2, Q_IN_REGS=False,
                     LAZY_RESCALE=False, EARLY_Q=False, K_EARLY=False, MASKED_FIRST=False,
                     OUT_RCP=False)
G = BARE


def test_label_and_round_trip():
    assert G.label == "sm90-fwd 128x128 s2"
    assert Sm90FwdConfig.from_dict(G.diff()) == G
    assert Sm90FwdConfig.parse("Q_IN_REGS=0,LAZY_RESCALE=0,EARLY_Q=0,K_EARLY=0,"
                               "MASKED_FIRST=0,OUT_RCP=0") == G
    assert sm90_fwd.check(G, "sm90", 128) is G


@pytest.mark.parametrize("change,target,D,match", [
    ({}, "sm80", 128, "not sm_90"),
    ({}, "gfx942", 64, "not sm_90"),
    ({}, "sm90", 32, "head dims 33..256"),
    ({}, "sm90", 257, "head dim"),
    ({"BLOCK_M": 32}, "sm90", 64, "BLOCK_M=32: expected 64 or 128 or 192"),
    ({"BLOCK_M": 256}, "sm90", 64, "BLOCK_M=256: expected 64 or 128 or 192"),
    ({"BLOCK_N": 32}, "sm90", 64, "BLOCK_N=32: expected 64 or 128"),
    ({"num_stages": 1}, "sm90", 64, "num_stages=1: expected 2 or 3 or 4"),
    ({"num_stages": 4}, "sm90", 128, "shared memory"),  # 32 + 4 x 64 KB > 227 KB
    ({"num_stages": 3, "EARLY_Q": True}, "sm90", 128, "shared memory"),  # 2 x 32 + 192 KB
    ({"BLOCK_M": 64, "PINGPONG": True}, "sm90", 64, "PINGPONG=1 needs two or three"),
])
def test_config_rules(change, target, D, match):
    with pytest.raises(ConfigError, match=match):
        sm90_fwd.check(G.replace(**change), target, D)


def test_cpu_tensors_are_refused():
    q = torch.zeros(1, 1, 64, 64, dtype=torch.float16)
    with pytest.raises(ConfigError, match="sm_90 GPU only"):
        launch.forward(q, q, q, mask=Mask(), scale=0.125, cfg=G.replace(BLOCK_M=64),
                       return_lse=False)


@pytest.mark.parametrize("knob", sm90_fwd.BAND_KNOBS)
def test_band_refuses_the_causal_orderings_by_name(knob):
    """Windows and bottom-right alignment run; the switches that order or price key tiles
    for causal rows are refused for them, naming the knob; packed batches are taken."""
    q = torch.empty(1, 1, 64, 64, dtype=torch.float16, device="meta")
    k = torch.empty(1, 1, 100, 64, dtype=torch.float16, device="meta")
    band = G.replace(PINGPONG=False)
    sm90_fwd.call(q, q, q, q, None, mask=Mask.of(True, (16, 0)), scale=0.125, cfg=band)
    with pytest.raises(ConfigError, match=f"{knob}=1 orders"):
        sm90_fwd.call(q, k, k, q, None, mask=Mask.of(True, None, "bottom_right"),
                      scale=0.125, cfg=band.replace(**{knob: True}))
    sm90_fwd.call(q, q, q, q, None, mask=Mask.of(True, None, "bottom_right", 30.0),
                  scale=0.125, cfg=band.replace(**{knob: True}))  # Nq = Nk: no band
    assert sm90_fwd.accepts(Problem("sm90", head_dim=64, window=True, softcap=True)) is None
    assert sm90_fwd.accepts(Problem("sm90", head_dim=64, varlen=True)) is None
    packed = sm90_fwd.select(Problem("sm90", head_dim=64, causal=True, varlen=True))
    assert not any(getattr(packed, k) for k in sm90_fwd.PACKED_KNOBS)
    cfg = sm90_fwd.select(Problem("sm90", head_dim=64, causal=True, window=True))
    assert not any(getattr(cfg, k) for k in sm90_fwd.BAND_KNOBS)


def _needs_sm90(device):
    if device != "cuda":
        pytest.skip("Gluon kernels run on an sm_90 GPU only")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")


_FLAGS = {"x": "PINGPONG", "l": "LAZY_RESCALE", "h": "EARLY_Q", "k": "K_EARLY",
          "f": "MASKED_FIRST", "i": "OUT_RCP", "q": "Q_IN_REGS", "b": "BALANCE",
          "v": "SPLIT_KV"}


def _flags(flags: str) -> dict:
    """x PINGPONG, l LAZY_RESCALE, h EARLY_Q, k K_EARLY, f MASKED_FIRST, i OUT_RCP,
    q Q_IN_REGS, b BALANCE, v SPLIT_KV: the switches on top of :data:`BARE`."""
    return {knob: c in flags for c, knob in _FLAGS.items()}


def _tile_id(tiles) -> str:
    """(BLOCK_M, BLOCK_N, stages, flags) -> ``m128n64s2xl``."""
    return "m{}n{}s{}{}".format(*tiles)


SHAPES = [(77, 101, 2, 64), (130, 70, 4, 128), (1, 33, 1, 64), (200, 200, 2, 128),
          (257, 513, 1, 64), (64, 1, 4, 128), (150, 300, 2, 80), (77, 200, 4, 96),
          (130, 257, 2, 40)]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,Hkv,D", SHAPES)
@pytest.mark.parametrize("tiles", [(128, 128, 2, ""), (64, 64, 3, ""), (128, 64, 4, ""),
                                   (192, 64, 3, ""), (128, 128, 3, "x"), (192, 64, 2, "x"),
                                   (192, 128, 3, "l"), (128, 128, 3, "xl"), (128, 64, 2, "l"),
                                   (128, 128, 2, "xlhk"), (64, 64, 3, "h"), (128, 64, 2, "k"),
                                   (192, 128, 3, "xlhkf"), (128, 64, 2, "f"),
                                   (64, 64, 3, "hf"), (128, 128, 2, "hki"),
                                   (192, 128, 3, "xlhkfi"), (128, 128, 3, "xlq"),
                                   (128, 128, 2, "lhkiq"), (64, 64, 3, "hfq"),
                                   (128, 128, 2, "lhkfiq")],
                         ids=_tile_id)
def test_matches_float64_reference(device, tiles, causal, Nq, Nk, Hkv, D):
    """The tiles' last field: the flags of :func:`_flags`. A
    tile too large for the head dim (192 x 128 with 3 stages needs 240 KB at D = 128) is
    refused by the config check before any launch, and skipped here."""
    _needs_sm90(device)
    bm, bn, st, flags = tiles
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=bn, num_stages=st, **_flags(flags))
    try:
        sm90_fwd.check(cfg, "sm90", D)
    except ConfigError as e:
        assert "shared memory" in str(e), e
        pytest.skip(str(e))
    dtype = torch.bfloat16 if (Nq + Nk) % 2 else torch.float16
    run_case(device, B=2, H=4, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal, dtype=dtype,
             bnhd=Nq % 2 == 0, cfg=cfg, with_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 3, 7])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles", [(128, 128, 3, ""), (192, 64, 2, ""), (128, 64, 2, "x"),
                                   (192, 128, 2, "x"), (192, 128, 2, "l"),
                                   (128, 128, 2, "xlhk"), (192, 128, 2, "xhk"),
                                   (128, 64, 3, "h"), (128, 128, 3, "k"),
                                   (192, 128, 2, "xlhkf"), (128, 128, 2, "hf"),
                                   (128, 128, 2, "xlhkq"), (128, 64, 3, "q"),
                                   (192, 128, 2, "xb"), (192, 128, 2, "xhib"),
                                   (192, 128, 2, "xlhkfb"), (192, 128, 2, "xv"),
                                   (192, 128, 2, "xlhkfv"), (128, 128, 2, "xlhkqv"),
                                   (128, 64, 3, "hfiv"), (128, 128, 2, "lhkfiqv")],
                         ids=_tile_id)
def test_persistent_programs_loop_over_tiles(device, monkeypatch, programs, causal, tiles):
    """A grid of 1, 3 or 7 programs over 2 x 4 x cdiv(Nq, BLOCK_M) work tiles: the ring,
    Q-slot and turn (PINGPONG, x in the tiles' flags) barrier phases carry across work
    tiles of different lengths; causal grids (and non-causal ones with BALANCE, b, or
    SPLIT_KV, v, whose lists also cut blocks along the keys) run the host's list,
    whose last round is partial for 3 and 7 programs. Nq = 200 and 300
    leave two and one consumers of a 192-row block with padding rows only, which pass
    their key tiles with the list."""
    _needs_sm90(device)
    monkeypatch.setattr(launch, "sm_count", lambda dev: programs)
    bm, bn, st, flags = tiles
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=bn, num_stages=st, **_flags(flags))
    for Nq, Nk, Hkv, D in [(300, 333, 2, 128), (513, 257, 4, 64), (200, 450, 2, 64)]:
        try:
            sm90_fwd.check(cfg, "sm90", D)
        except ConfigError as e:  # the tile is too large for this head dim
            assert "shared memory" in str(e), e
            continue
        run_case(device, B=2, H=4, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal,
                 dtype=torch.bfloat16, bnhd=False, cfg=cfg, with_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D,tiles", [(64, (192, 128, 3, "l")), (128, (128, 128, 3, "xl")),
                                     (64, (128, 64, 2, "l")), (128, (64, 64, 3, "l"))],
                         ids=lambda t: t if isinstance(t, int) else "m{}n{}s{}{}".format(*t))
def test_lazy_rescale_follows_rising_scores(device, causal, D, tiles):
    """LAZY_RESCALE where it must rescale: key norms grow 12-fold along the sequence and
    queries are tripled, so each row's maximum climbs by tens (base 2) over several key
    tiles, by different amounts in the rows of one warp. A warp that skipped the rescale
    of a row whose maximum moved would scale that row's earlier tiles wrongly; a row
    whose exponentials ran against a stale maximum beyond the threshold would overflow."""
    _needs_sm90(device)
    bm, bn, st, flags = tiles
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=bn, num_stages=st, **_flags(flags))
    B, H, Hkv, Nq, Nk = 2, 4, 2, 300, 1000
    q, k, v = make_qkv(device, B, H, Nq, Nk, D, Hkv=Hkv, dtype=torch.bfloat16, bnhd=False)
    q = q * 3
    k = (k * torch.linspace(0.5, 6.0, Nk, device=device)[:, None]).to(k.dtype)
    check_case(q, k, v, causal=causal, cfg=cfg, with_lse=True,
               tag=f"rising scores D={D} causal={causal} {cfg.label}")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("programs", [None, 7])
def test_divisors_that_are_not_powers_of_two(device, monkeypatch, programs, causal):
    """The kernel divides each work-tile index by the row blocks per head, the heads and
    the query heads per key head, with multipliers from the host
    (:func:`flashscope.launch.divider`); every test shape above has powers of two there.
    Here 6 row blocks (Nq = 700), H = 6 and a group of 3 (Hkv = 2), on all SMs and on 7
    programs."""
    _needs_sm90(device)
    if programs:
        monkeypatch.setattr(launch, "sm_count", lambda dev: programs)
    cfg = G.replace(BLOCK_M=128, BLOCK_N=128, num_stages=2, **_flags("xlhk"))
    run_case(device, B=3, H=6, Hkv=2, Nq=700, Nk=650, D=64, causal=causal,
             dtype=torch.bfloat16, bnhd=False, cfg=cfg, with_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [40, 80, 96, 192, 256])
def test_padded_and_wide_head_dims_take_the_rule(device, causal, dtype, D):
    """Head dims that are not 64 or 128 run the kernel with the rule's config: 40, 80 and
    96 as a power of two and a tail (two sets of descriptors, two accumulators), 192 as
    128 + 64, 256 whole; TMA fills the columns past D with zeros and clips them on the
    store. Shapes with partial tiles, GQA, Nq != Nk and a (B, N, H, D) view."""
    _needs_sm90(device)
    cfg = sm90_fwd.select(Problem("sm90", str(dtype)[6:], D, causal, 333, 500))
    run_case(device, B=2, H=4, Hkv=2, Nq=333, Nk=500, D=D, causal=causal, dtype=dtype,
             bnhd=True, cfg=cfg, with_lse=True)


# lengths inside each class of the tuned file, none a tile multiple
_CLASS_SHAPES = {"le1k": (1000, 777), "le4k": (2049, 3001), "le16k": (4500, 9001)}


@pytest.mark.gpu
@pytest.mark.parametrize("entry", sorted(load_tuned("sm90")), ids=lambda e: "-".join(map(str, e)))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_shipped_sm90_entries_match_reference(device, entry, dtype):
    """Each entry of the shipped sm90 tuned file, in both 16-bit dtypes (an entry serves
    its twin dtype too), taken for a problem in its key-length class (Nq != Nk, GQA),
    against the float64 reference with the output poisoned: the defaults that the
    benchmarks time are the ones tested."""
    _needs_sm90(device)
    kernel, _, D, causal, cls = entry
    Nq, Nk = _CLASS_SHAPES[cls]
    cfg, tuned, _ = lookup(Problem("sm90", dtype, D, causal, Nq, Nk), kernel)
    assert tuned and cfg == load_tuned("sm90")[entry][0]
    B, H = (2, 4) if cls == "le1k" else (1, 2)
    run_case(device, B=B, H=H, Hkv=H // 2, Nq=Nq, Nk=Nk, D=D, causal=causal,
             dtype=getattr(torch, dtype), bnhd=False, cfg=cfg, with_lse=True)


@pytest.mark.gpu
def test_no_leak_from_next_head(device):
    """K and V of head 1 hold NaN; head 0's last key tile is partial (Nk = 70 < 128), so a
    2-D view would read head 1's rows into it."""
    _needs_sm90(device)
    q, k, v = (torch.randn(1, 2, 70, 64, device="cuda", dtype=torch.float16)
               for _ in range(3))
    k[:, 1], v[:, 1] = float("nan"), float("nan")
    out, _ = launch.forward(q, k, v, mask=Mask(), scale=0.125, cfg=G, return_lse=False)
    ref = torch.softmax(q[:, :1].double() @ k[:, :1].double().transpose(-1, -2) * 0.125, -1)
    ref = ref @ v[:, :1].double()
    assert not torch.isnan(out[:, 0]).any()
    assert (out[:, :1].double() - ref).abs().max().item() < 1e-2


@pytest.mark.gpu
def test_misaligned_view_is_refused(device):
    _needs_sm90(device)
    base = torch.randn(1, 2, 64, 72, device="cuda", dtype=torch.float16)
    q = base[..., 4:68]  # a 64-wide view at an 8-byte offset
    with pytest.raises(ConfigError, match="query: sm90-fwd needs a 16-byte aligned"):
        launch.forward(q, q, q, mask=Mask(), scale=0.125, cfg=G, return_lse=False)
