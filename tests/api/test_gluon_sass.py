"""sm90-fwd, offline: what the sm_90 binary of the Gluon forward must contain, read from the
cubin/SASS of builds for sm_90 (any machine): wgmma, TMA loads and the store, setmaxnreg
budgets, no spills, the shared memory the config check bounds, and where each knob puts
its instructions around the loop's wgmma waits (exponentials and row maxima under the
P V product, early slot hand-backs, the lazy rescale's branch, barriers and waits).

Each test states the builds it compiles as a function of its parameters (``BUILDS``);
:func:`_prebuilt` compiles those of every selected test at once before they run.
"""

import pytest

from flashscope import compile as fcompile
from flashscope.isa.read import records_for

from .prebuild import Builds, mark_release_difference, prebuild
from .test_gluon import G

#: What a Triton release's binary does not meet, measured by running this file under it:
#: {(major, minor): {test id: what its build does}}. The schedule's needs are 3.6's
#: binaries (the tuned entries were chosen with them); these tests are expected to fail
#: under that release, strictly, so a release that meets them again shows up.
RELEASE_DIFFERENCES = {
    (3, 8): {  # ptxas 12.9
        "test_lazy_rescale_branches_over_the_rescale[128-128-False-knobs1]":
            "the first consumer's vote has no branch over its rescale within 64 instructions",
    },
    (3, 9): {  # ptxas 13.4 (ptxas-blackwell) builds sm_90
        "test_sm90_binary[128-True-192-64-knobs3]": "5 spill stores (D = 128, 192 x 64)",
        "test_sm90_binary[128-True-128-128-knobs11]": "4 spill stores (Q_IN_REGS, D = 128)",
        "test_sm90_binary[80-False-128-128-knobs13]": "3 spill stores (Q_IN_REGS, D = 80)",
        "test_lazy_rescale_branches_over_the_rescale[128-128-False-knobs1]":
            "the first consumer's vote has no branch over its rescale within 64 instructions",
        "test_q_in_regs_feeds_the_score_product_from_registers[128-False-knobs0]":
            "3 spill stores with Q_IN_REGS",
        "test_q_in_regs_feeds_the_score_product_from_registers[128-True-knobs1]":
            "5 spill stores with Q_IN_REGS",
    },
}


@pytest.fixture(autouse=True)
def _release_differences(request):
    mark_release_difference(request, RELEASE_DIFFERENCES)


#: the sm_90 builds each offline test compiles (:func:`_prebuilt` compiles them ahead)
BUILDS = Builds()
_builds_of = BUILDS.of


def _build(spec):
    cfg, kw = spec
    return fcompile.build(cfg, "sm90", **kw)


@pytest.fixture(scope="module", autouse=True)
def _prebuilt(request):
    """The selected tests' builds, compiled at once before any of them runs
    (:mod:`.prebuild`: 9.5 min for these tests on 2 cores one build after another, 3 min
    this way)."""
    prebuild(request, BUILDS)


@_builds_of("test_sm90_binary")
def _binary_builds(D, causal, bm, bn, knobs):
    return {None: (G.replace(BLOCK_M=bm, BLOCK_N=bn, **knobs),
                   dict(head_dim=D, causal=causal, return_lse=True))}


@pytest.mark.parametrize("D,causal,bm,bn,knobs", [
    (64, False, 128, 128, {}), (128, True, 128, 128, {}), (64, False, 192, 128, {}),
    (128, True, 192, 64, {}), (128, False, 128, 128, {"PINGPONG": True}),
    (64, True, 192, 64, {"PINGPONG": True}),
    (64, False, 192, 128, {"num_stages": 3}),
    (64, True, 128, 128, {"EARLY_Q": True, "num_stages": 3}),
    (128, True, 128, 128, {"EARLY_Q": True, "PINGPONG": True}),
    (64, False, 192, 128, {"num_stages": 3, "PINGPONG": True, "BALANCE": True}),
    (64, False, 192, 128, {"num_stages": 3, "PINGPONG": True, "SPLIT_KV": True}),
    (128, True, 128, 128, {"Q_IN_REGS": True, "LAZY_RESCALE": True, "EARLY_Q": True,
                           "K_EARLY": True, "MASKED_FIRST": True, "SPLIT_KV": True}),
    (256, True, 128, 64, {"LAZY_RESCALE": True, "K_EARLY": True, "MASKED_FIRST": True}),
    (80, False, 128, 128, {"Q_IN_REGS": True, "EARLY_Q": True, "K_EARLY": True}),
    (96, True, 128, 128, {"Q_IN_REGS": True, "EARLY_Q": True, "LAZY_RESCALE": True,
                          "SPLIT_KV": True})])
def test_sm90_binary(D, causal, bm, bn, knobs):
    """What the schedule needs, read from the cubin: 64 x N wgmma, 4-D TMA loads and the
    TMA store, setmaxnreg moving registers between partitions, one warpgroup per 64 rows
    plus the producer's, no spills (D = 64 at 192 x 128 spilled 38 registers while
    consumer 0 sat in the default partition), and no PRMT: P reaches the P V wgmma
    packed as its A operand wants it (32 swaps per tile when ptxas packs it)."""
    art = _build(_binary_builds(D, causal, bm, bn, knobs)[None])
    assert art.metadata["num_warps"] == 4 * (bm // 64 + 1)
    (rec,) = records_for([art])
    mix = rec.opcodes
    assert mix.get("HGMMA", 0) > 0 and mix.get("UTMALDG", 0) > 0 and mix.get("UTMASTG", 0) > 0
    assert mix.get("USETMAXREG", 0) > 0
    assert rec.spill_stores == 0 and rec.spill_loads == 0
    assert mix.get("PRMT", 0) == 0, mix.get("PRMT")
    from flashscope.families.sm90_fwd import head_parts, head_width
    from flashscope.isa.nvidia import disassemble, sass_lines

    assert rec.dynamic_shared_bytes >= (bm + 2 * 2 * bn) * head_width(D) * 2
    shapes = {line.split("HGMMA.", 1)[1].split(".")[0]
              for lines in sass_lines(disassemble(art.binary)).values()
              for op, line in lines if op == "HGMMA"}
    main, tail = head_parts(D)
    # Q K^T over the key tile; P V over each column part, the tail's no wider than itself
    want = {f"64x{bn}x16", f"64x{main}x16"} | ({f"64x{tail}x16"} if tail else set())
    assert shapes == want, (shapes, want)


@_builds_of("test_shared_bound_is_within_the_barriers_of_the_binary")
def _bound_builds(D, bm, bn, knobs):
    return {None: (G.replace(BLOCK_M=bm, BLOCK_N=bn, **knobs),
                   dict(head_dim=D, causal=False, return_lse=True))}


# four of these are other tests' builds (test_sm90_binary's, test_out_rcp's and
# test_only_the_row_max's), compiled once for both
@pytest.mark.parametrize("D,bm,bn,knobs", [
    (64, 192, 128, {"num_stages": 3}),
    (128, 128, 128, {"EARLY_Q": True, "K_EARLY": True, "LAZY_RESCALE": True}),
    (128, 192, 64, {"num_stages": 3, "EARLY_Q": True, "Q_IN_REGS": True}),
    (64, 64, 64, {}), (128, 128, 128, {"PINGPONG": True, "LAZY_RESCALE": True}),
    (96, 128, 128, {"num_stages": 3, "EARLY_Q": True}),
    (80, 128, 128, {"Q_IN_REGS": True, "EARLY_Q": True, "K_EARLY": True})])
def test_shared_bound_is_within_the_barriers_of_the_binary(D, bm, bn, knobs):
    """The rules' bound for the sm90 kernel (Q, O with EARLY_Q, the K/V ring, the 4 fp32
    a row that _pin stores) is what the binary allocates but its mbarriers (8 bytes each)
    and their alignment: never more, within 1 KB. A bound lower than that lets configs
    through that fail only at launch."""
    from flashscope.families.sm90_fwd import min_shared_bytes

    spec = _bound_builds(D, bm, bn, knobs)[None]
    cfg = spec[0]
    (rec,) = records_for([_build(spec)])
    bound = min_shared_bytes(cfg, D)
    used = rec.static_shared_bytes + rec.dynamic_shared_bytes
    assert bound <= used < bound + 1024, (bound, used)


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
    cfg = G.replace(BLOCK_M=bm, num_stages=3, **knobs)
    return {lazy: (cfg.replace(LAZY_RESCALE=lazy), dict(head_dim=D, causal=causal,
                                                        return_lse=True))
            for lazy in (False, True)}


@pytest.mark.parametrize("D,bm,causal,knobs", [
    (64, 192, False, {}), (128, 128, False, {"PINGPONG": True}), (64, 128, True, {})])
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


@_builds_of("test_only_the_row_max_runs_under_pv")
def _pin_builds(D, causal, knobs):
    cfg = G.replace(**{"BLOCK_M": 128, "BLOCK_N": 128, **knobs})
    return {None: (cfg, dict(head_dim=D, causal=causal, return_lse=True))}


@pytest.mark.parametrize("D,causal,knobs", [
    (128, False, {"EARLY_Q": True, "K_EARLY": True, "LAZY_RESCALE": True}),
    (128, True, {"PINGPONG": True}),
    (64, False, {"BLOCK_M": 192, "num_stages": 3, "PINGPONG": True})])
def test_only_the_row_max_runs_under_pv(D, causal, knobs):
    """The consumer pins the row maxima (:func:`~flashscope.kernels.sm90_sync._pin`): in
    every consumer's loop the row maximum's FMNMX (at least one per score a thread holds,
    64 of the 64 x 128 tile) run between the score wait and the P V wait, where without
    the pin ptxas hoists the wait into the reduction; fewer exponentials than the tile's
    64 per thread sit there (ptxas starts some early, as in FlashAttention-4's kernel)."""
    from flashscope.isa.nvidia import disassemble

    spec = _pin_builds(D, causal, knobs)[None]
    sass = disassemble(_build(spec).binary)
    fmnmx, ex2 = _under_pv(sass, "FMNMX"), _under_pv(sass, "MUFU.EX2")
    consumers = spec[0].BLOCK_M // 64
    assert len(fmnmx) == consumers and all(n >= 64 for n in fmnmx), (fmnmx, ex2)
    assert len(ex2) == consumers and all(n < 64 for n in ex2), (fmnmx, ex2)


@_builds_of("test_masked_first_leaves_the_loop_without_mask")
def _masked_first_builds(D, bm, stages):
    cfg = G.replace(BLOCK_M=bm, BLOCK_N=128, num_stages=stages, PINGPONG=True)
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


@_builds_of("test_early_releases_sit_before_the_pv_wait")
def _early_builds(D, bm, knobs):
    cfg = G.replace(BLOCK_M=bm, **knobs)
    return {(k, q): (cfg.replace(K_EARLY=k, EARLY_Q=q), dict(head_dim=D, causal=True,
                                                             return_lse=True))
            for k in (False, True) for q in (False, True)}


@pytest.mark.parametrize("D,bm,knobs", [
    (128, 128, {}), (64, 128, {"num_stages": 3}),
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
    cfg = G.replace(BLOCK_M=bm, **knobs)
    return {rcp: (cfg.replace(OUT_RCP=rcp), dict(head_dim=D, causal=causal, return_lse=True))
            for rcp in (False, True)}


@pytest.mark.parametrize("D,bm,causal,knobs", [
    (64, 128, True, {"EARLY_Q": True, "K_EARLY": True, "num_stages": 3}),
    (128, 128, False, {"PINGPONG": True, "LAZY_RESCALE": True})])
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
    cfg = G.replace(BLOCK_M=128, BLOCK_N=128, **knobs)
    return {q: (cfg.replace(Q_IN_REGS=q), dict(head_dim=D, causal=causal, return_lse=True))
            for q in (False, True)}


@pytest.mark.parametrize("D,causal,knobs", [
    (128, False, {"num_stages": 3, "PINGPONG": True, "LAZY_RESCALE": True}),
    (128, True, {"EARLY_Q": True, "K_EARLY": True, "MASKED_FIRST": True}),
    (64, True, {"num_stages": 3, "EARLY_Q": True, "K_EARLY": True})])
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
