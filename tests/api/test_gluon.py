"""GLUON: the Hopper forward written in Gluon (TMA producer warp, one consumer warpgroup
per 64 rows, softmax overlapped with the P V wgmma).

Offline (any machine): its config rules, and what the sm_90 binary must contain (wgmma,
TMA loads and store, setmaxnreg budgets, no spills). On an sm_90 GPU: odd shapes (partial
tiles, Nq != Nk, GQA, strided (B, N, H, D) views, causal or not, fp16 and bf16) against
the float64 reference, with the output poisoned before the run; and a NaN planted in
another head's rows, which TMA's per-head bounds must keep out.
"""

import os

import pytest
import torch

from flashscope import AttentionConfig, compile as fcompile, launch
from flashscope.config import check_config
from flashscope.errors import ConfigError
from flashscope.isa.read import records_for

from flashscope.testing.inputs import make_qkv
from flashscope.tuned import load_tuned, lookup

from .test_forward import check_case, run_case

G = AttentionConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, Q_IN_REGS=False,
                    TMA=True, GLUON=True)

#: offline test name -> its parameters -> {variant: (config, build keywords)}: the sm_90
#: builds the test compiles, which :func:`_prebuilt` compiles ahead for all of them at once
BUILDS = {}


def _builds_of(test_name):
    def register(fn):
        BUILDS[test_name] = fn
        return fn
    return register


def _build(spec):
    cfg, kw = spec
    return fcompile.build(cfg, "sm90", **kw)


@pytest.fixture(scope="module", autouse=True)
def _prebuilt(request):
    """The selected offline tests' builds, compiled before any of them runs by one pool of
    worker processes (one per core) into the session's cache, where the tests' own builds
    then find them. Otherwise a process running the interpreter starts a clean compiler
    process for every build, one after the other (imports included, 9.5 min for this
    module on 2 cores against 3 min). A build that fails here fails again, with its
    message, in its test. Under pytest-xdist the workers compile side by side: nothing
    to do."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    specs = {}
    for item in request.session.items:
        fn = BUILDS.get(getattr(item, "originalname", None))
        if item.module is request.module and fn is not None:
            for cfg, kw in fn(**item.callspec.params).values():
                specs[(cfg, tuple(sorted(kw.items())))] = (cfg, "sm90", kw)
    if len(specs) > 1:
        fcompile.run_clean(fcompile._build_task, list(specs.values()), jobs=os.cpu_count() or 1)


def test_key_and_round_trip():
    assert G.key == "m128n128w4s2q0tg"
    assert AttentionConfig.from_dict(G.as_dict()) == G
    assert AttentionConfig.parse("BLOCK_N=128,num_warps=4,num_stages=2,Q_IN_REGS=0,TMA=1,"
                                 "GLUON=1") == G
    assert check_config(G, "sm90", 128) is G


@pytest.mark.parametrize("change,target,D,match", [
    ({}, "sm80", 128, "not sm_90"),
    ({}, "gfx942", 64, "not sm_90"),
    ({}, "sm90", 96, "head dim 64 or 128"),
    ({"BLOCK_M": 32}, "sm90", 64, "BLOCK_M=64 or 128 or 192"),
    ({"BLOCK_M": 256}, "sm90", 64, "BLOCK_M=64 or 128 or 192"),
    ({"BLOCK_N": 32}, "sm90", 64, "BLOCK_N=64 or 128"),
    ({"num_warps": 8}, "sm90", 64, "num_warps=4"),
    ({"num_stages": 1}, "sm90", 64, "num_stages=2 or 3 or 4"),
    ({"TMA": False}, "sm90", 64, "TMA=1"),
    ({"maxnreg": 128}, "sm90", 64, "maxnreg=None"),
    ({"EXP2_POLY": 3}, "sm90", 64, "one of 2, 4, 8"),
    ({"num_stages": 4}, "sm90", 128, "shared memory"),  # 32 + 4 x 64 KB > 227 KB
    ({"num_stages": 3, "EARLY_Q": True}, "sm90", 128, "shared memory"),  # 2 x 32 + 192 KB
    ({"BLOCK_M": 64, "PINGPONG": True}, "sm90", 64, "PINGPONG=1 needs two or three"),
    ({"OVERLAP": 3}, "sm90", 128, "OVERLAP=3: expected one of 0, 1, 2"),
    ({"BALANCE": True}, "sm90", 64, "BALANCE=1 .* needs PERSISTENT=1"),
])
def test_config_rules(change, target, D, match):
    with pytest.raises(ConfigError, match=match):
        check_config(G.replace(**change), target, D)


def test_overlap_key():
    assert G.replace(OVERLAP=True).key == "m128n128w4s2q0tog"
    assert check_config(G.replace(OVERLAP=True, PINGPONG=True), "sm90", 64).OVERLAP
    assert G.replace(OVERLAP=2).key == "m128n128w4s2q0to2g"


@pytest.mark.parametrize("text,level", [("OVERLAP=1", 1), ("OVERLAP=true", 1),
                                        ("OVERLAP=off", 0), ("OVERLAP=2", 2)])
def test_overlap_levels_parse(text, level):
    """OVERLAP has levels (0, 1, 2) but still takes the switch spellings it had."""
    assert AttentionConfig.parse(text, base=G).OVERLAP == level


def test_overlap_max_needs_gluon():
    with pytest.raises(ConfigError, match="OVERLAP=2: expected one of 0, 1; 2 needs GLUON=1"):
        check_config(AttentionConfig(OVERLAP=2), "sm90", 64)


@pytest.mark.parametrize("knob,suffix", [("PERSISTENT", "p"), ("PINGPONG", "x"),
                                         ("LAZY_RESCALE", "l"), ("EARLY_Q", "h"),
                                         ("K_EARLY", "k"), ("MASKED_FIRST", "f"),
                                         ("OUT_RCP", "i"), ("BALANCE", "b"),
                                         ("JOINT_KV", "j"), ("SPLIT_KV", "v"),
                                         ("LEAN_RELEASE", "r")])
def test_gluon_only_knobs(knob, suffix):
    assert G.replace(**{knob: True}).key == "m128n128w4s2q0tg" + suffix
    with pytest.raises(ConfigError, match=f"{knob}=1 .* needs GLUON=1"):
        check_config(AttentionConfig(**{knob: True}), "sm90", 64)


def test_cpu_tensors_are_refused():
    q = torch.zeros(1, 1, 64, 64, dtype=torch.float16)
    with pytest.raises(ConfigError, match="sm_90 GPU only"):
        launch.forward(q, q, q, causal=False, scale=0.125, cfg=G.replace(BLOCK_M=64),
                       return_lse=False)


@_builds_of("test_sm90_binary")
def _binary_builds(D, causal, bm, bn, knobs):
    return {None: (G.replace(BLOCK_M=bm, BLOCK_N=bn, **knobs),
                   dict(head_dim=D, causal=causal, return_lse=True))}


@pytest.mark.parametrize("D,causal,bm,bn,knobs", [
    (64, False, 128, 128, {}), (128, True, 128, 128, {}), (64, False, 192, 128, {}),
    (128, True, 192, 64, {}), (128, False, 128, 128, {"PINGPONG": True}),
    (128, True, 128, 128, {"PINGPONG": True, "PERSISTENT": True}),
    (64, True, 192, 64, {"PINGPONG": True}),
    (64, False, 192, 128, {"OVERLAP": True, "num_stages": 3, "PERSISTENT": True}),
    (64, False, 128, 128, {"OVERLAP": True, "num_stages": 3}),
    (128, False, 128, 128, {"OVERLAP": True, "num_stages": 3, "PINGPONG": True}),
    (64, True, 128, 128, {"EARLY_Q": True, "num_stages": 3, "PERSISTENT": True}),
    (128, True, 128, 128, {"EARLY_Q": True, "PINGPONG": True, "PERSISTENT": True}),
    (64, False, 192, 128, {"OVERLAP": 2, "num_stages": 3, "PERSISTENT": True,
                           "PINGPONG": True, "BALANCE": True}),
    (64, False, 192, 128, {"OVERLAP": 2, "num_stages": 3, "PERSISTENT": True,
                           "PINGPONG": True, "SPLIT_KV": True}),
    (128, True, 128, 128, {"OVERLAP": 2, "Q_IN_REGS": True, "LAZY_RESCALE": True,
                           "EARLY_Q": True, "K_EARLY": True, "MASKED_FIRST": True,
                           "PERSISTENT": True, "SPLIT_KV": True})])
def test_sm90_binary(D, causal, bm, bn, knobs):
    """What the schedule needs, read from the cubin: 64 x N wgmma, 4-D TMA loads and the
    TMA store, setmaxnreg moving registers between partitions, one warpgroup per 64 rows
    plus the producer's, no spills (D = 64 at 192 x 128 with OVERLAP spilled 38 registers
    while consumer 0 sat in the default partition), and no PRMT: P reaches the P V wgmma
    packed as its A operand wants it (32 swaps per tile when ptxas packs it)."""
    art = _build(_binary_builds(D, causal, bm, bn, knobs)[None])
    assert art.metadata["num_warps"] == 4 * (bm // 64 + 1)
    (rec,) = records_for([art])
    mix = rec.opcodes
    assert mix.get("HGMMA", 0) > 0 and mix.get("UTMALDG", 0) > 0 and mix.get("UTMASTG", 0) > 0
    assert mix.get("USETMAXREG", 0) > 0
    assert rec.spill_stores == 0 and rec.spill_loads == 0
    assert mix.get("PRMT", 0) == 0, mix.get("PRMT")
    assert rec.dynamic_shared_bytes >= (bm + 2 * 2 * bn) * D * 2


@_builds_of("test_shared_bound_is_within_the_barriers_of_the_binary")
def _bound_builds(D, bm, bn, knobs):
    return {None: (G.replace(BLOCK_M=bm, BLOCK_N=bn, **knobs), dict(head_dim=D, causal=False))}


@pytest.mark.parametrize("D,bm,bn,knobs", [
    (64, 192, 128, {"num_stages": 3}), (64, 192, 128, {"num_stages": 3, "OVERLAP": 2}),
    (128, 128, 128, {"EARLY_Q": True, "OVERLAP": 1}),
    (128, 192, 64, {"num_stages": 3, "EARLY_Q": True, "OVERLAP": 2, "Q_IN_REGS": True}),
    (64, 64, 64, {}),
    (128, 128, 128, {"num_stages": 2, "K_EARLY": True, "LEAN_RELEASE": True})])
def test_shared_bound_is_within_the_barriers_of_the_binary(D, bm, bn, knobs):
    """The config check's bound for the Gluon kernel (Q, O with EARLY_Q, the K/V ring,
    with OVERLAP the 4 fp32 a row that _pin stores, with LEAN_RELEASE the 1 KB of static
    barriers) is what the binary allocates but its other mbarriers (8 bytes each) and
    their alignment: never more, within 1 KB. A bound lower than that lets configs
    through that fail only at launch."""
    from flashscope.config import min_shared_bytes

    spec = _bound_builds(D, bm, bn, knobs)[None]
    cfg = spec[0]
    (rec,) = records_for([_build(spec)])
    bound = min_shared_bytes(cfg, D)
    used = rec.static_shared_bytes + rec.dynamic_shared_bytes
    assert bound <= used < bound + 1024, (bound, used)


@_builds_of("test_exp2_poly_moves_exponentials_off_mufu")
def _poly_builds(bm, causal, poly):
    return {poly: (G.replace(BLOCK_M=bm, num_stages=3, PERSISTENT=True, EXP2_POLY=poly),
                   dict(head_dim=64, causal=causal, return_lse=True))}


@pytest.mark.parametrize("poly", [2, 4, 8])
@pytest.mark.parametrize("bm,causal", [(192, False), (128, True)])
def test_exp2_poly_moves_exponentials_off_mufu(bm, causal, poly):
    """EXP2_POLY=E: each consumer computes 64 exponentials per thread on the first key tile
    and 64 per loop iteration, plus 2 row rescale factors; one in E of the 128 leaves
    MUFU.EX2 for the FMA pipe (its rounding add, 3 FFMA, the exponent LEA), no spills
    in the non-causal loop."""
    from flashscope.isa.nvidia import disassemble

    art = _build(_poly_builds(bm, causal, poly)[poly])
    sass = disassemble(art.binary)
    consumers = bm // 64
    assert sass.count("MUFU.EX2") == consumers * (128 - 128 // poly + 2)
    if not causal:
        (rec,) = records_for([art])
        assert rec.spill_stores == 0


def _rescale_blocks(sass: str) -> list:
    """For each ``VOTE.ANY P, ..``: (the first branch on P after it, within 64
    instructions, or None; the FMULs in a row after that branch). ptxas hoists the vote
    among the exponentials; the branch stays after them."""
    ops = [line.split("*/", 1)[1].strip().rstrip(" ;").split(" ")
           for line in sass.splitlines() if line.strip().startswith("/*") and "*/" in line]
    blocks = []
    for i, op in enumerate(ops):
        if op[0] == "VOTE.ANY":
            pred = op[1].rstrip(",")
            b = next((j for j in range(i + 1, min(i + 65, len(ops)))
                      if ops[j][:2] == [f"@!{pred}", "BRA"]), None)
            n = 0
            while b is not None and b + 1 + n < len(ops) and ops[b + 1 + n][0] == "FMUL":
                n += 1
            blocks.append((b is not None, n))
    return blocks


@_builds_of("test_lazy_rescale_branches_over_the_rescale")
def _lazy_builds(D, bm, causal, knobs):
    cfg = G.replace(BLOCK_M=bm, num_stages=3, PERSISTENT=True, **knobs)
    return {lazy: (cfg.replace(LAZY_RESCALE=lazy), dict(head_dim=D, causal=causal,
                                                        return_lse=True))
            for lazy in (False, True)}


@pytest.mark.parametrize("D,bm,causal,knobs", [
    (64, 192, False, {}), (128, 128, False, {"OVERLAP": True, "PINGPONG": True}),
    (64, 128, True, {"OVERLAP": True})])
def test_lazy_rescale_branches_over_the_rescale(D, bm, causal, knobs):
    """LAZY_RESCALE=1: in each consumer's loop the D / 2 accumulator FMULs per thread of
    O *= alpha sit behind one warp vote and a uniform branch that jumps over them; without
    it there is no vote."""
    from flashscope.isa.nvidia import disassemble

    for lazy, spec in _lazy_builds(D, bm, causal, knobs).items():
        blocks = _rescale_blocks(disassemble(_build(spec).binary))
        if not lazy:
            assert blocks == []
            continue
        assert blocks == [(True, D // 2)] * (bm // 64), blocks


def _under_pv(sass: str, opcode: str) -> list:
    """How many ``opcode`` instructions sit between each score wait
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``: S_j ready, P_{j-1} V_{j-1} may still run) and the
    next full wait (``gsb0, 0x0``): one count per consumer loop."""
    counts, n = [], None
    for line in sass.splitlines():
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            n = 0
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line and n is not None:
            counts.append(n)
            n = None
        elif opcode in line and n is not None:
            n += 1
    return counts


@_builds_of("test_overlap_keeps_exponentials_under_pv")
def _overlap_builds(D, causal, knobs):
    cfg = G.replace(BLOCK_M=128, BLOCK_N=128, num_stages=3, **knobs)
    return {o: (cfg.replace(OVERLAP=o), dict(head_dim=D, causal=causal, return_lse=True))
            for o in (False, True)}


@pytest.mark.parametrize("D,causal,knobs", [
    (128, False, {}), (64, True, {"PINGPONG": True}),
    (128, True, {"PINGPONG": True, "PERSISTENT": True})])
def test_overlap_keeps_exponentials_under_pv(D, causal, knobs):
    """In every consumer's loop, OVERLAP=1 puts the tile's 64 exponentials per thread
    (64 x 128 scores over 128 threads, plus the row rescale factors) between the score
    wait and the P V wait; without it this ptxas (CUDA 12.8) hoists the P V wait above
    them all, so none run under the product."""
    from flashscope.isa.nvidia import disassemble

    counts = {}
    for overlap, spec in _overlap_builds(D, causal, knobs).items():
        counts[overlap] = _under_pv(disassemble(_build(spec).binary), "MUFU.EX2")
    assert len(counts[True]) == 2 and all(n >= 64 for n in counts[True]), counts
    assert counts[False] == [0, 0], counts


@_builds_of("test_overlap_max_keeps_only_the_row_max_under_pv")
def _overlap_max_builds(D, causal, knobs):
    cfg = G.replace(**{"BLOCK_M": 128, "BLOCK_N": 128, **knobs})
    return {level: (cfg.replace(OVERLAP=level), dict(head_dim=D, causal=causal,
                                                     return_lse=True))
            for level in (0, 2)}


@pytest.mark.parametrize("D,causal,knobs", [
    (128, False, {"EARLY_Q": True, "K_EARLY": True, "LAZY_RESCALE": True}),
    (128, True, {"PINGPONG": True, "PERSISTENT": True}),
    (64, False, {"BLOCK_M": 192, "num_stages": 3, "PINGPONG": True})])
def test_overlap_max_keeps_only_the_row_max_under_pv(D, causal, knobs):
    """OVERLAP=2 pins the row maxima, not the sums: in every consumer's loop the row
    maximum's FMNMX (at least one per score a thread holds, 64 of the 64 x 128 tile) run
    between the score wait and the P V wait, where without OVERLAP ptxas hoists the wait
    into the reduction (13 to 32 of its FMNMX before it) and puts no exponential there;
    with OVERLAP=2 fewer exponentials than the tile's 64 per thread sit there (ptxas
    starts some early, as it does in FlashAttention-4's kernel; OVERLAP=1 keeps all of
    them there)."""
    from flashscope.isa.nvidia import disassemble

    builds = _overlap_max_builds(D, causal, knobs)
    under = {}
    for level, spec in builds.items():
        sass = disassemble(_build(spec).binary)
        under[level] = (_under_pv(sass, "FMNMX"), _under_pv(sass, "MUFU.EX2"))
    consumers = builds[0][0].BLOCK_M // 64
    fmnmx, ex2 = under[0]
    assert all(n < 64 for n in fmnmx) and ex2 == [0] * consumers, under
    fmnmx, ex2 = under[2]
    assert len(fmnmx) == consumers and all(n >= 64 for n in fmnmx), under
    assert len(ex2) == consumers and all(n < 64 for n in ex2), under


@_builds_of("test_masked_first_leaves_the_loop_without_mask")
def _masked_first_builds(D, bm, stages):
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=128, num_stages=stages, PINGPONG=True,
                    PERSISTENT=True)
    return {first: (cfg.replace(MASKED_FIRST=first), dict(head_dim=D, causal=True,
                                                          return_lse=True))
            for first in (False, True)}


@pytest.mark.parametrize("D,bm,stages", [(64, 192, 3), (128, 128, 2)])
def test_masked_first_leaves_the_loop_without_mask(D, bm, stages):
    """Causal, without MASKED_FIRST every consumer loop masks behind a branch between the
    score wait and the P V wait: one BRA and a select per score a thread holds (64 x 128
    scores over 128 threads, 64 FSEL with -INF, each counted twice). With it the masked
    tile is each consumer's first, outside the loop: neither is left there."""
    from flashscope.isa.nvidia import disassemble

    under = {}
    for first, spec in _masked_first_builds(D, bm, stages).items():
        sass = disassemble(_build(spec).binary)
        under[first] = (_under_pv(sass, "FSEL"), _under_pv(sass, "BRA"))
    consumers = bm // 64
    fsel, bra = under[False]
    assert len(fsel) == consumers and all(n >= 64 for n in fsel) and bra == [1] * consumers
    assert under[True] == ([0] * consumers, [0] * consumers), under


def _knob_builds(D, bm, knobs, knob):
    """The JOINT_KV and LEAN_RELEASE tests' builds: the same configs, so half of the
    second test's come cached."""
    cfg = G.replace(BLOCK_M=bm, PERSISTENT=True, **knobs)
    return {on: (cfg.replace(**{knob: on}), dict(head_dim=D, return_lse=True))
            for on in (False, True)}


@_builds_of("test_joint_kv_waits_once_a_key_tile")
def _joint_builds(D, bm, knobs):
    return _knob_builds(D, bm, knobs, "JOINT_KV")


@_builds_of("test_lean_release_drops_a_barrier_a_key_tile")
def _lean_builds(D, bm, knobs):
    return _knob_builds(D, bm, knobs, "LEAN_RELEASE")


@pytest.mark.parametrize("D,bm,knobs", [
    (64, 192, {"num_stages": 3, "OVERLAP": 2, "PINGPONG": True}),
    (128, 128, {"K_EARLY": True, "EARLY_Q": True, "Q_IN_REGS": True})])
def test_joint_kv_waits_once_a_key_tile(D, bm, knobs):
    """JOINT_KV: K and V of a slot land on one mbarrier, so each consumer's loop and its
    last P V lose their V wait: at least two mbarrier waits (TRYWAIT) fewer per consumer
    in the binary, the same wgmma, no spills."""
    from flashscope.isa.nvidia import disassemble

    waits, mma = {}, {}
    for joint, spec in _joint_builds(D, bm, knobs).items():
        art = _build(spec)
        (rec,) = records_for([art])
        assert rec.spill_stores == 0 and rec.spill_loads == 0
        waits[joint] = disassemble(art.binary).count("TRYWAIT")
        mma[joint] = rec.opcodes.get("HGMMA")
    assert waits[True] <= waits[False] - 2 * (bm // 64), waits
    assert mma[True] == mma[False] > 0


@pytest.mark.parametrize("D,bm,knobs", [  # test_joint_kv's builds, so half come cached
    (64, 192, {"num_stages": 3, "OVERLAP": 2, "PINGPONG": True}),
    (128, 128, {"K_EARLY": True, "EARLY_Q": True, "Q_IN_REGS": True})])
def test_lean_release_drops_a_barrier_a_key_tile(D, bm, knobs):
    """LEAN_RELEASE: the ring's free mbarriers leave Triton's allocation for 1 KB of
    static shared memory (the size keeps Triton's part 1024-aligned) and every hand-back
    is one elected lane's arrival per warp, so the binary loses at least one warpgroup
    ``BAR.SYNC`` per consumer (its loop's hand-back) and the producer's before its
    waits, and gains ``ELECT`` for the arrivals (Triton elects a lane for its TMA issues
    in both builds); the same wgmma, no spills."""
    from flashscope.isa.nvidia import disassemble

    bars, elects, mma, static = {}, {}, {}, {}
    for lean, spec in _lean_builds(D, bm, knobs).items():
        art = _build(spec)
        (rec,) = records_for([art])
        assert rec.spill_stores == 0 and rec.spill_loads == 0
        sass = disassemble(art.binary)
        bars[lean] = sass.count("BAR.SYNC")
        elects[lean] = sass.count("ELECT")
        mma[lean] = rec.opcodes.get("HGMMA")
        static[lean] = rec.static_shared_bytes
        assert ("fs_free" in art.asm) == lean
    assert static == {False: 0, True: 1024}, static
    assert bars[True] <= bars[False] - bm // 64 - 1, bars
    assert elects[True] > elects[False], elects
    assert mma[True] == mma[False] > 0


@_builds_of("test_early_releases_sit_before_the_pv_wait")
def _early_builds(D, bm, knobs):
    cfg = G.replace(BLOCK_M=bm, PERSISTENT=True, **knobs)
    return {(k, q): (cfg.replace(K_EARLY=k, EARLY_Q=q), dict(head_dim=D, causal=True,
                                                             return_lse=True))
            for k in (False, True) for q in (False, True)}


@pytest.mark.parametrize("D,bm,knobs", [
    (128, 128, {}), (64, 128, {"OVERLAP": True, "num_stages": 3}),
    (64, 192, {"PINGPONG": True, "num_stages": 3})])
def test_early_releases_sit_before_the_pv_wait(D, bm, knobs):
    """K_EARLY hands the K slot back, and EARLY_Q the Q slot (on the work tile's last key
    tile), as soon as the tile's Q K^T has completed: one arrival each between the score
    wait and the P V wait of every consumer loop, none there without them (K and V then go
    back together after the P V wait, and Q after the output store). EARLY_Q's own output
    slot adds BLOCK_M x D elements of shared memory."""
    from flashscope.isa.nvidia import disassemble

    shared = {}
    for (k_early, early_q), spec in _early_builds(D, bm, knobs).items():
        art = _build(spec)
        shared[early_q] = art.metadata["shared"]
        counts = _under_pv(disassemble(art.binary), "SYNCS.ARRIVE")
        assert counts == [int(k_early) + int(early_q)] * (bm // 64), (k_early, early_q)
    assert 0 <= shared[True] - shared[False] - bm * D * 2 < 128  # and the allocator's alignment


@_builds_of("test_out_rcp_drops_the_per_element_division")
def _rcp_builds(D, bm, causal, knobs):
    cfg = G.replace(BLOCK_M=bm, PERSISTENT=True, **knobs)
    return {rcp: (cfg.replace(OUT_RCP=rcp), dict(head_dim=D, causal=causal, return_lse=True))
            for rcp in (False, True)}


@pytest.mark.parametrize("D,bm,causal,knobs", [
    (64, 128, True, {"EARLY_Q": True, "K_EARLY": True, "num_stages": 3}),
    (128, 128, False, {"OVERLAP": 2, "PINGPONG": True, "LAZY_RESCALE": True})])
def test_out_rcp_drops_the_per_element_division(D, bm, causal, knobs):
    """O / l divides each of a thread's D / 2 output values, each division with ptxas's
    range fix-up (a compare-select and a scaled multiply, several instructions apiece);
    OUT_RCP=1 takes one reciprocal per row and multiplies: at least D / 2 fewer
    instructions per consumer, and the same number of wgmma."""
    from flashscope.isa.nvidia import disassemble

    counts = {}
    for rcp, spec in _rcp_builds(D, bm, causal, knobs).items():
        art = _build(spec)
        sass = disassemble(art.binary)
        ops = [ln for ln in sass.splitlines() if ln.strip().startswith("/*") and "*/" in ln]
        counts[rcp] = (len(ops), sass.count("HGMMA"))
        (rec,) = records_for([art])
        assert rec.spill_stores == 0
    assert counts[True][1] == counts[False][1]
    assert counts[True][0] <= counts[False][0] - (bm // 64) * D // 2, counts


@_builds_of("test_q_in_regs_feeds_the_score_product_from_registers")
def _q_regs_builds(D, causal, knobs):
    cfg = G.replace(BLOCK_M=128, BLOCK_N=128, PERSISTENT=True, **knobs)
    return {q: (cfg.replace(Q_IN_REGS=q), dict(head_dim=D, causal=causal, return_lse=True))
            for q in (False, True)}


@pytest.mark.parametrize("D,causal,knobs", [
    (128, False, {"num_stages": 3, "OVERLAP": 1, "PINGPONG": True, "LAZY_RESCALE": True}),
    (128, True, {"OVERLAP": 2, "EARLY_Q": True, "K_EARLY": True, "MASKED_FIRST": True}),
    (64, True, {"num_stages": 3, "OVERLAP": 2, "EARLY_Q": True, "K_EARLY": True})])
def test_q_in_regs_feeds_the_score_product_from_registers(D, causal, knobs):
    """Q_IN_REGS=1: every Q K^T wgmma takes Q from registers (``HGMMA .. R<a>, gdesc``,
    D / 16 per score tile, as the P V products already do) after one ``LDSM`` load of the
    slot per work tile, so the SS form is gone; the wgmma count is unchanged and the
    128 x 128 tiles fit without spills. With EARLY_Q the Q slot goes back after the first
    Q K^T, outside the loop: no Q arrival is left between the loop's score and P V waits."""
    from flashscope.isa.nvidia import disassemble

    seen = {}
    for q_regs, spec in _q_regs_builds(D, causal, knobs).items():
        art = _build(spec)
        sass = disassemble(art.binary)
        hgmma = [ln.split("HGMMA", 1)[1] for ln in sass.splitlines() if "HGMMA" in ln]
        ss = sum(1 for h in hgmma if h.split(",")[1].strip().startswith("gdesc"))
        (rec,) = records_for([art])
        seen[q_regs] = (len(hgmma), ss, sass.count("LDSM"), rec.spill_stores,
                        _under_pv(sass, "SYNCS.ARRIVE"))
    n, ss, ldsm, spills, arrivals = seen[True]
    assert n == seen[False][0] and ss == 0 and ldsm > 0 and spills == 0, seen
    assert seen[False][1] > 0, seen
    if knobs.get("EARLY_Q"):
        assert [a - b for a, b in zip(seen[False][4], arrivals)] == [1, 1], seen


def _needs_sm90(device):
    if device != "cuda":
        pytest.skip("Gluon kernels run on an sm_90 GPU only")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")


def _flags(flags: str) -> dict:
    """x PINGPONG, o OVERLAP (o2: OVERLAP=2), l LAZY_RESCALE, h EARLY_Q, k K_EARLY, f
    MASKED_FIRST, i OUT_RCP, q Q_IN_REGS, b BALANCE, j JOINT_KV, v SPLIT_KV, r
    LEAN_RELEASE, eN EXP2_POLY=N (last)."""
    poly = flags.split("e")[1] if "e" in flags else "0"
    return {"PINGPONG": "x" in flags, "OVERLAP": 2 if "o2" in flags else int("o" in flags),
            "LAZY_RESCALE": "l" in flags,
            "EARLY_Q": "h" in flags, "K_EARLY": "k" in flags, "MASKED_FIRST": "f" in flags,
            "OUT_RCP": "i" in flags, "Q_IN_REGS": "q" in flags, "BALANCE": "b" in flags,
            "JOINT_KV": "j" in flags, "SPLIT_KV": "v" in flags,
            "LEAN_RELEASE": "r" in flags, "EXP2_POLY": int(poly)}


def _tile_id(tiles) -> str:
    """(BLOCK_M, BLOCK_N, stages, flags) -> ``m128n64s2xo``."""
    return "m{}n{}s{}{}".format(*tiles)


SHAPES = [(77, 101, 2, 64), (130, 70, 4, 128), (1, 33, 1, 64), (200, 200, 2, 128),
          (257, 513, 1, 64), (64, 1, 4, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,Hkv,D", SHAPES)
@pytest.mark.parametrize("tiles", [(128, 128, 2, ""), (64, 64, 3, "o"), (128, 64, 4, ""),
                                   (192, 64, 3, "o"), (128, 128, 3, "x"), (192, 64, 2, "x"),
                                   (128, 128, 3, "xo"), (192, 128, 3, "o"),
                                   (192, 128, 3, "oe4"), (128, 64, 2, "xe2"),
                                   (128, 128, 3, "e8"), (192, 128, 3, "l"),
                                   (128, 128, 3, "xol"), (128, 64, 2, "l"),
                                   (128, 128, 2, "xolhk"), (64, 64, 3, "h"),
                                   (128, 64, 2, "k"), (128, 128, 2, "o2lhk"),
                                   (192, 128, 3, "xo2"), (192, 128, 3, "xlhkf"),
                                   (128, 64, 2, "f"), (64, 64, 3, "hf"),
                                   (128, 128, 2, "hki"), (192, 128, 3, "xlhkfi"),
                                   (128, 128, 3, "xolq"), (128, 128, 2, "o2lhkiq"),
                                   (64, 64, 3, "hfq"), (192, 128, 3, "xo2j"),
                                   (128, 128, 2, "o2lhkiqj"), (64, 64, 2, "j"),
                                   (192, 128, 3, "xo2fr"), (128, 128, 2, "o2lhkfiqr"),
                                   (64, 64, 3, "hr"), (128, 64, 2, "kjr")],
                         ids=_tile_id)
def test_matches_float64_reference(device, tiles, causal, Nq, Nk, Hkv, D):
    """The tiles' last field: the flags of :func:`_flags`. A
    tile too large for the head dim (192 x 128 with 3 stages needs 240 KB at D = 128) is
    refused by the config check before any launch, and skipped here."""
    _needs_sm90(device)
    bm, bn, st, flags = tiles
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=bn, num_stages=st, **_flags(flags))
    try:
        check_config(cfg, "sm90", D)
    except ConfigError as e:
        assert "shared memory" in str(e), e
        pytest.skip(str(e))
    dtype = torch.bfloat16 if (Nq + Nk) % 2 else torch.float16
    run_case(device, B=2, H=4, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal, dtype=dtype,
             bnhd=Nq % 2 == 0, cfg=cfg, with_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 3, 7])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles", [(128, 128, 3, "o"), (192, 64, 2, ""), (128, 64, 2, "x"),
                                   (192, 128, 2, "x"), (128, 128, 3, "xo"),
                                   (192, 128, 2, "l"), (128, 128, 2, "xolhk"),
                                   (192, 128, 2, "xhk"), (128, 64, 3, "h"), (128, 128, 3, "k"),
                                   (192, 128, 2, "xlhkf"), (128, 128, 2, "hf"),
                                   (128, 128, 2, "xolhkq"), (128, 64, 3, "q"),
                                   (192, 128, 2, "xo2b"), (192, 128, 2, "xhib"),
                                   (192, 128, 2, "xlhkfb"), (192, 128, 2, "xo2bj"),
                                   (192, 128, 2, "xlhkfj"), (128, 128, 2, "hkj"),
                                   (192, 128, 2, "xo2v"), (192, 128, 2, "xlhkfv"),
                                   (128, 128, 2, "xolhkqv"), (128, 64, 3, "hfiv"),
                                   (192, 128, 2, "xo2fr"), (192, 128, 2, "xlhkfvr"),
                                   (128, 128, 2, "o2lhkfiqvr"), (192, 128, 2, "xhibr")],
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
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=bn, num_stages=st, PERSISTENT=True, **_flags(flags))
    for Nq, Nk, Hkv, D in [(300, 333, 2, 128), (513, 257, 4, 64), (200, 450, 2, 64)]:
        run_case(device, B=2, H=4, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal,
                 dtype=torch.bfloat16, bnhd=False, cfg=cfg, with_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D,tiles", [(64, (192, 128, 3, "ol")), (128, (128, 128, 3, "xol")),
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
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=bn, num_stages=st, PERSISTENT=True, **_flags(flags))
    B, H, Hkv, Nq, Nk = 2, 4, 2, 300, 1000
    q, k, v = make_qkv(device, B, H, Nq, Nk, D, Hkv=Hkv, dtype=torch.bfloat16, bnhd=False)
    q = q * 3
    k = (k * torch.linspace(0.5, 6.0, Nk, device=device)[:, None]).to(k.dtype)
    check_case(q, k, v, causal=causal, cfg=cfg, with_lse=True,
               tag=f"rising scores D={D} causal={causal} {cfg.key}")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("programs", [None, 7])
def test_divisors_that_are_not_powers_of_two(device, monkeypatch, programs, causal):
    """The kernel divides each work-tile index by the row blocks per head, the heads and
    the query heads per key head, with multipliers from the host
    (:func:`flashscope.launch.divider`); every test shape above has powers of two there.
    Here 6 row blocks (Nq = 700), H = 6 and a group of 3 (Hkv = 2), with a program per
    tile and with 7 persistent programs."""
    _needs_sm90(device)
    if programs:
        monkeypatch.setattr(launch, "sm_count", lambda dev: programs)
    cfg = G.replace(BLOCK_M=128, BLOCK_N=128, num_stages=2, PERSISTENT=bool(programs),
                    **_flags("xolhk"))
    run_case(device, B=3, H=6, Hkv=2, Nq=700, Nk=650, D=64, causal=causal,
             dtype=torch.bfloat16, bnhd=False, cfg=cfg, with_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles", [(128, 128, 2, "x"), (192, 128, 3, "xo2")], ids=_tile_id)
def test_pingpong_turns_over_more_programs_than_sms(device, tiles, causal):
    """PINGPONG's turns are hardware named barriers, which belong to the CTA: with one
    program per work tile (not persistent), 2 x 16 x 12-24 programs run several to an SM
    one after another, each starting from consumer 0's open first turn. A barrier left
    half-arrived by one program would shift the next one's turns (or hang it)."""
    _needs_sm90(device)
    bm, bn, st, flags = tiles
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=bn, num_stages=st, **_flags(flags))
    run_case(device, B=2, H=16, Hkv=8, Nq=2300, Nk=1100, D=64, causal=causal,
             dtype=torch.bfloat16, bnhd=False, cfg=cfg, with_lse=True)


# lengths inside each class of the tuned file, none a tile multiple
_CLASS_SHAPES = {"le1k": (1000, 777), "le4k": (2049, 3001), "le16k": (4500, 9001)}


@pytest.mark.gpu
@pytest.mark.parametrize("entry", sorted(load_tuned("sm90")), ids=lambda e: "-".join(map(str, e)))
def test_shipped_sm90_entries_match_reference(device, entry):
    """Each entry of the shipped sm90 tuned file, taken by the public API for a problem in
    its key-length class (Nq != Nk, GQA), against the float64 reference with the output
    poisoned: the defaults that the benchmarks time are the ones tested."""
    _needs_sm90(device)
    dtype, D, causal, cls = entry
    Nq, Nk = _CLASS_SHAPES[cls]
    cfg, tuned, _ = lookup("sm90", dtype, D, causal, Nk)
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
    out, _ = launch.forward(q, k, v, causal=False, scale=0.125, cfg=G, return_lse=False)
    ref = torch.softmax(q[:, :1].double() @ k[:, :1].double().transpose(-1, -2) * 0.125, -1)
    ref = ref @ v[:, :1].double()
    assert not torch.isnan(out[:, 0]).any()
    assert (out[:, :1].double() - ref).abs().max().item() < 1e-2


@pytest.mark.gpu
def test_misaligned_view_is_refused(device):
    _needs_sm90(device)
    base = torch.randn(1, 2, 64, 72, device="cuda", dtype=torch.float16)
    q = base[..., 4:68]  # a 64-wide view at an 8-byte offset
    with pytest.raises(ConfigError, match="query: GLUON=1 needs a 16-byte aligned"):
        launch.forward(q, q, q, causal=False, scale=0.125, cfg=G, return_lse=False)
