"""The decoding family (``triton-decode``): its rules, its split rule and default selection
as pure functions of the problem, and its kernels built offline for every GPU family."""

import pytest

from flashscope import compile as fcompile
from flashscope.errors import ConfigError
from flashscope.families import Problem, config_from_text, family, triton_decode
from flashscope.families.triton_decode import (CUT_MAX_TILES, IN_FLIGHT_PER_SM,
                                               LONG_READ_TILES, MAX_SPLITS,
                                               SCORES_PER_THREAD,
                                               TritonDecodeConfig, cut_rows,
                                               in_flight_bytes, in_flight_per_sm,
                                               merge_pays, narrow_head_stages,
                                               narrow_keys, readers, select,
                                               paged_stages, short_read_keys, split_count,
                                               triton_stages)
from flashscope.targets import ALL_TARGETS, get_target


def decode_problem(B=8, Nq=1, H=32, Hkv=8, Nk=8192, D=128, target="sm90", device=""):
    return Problem(target, "bfloat16", D, True, Nq, Nk, B * H, group=H // Hkv, device=device)


@pytest.mark.parametrize("tiles,key_tiles,grid,want", [
    (512, 2048, 66, 1),     # B = 64 x 8 kv heads fill the GPU: no split
    (64, 2048, 66, 1),      # the work tiles alone are the grid
    (33, 2048, 66, 2),
    (8, 2048, 66, 8),       # one sequence: 64 programs
    (8, 2048, 132, 16),
    (8, 2048, 304, 38),     # an MI300X's CUs
    (8, 4, 66, 4),          # a short cache: a key tile a split at least
    (8, 1, 66, 1),
    (1, 10 ** 6, 10 ** 4, MAX_SPLITS),
])
def test_split_count(tiles, key_tiles, grid, want):
    assert split_count(tiles, key_tiles, grid) == want


@pytest.mark.parametrize("tiles,streams,grid,units,want", [
    (32, 16, 66, 132, 4),    # two row blocks of 16 kv heads: the bytes counted per kv head
    (64, 32, 66, 132, 2),
    (128, 64, 66, 132, 1),
    (16, 8, 132, 132, 8),    # never past one program an SM: 16 x 8 = 128 programs
    (32, 8, 132, 132, 4),    # 4 row blocks of 8 kv heads (512 packed rows)
])
def test_split_count_reads_bytes_per_kv_head(tiles, streams, grid, units, want):
    assert split_count(tiles, 2048, grid, streams, units) == want
    assert tiles * want <= units


def test_merge_pays_only_on_long_reads_where_the_bytes_ask_for_no_split():
    assert merge_pays(8, 2, 1) is False and merge_pays(LONG_READ_TILES - 1, 2, 1) is False
    assert merge_pays(LONG_READ_TILES, 2, 1) is True
    assert merge_pays(8, 8, 4) is True  # the byte target splits too: the merge is paid
    assert merge_pays(8, 1, 1) is True  # nothing to pay for
    assert merge_pays(8, 2, 1, chained=True) is True  # a chain of products: any length


@pytest.mark.parametrize("B,H,Nq,D,target,want", [
    (8, 64, 4, 128, "sm90", 2),   # GQA 8:1 at 4 tokens: 32-row mma.sync tiles, 64 programs
    (8, 32, 8, 256, "sm90", 2),   # GQA 4:1 at 8 tokens, D = 256 (64-key tiles)
    (16, 64, 4, 128, "sm90", 1),  # 128 programs: a second each would pass one an SM
    (8, 32, 1, 128, "sm90", 1),   # one token: 16-row tiles, bound by the bytes
    (8, 32, 16, 128, "sm90", 1),  # 64 rows: wgmma
    (8, 64, 4, 128, "sm80", 1),   # not measured off sm_90
])
def test_short_reads_split_only_chains_of_products(B, H, Nq, D, target, want):
    """At 1k keys (8 key tiles of 128, below LONG_READ_TILES) the merge pays only for
    sm_90's 32-row mma.sync tiles (triton_decode.CHAIN_ROWS), and only up to one program
    an SM."""
    cfg = select(decode_problem(B=B, Nq=Nq, H=H, Hkv=8, Nk=1024, D=D, target=target,
                                device="NVIDIA H200" if target == "sm90" else ""))
    assert cfg.SPLITS == want, cfg.text


def test_the_interpreter_case_of_a_cut_tile_is_one():
    """tests/api/test_decode.py runs this problem's default through the interpreter: it
    must stay a 128-row group cut into two blocks, with narrow keys and splits."""
    cfg = select(Problem("sm90", "bfloat16", 16, True, 16, 200, 2 * 16, group=8, paged=True))
    assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.SPLITS) == (64, 64, 2)


def test_narrow_keys_for_wgmma_tiles_on_short_caches():
    assert narrow_keys(128, 3, 8, 64, 132, True) == (64, 4)  # one program an SM at most
    assert narrow_keys(128, 3, 8, 512, 132, True) == (64, 3)  # two share an SM
    assert narrow_keys(128, 3, CUT_MAX_TILES + 1, 64, 132, True) == (128, 3)  # long read
    assert narrow_keys(128, 3, 8, 64, 132, False) == (128, 3)  # mma.sync tiles
    assert narrow_keys(64, 3, 8, 64, 132, True) == (64, 3)  # already narrow (D = 256)


def test_dense_16_row_tiles_at_d64_past_one_3_stage_wave_take_4_stages():
    args = dict(units=132, wgmma=False, paged=False)
    assert narrow_head_stages(3, 64, 128, 16, 512, **args) == 4  # B = 64, GQA 4:1
    assert narrow_head_stages(3, 64, 128, 16, 264, **args) == 3  # one wave of two an SM
    assert narrow_head_stages(3, 128, 128, 16, 512, **args) == 3  # D = 128
    assert narrow_head_stages(3, 64, 128, 32, 512, **args) == 3  # 32 rows
    assert narrow_head_stages(4, 64, 64, 16, 512, **args) == 4  # a short read's tiles
    assert narrow_head_stages(3, 64, 128, 16, 512, 132, True, False) == 3  # wgmma
    assert narrow_head_stages(2, 64, 128, 16, 512, 132, False, True) == 2  # paged
    h200 = dict(device="NVIDIA H200")

    def cfg(B, n_k, n_q=1, D=64, paged=False):
        return select(Problem("sm90", "bfloat16", D, True, n_q, n_k, B * 32, group=4,
                              paged=paged, **h200))
    for c in (cfg(64, 8192), cfg(64, 32768), cfg(64, 8192, n_q=4), cfg(64, 8192, D=48)):
        assert (c.BLOCK_M, c.BLOCK_N, c.num_stages, c.SPLITS) == (16, 128, 4, 1), c
    for c in (cfg(32, 8192), cfg(8, 32768), cfg(64, 8192, D=128)):
        assert (c.BLOCK_N, c.num_stages) == (128, 3), c
    assert cfg(64, 8192, paged=True).num_stages == 2


def test_short_dense_reads_of_many_16_row_programs_take_narrow_keys():
    assert short_read_keys(128, 3, 8, 512, 132, 16, False, False) == (64, 4)
    assert short_read_keys(128, 3, 8, 128, 132, 16, False, False) == (128, 3)  # <= an SM each
    assert short_read_keys(128, 3, 16, 512, 132, 16, False, False) == (128, 3)  # 2k keys
    assert short_read_keys(128, 2, 8, 512, 132, 16, False, True) == (128, 2)  # paged
    assert short_read_keys(128, 3, 8, 512, 132, 32, False, False) == (128, 3)  # 32 rows
    assert short_read_keys(128, 3, 8, 512, 132, 16, True, False) == (128, 3)  # wgmma
    assert short_read_keys(64, 3, 8, 512, 132, 16, False, False) == (64, 3)  # D = 256
    h200 = dict(device="NVIDIA H200")

    def one_token(B, n_k, D=128, H=32, paged=False):
        return select(Problem("sm90", "bfloat16", D, True, 1, n_k, B * H, group=H // 8,
                              paged=paged, **h200))
    for B, H, D in ((32, 32, 128), (64, 64, 128), (128, 32, 128), (64, 32, 64)):
        cfg = one_token(B, 1024, D, H)
        assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_stages, cfg.SPLITS) == (16, 64, 4, 1), cfg
    for cfg in (one_token(16, 1024), one_token(64, 2048), one_token(64, 1024, paged=True)):
        assert cfg.BLOCK_N == 128, cfg


def test_narrow_keys_where_a_thread_would_hold_more_than_64_scores():
    long = CUT_MAX_TILES + 1
    # 128 x 128 over 4 warps: 128 scores a thread, narrowed at any length
    assert narrow_keys(128, 3, long, 128, 132, True, 128) == (64, 4)
    assert narrow_keys(128, 3, 8 * long, 512, 132, True, 128) == (64, 3)
    # 64 a thread (128 x 128 over 8 warps, 64 x 128 over 4): the long read keeps 128 keys
    assert narrow_keys(128, 3, long, 128, 132, True, SCORES_PER_THREAD) == (128, 3)
    assert narrow_keys(128, 3, long, 128, 132, False, 128) == (128, 3)  # mma.sync
    sm90 = get_target("sm90")
    for n_k in (1024, 8192, 131072):  # D = 64, GQA 8:1, 16 tokens: 128 rows, 4 warps
        cfg = select(Problem("sm90", "bfloat16", 64, True, 16, n_k, 8 * 64, group=8))
        assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps) in ((128, 64, 4), (64, 64, 4))
        assert cfg.BLOCK_M * cfg.BLOCK_N // (cfg.num_warps * sm90.warp_size) \
            <= SCORES_PER_THREAD
    cfg = select(Problem("sm90", "bfloat16", 128, True, 16, 8192, 8 * 64, group=8))
    assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps) == (128, 128, 8)  # 64 a thread


def test_cut_rows_on_short_caches_that_keep_one_wave():
    assert cut_rows(128, 128, 64, 132, True, 8) == 64  # B = 8 x 8 kv heads: 128 programs
    assert cut_rows(128, 128, 64, 132, True, CUT_MAX_TILES) == 64
    assert cut_rows(128, 128, 64, 132, True, CUT_MAX_TILES + 1) == 128  # a long read
    assert cut_rows(128, 128, 128, 132, True, 8) == 128  # 256 cut programs: two waves
    assert cut_rows(128, 128, 64, 132, False, 8) == 128  # mma.sync: not measured
    assert cut_rows(64, 64, 8, 132, True, 8) == 64
    assert cut_rows(512, 128, 8, 132, True, 8) == 64  # 8 row blocks of 64 for 8 kv heads


def test_readers_by_bytes_in_flight_and_rows():
    cfg = TritonDecodeConfig(BLOCK_M=16, BLOCK_N=128, num_stages=3)
    k128 = 2 * 2 * 128 * 128 * 2  # two stages of 128 x 128 K and V tiles in flight
    assert in_flight_bytes(cfg, 128) == k128
    assert in_flight_bytes(cfg, 80) == k128  # the padded head dim is what is loaded
    assert in_flight_bytes(cfg.replace(num_stages=1), 64) == k128 // 4  # a tile at least
    assert readers(cfg, 128, "bfloat16", 132) == 132 * 64 * 1024 // k128 == 66
    assert readers(cfg, 64, "bfloat16", 132) == 132  # half the bytes, twice the programs
    assert readers(cfg.replace(BLOCK_N=16), 64, "bfloat16", 132) == 132  # one an SM at most
    # wider tiles: their products pace the loads, one program an SM
    sm90 = get_target("sm90")
    assert readers(cfg.replace(BLOCK_M=32), 128, "bfloat16", 132, sm90) == 132
    assert readers(cfg.replace(BLOCK_M=64), 128, "bfloat16", 132, sm90) == 66  # wgmma
    assert readers(cfg.replace(BLOCK_M=64), 128, "bfloat16", 108, get_target("sm80")) == 108
    assert readers(cfg.replace(BLOCK_M=128), 128, "bfloat16", 132, sm90) == 132
    assert readers(cfg, 128, "bfloat16", 132, sm90, paged=True) == 132  # gathers pace


def test_bytes_in_flight_by_gpu_on_long_reads():
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    assert in_flight_per_sm(h200, LONG_READ_TILES) == 2 * IN_FLIGHT_PER_SM
    assert in_flight_per_sm(h200, LONG_READ_TILES - 1) == IN_FLIGHT_PER_SM  # latency-bound
    assert in_flight_per_sm(h100, 1024) == in_flight_per_sm("", 1024) == IN_FLIGHT_PER_SM
    assert in_flight_per_sm("NVIDIA H200 NVL", 64) == 2 * IN_FLIGHT_PER_SM
    assert in_flight_per_sm("NVIDIA GH200 480GB", 64) == IN_FLIGHT_PER_SM  # not measured
    # B = 8, one query token: the H200's 64 programs take two splits from 8k keys (64
    # key tiles), none on 1k (8 key tiles), as on an H100
    assert select(decode_problem(device=h200)).SPLITS == 2
    assert select(decode_problem(device=h100)).SPLITS == 1
    assert select(decode_problem(Nk=1024, device=h200)).SPLITS == 1
    # B = 1: 16 splits (128 programs) against the H100's 8 at 32k keys
    assert select(decode_problem(B=1, Nk=32768, device=h200)).SPLITS == 16
    assert select(decode_problem(B=1, Nk=32768, device=h100)).SPLITS == 8
    # wide tiles and B = 64 stay where they were: one program an SM, no split
    assert select(decode_problem(B=64, device=h200)).SPLITS == 1
    assert select(decode_problem(B=8, Nq=16, H=64, device=h200)) == select(
        decode_problem(B=8, Nq=16, H=64, device=h100))


def test_a_decoding_problem_names_its_gpu():
    import torch

    from flashscope.families.triton_decode import Cache
    from flashscope.kvcache import problem_of
    from flashscope.masks import Mask

    q = torch.zeros(2, 1, 8, 64, dtype=torch.float16)
    k = torch.zeros(2, 16, 2, 64, dtype=torch.float16)
    cache = Cache.of(k, k, torch.full((2,), 16, dtype=torch.int32), None)
    assert problem_of(q, cache, Mask.of(True)).device == ""  # a CPU tensor: no GPU


def test_device_name_asks_the_driver_for_gpus_only(monkeypatch):
    from types import SimpleNamespace

    import torch

    from flashscope import launch

    monkeypatch.setattr(launch, "_gpu_name", lambda index: f"NVIDIA H200 #{index}")
    monkeypatch.setattr(launch, "device_index", lambda device: 3)
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    assert launch.device_name(SimpleNamespace(type="cuda")) == "NVIDIA H200 #3"
    assert launch.device_name(torch.device("cpu")) == ""
    monkeypatch.setattr(launch, "interpreting", lambda: True)
    assert launch.device_name(SimpleNamespace(type="cuda")) == ""


def test_select_packs_the_group_and_splits_small_grids():
    one = select(decode_problem(B=1, Nq=1, Hkv=8, Nk=131072))
    assert (one.BLOCK_M, one.DOT, one.num_warps) == (16, True, 4)  # 4 rows padded to 16
    assert one.SPLITS == 8  # 8 work tiles x 8 splits: 64 KB loading an SM of 132
    wide = select(decode_problem(B=64, Nq=16, H=64, Hkv=8))
    assert (wide.BLOCK_M, wide.num_warps, wide.SPLITS) == (128, 8, 1)
    # at B = 8 (64 work tiles) and 8k keys: one program an SM for 128- and 32-row tiles
    # (2 splits), none for 64 rows on wgmma and for 16
    assert select(decode_problem(B=8, Nq=16, H=64, Hkv=8)).SPLITS == 2
    assert select(decode_problem(B=8, Nq=4, H=64, Hkv=8)).SPLITS == 2
    assert select(decode_problem(B=8, Nq=16, H=32, Hkv=8)).SPLITS == 1
    assert select(decode_problem(B=8, Nq=1, H=64, Hkv=8)).SPLITS == 1
    # at 1k keys the second program an SM pays for the merge only where a program's tiles
    # are a chain of products (32-row mma.sync tiles); 128-row wgmma tiles are cut into
    # two 64-row blocks instead
    assert select(decode_problem(B=8, Nq=4, H=64, Hkv=8, Nk=1024)).SPLITS == 2
    assert select(decode_problem(B=8, Nq=1, H=64, Hkv=8, Nk=1024)).SPLITS == 1
    paged = [select(Problem("sm90", "bfloat16", 128, True, 1, n_k, 8 * 32, group=4,
                            paged=True)).SPLITS for n_k in (1024, 2048, 4096, 8192)]
    assert paged == [1, 1, 2, 2]  # from LONG_READ_TILES = 32 key tiles of 128
    cut = [select(decode_problem(B=B, Nq=16, H=64, Hkv=8, Nk=1024)) for B in (1, 2, 4, 8, 16)]
    assert [(c.BLOCK_M, c.num_warps, c.SPLITS) for c in cut] == \
        [(64, 4, 8), (64, 4, 4), (64, 4, 2), (64, 4, 1), (128, 8, 1)]
    # and narrower key tiles for the wgmma tiles of a short cache, the splits kept
    assert [(c.BLOCK_N, c.num_stages) for c in cut] == [(64, 4)] * 4 + [(64, 4)]
    long = select(decode_problem(B=64, Nq=16, H=64, Hkv=8, Nk=8192))
    assert (long.BLOCK_M, long.BLOCK_N, long.num_stages) == (128, 128, 3)
    many = select(decode_problem(B=64, Nq=16, H=64, Hkv=8, Nk=1024))
    assert (many.BLOCK_M, many.BLOCK_N, many.num_stages) == (128, 64, 3)  # 512 programs
    assert select(decode_problem(B=1, Nq=16, H=32, Hkv=8, Nk=1024)).SPLITS == 8
    assert select(decode_problem(B=8, Nq=16, H=64, Hkv=8, Nk=1024, target="sm80")).BLOCK_M \
        == 128
    assert select(decode_problem(Nq=16, H=32, Hkv=1)).BLOCK_M == 128  # 512 rows: 4 blocks
    # the split rule reads the target's SM count (same tiles: fewer SMs, fewer splits) and
    # the bytes a program loads (sm86's smaller shared memory halves its key tiles)
    assert select(decode_problem(B=1, target="sm80")).SPLITS < \
        select(decode_problem(B=1, target="sm90")).SPLITS
    p = decode_problem(B=2, Nk=4096)
    assert select(p) == select(p) and isinstance(select(p), TritonDecodeConfig)


@pytest.mark.parametrize("t", ALL_TARGETS, ids=lambda t: t.name)
@pytest.mark.parametrize("d", [16, 64, 128, 256])
def test_defaults_are_feasible_everywhere(t, d):
    for nq, group in ((1, 1), (1, 8), (16, 8)):
        cfg = select(Problem(t.name, "bfloat16", d, True, nq, 32768, 8 * group, group=group))
        assert triton_decode.check(cfg, t.name, d) is cfg


@pytest.mark.parametrize("cfg,msg", [
    (TritonDecodeConfig(BLOCK_M=8), "BLOCK_M=8 with DOT=1: tensor-core products take at least 16"),
    (TritonDecodeConfig(BLOCK_M=24), "BLOCK_M=24: expected a power of two in 1..128"),
    (TritonDecodeConfig(BLOCK_M=4, DOT=False), "holds 256 products a thread, over 128"),
    (TritonDecodeConfig(SPLITS=0), "SPLITS=0: expected 1..256"),
    (TritonDecodeConfig(BLOCK_N=512), "BLOCK_N=512: expected a power of two in 16..256"),
    (TritonDecodeConfig(BLOCK_N=256, num_stages=5), "shared memory"),
])
def test_rules_name_the_limit(cfg, msg):
    with pytest.raises(ConfigError, match=msg):
        triton_decode.check(cfg, "sm90", 128)


def test_wgmma_tiles_count_every_stage_and_q_in_shared_memory():
    """From 64 rows on sm_90 the products are wgmma, which read K, V (all S stages) and Q
    from shared memory: the bound the rules use, and the default halves its key tiles
    where 128 rows at D = 256 would pass a block's shared memory."""
    wide = TritonDecodeConfig(BLOCK_M=64, BLOCK_N=64, num_stages=3)
    sm90, sm80 = get_target("sm90"), get_target("sm80")
    assert triton_decode.min_shared_bytes(wide, 128, "bfloat16", sm90) == 114688
    assert triton_decode.min_shared_bytes(wide, 128, "bfloat16", sm80) == 65536
    assert triton_decode.min_shared_bytes(wide.replace(BLOCK_M=32), 128, "bfloat16",
                                          sm90) == 65536
    deep = TritonDecodeConfig(BLOCK_N=128, num_stages=4)
    assert triton_decode.check(deep.replace(BLOCK_M=32), "sm90", 128)
    with pytest.raises(ConfigError, match="BLOCK_M=64, BLOCK_N=128.*shared memory"):
        triton_decode.check(deep.replace(BLOCK_M=64), "sm90", 128)
    wide256 = select(decode_problem(B=8, Nq=16, H=64, Hkv=8, D=256))
    assert (wide256.BLOCK_M, wide256.BLOCK_N) == (128, 32)  # 64-key tiles would not fit
    cut256 = select(decode_problem(B=8, Nq=16, H=64, Hkv=8, D=256, Nk=1024))
    assert (cut256.BLOCK_M, cut256.BLOCK_N) == (64, 64)  # cut rows: the table's key tiles
    assert triton_decode.check(wide256.replace(BLOCK_N=64), "sm80", 256)
    with pytest.raises(ConfigError, match="shared memory"):
        triton_decode.check(wide256.replace(BLOCK_N=64), "sm90", 256)


def test_reduce_path_within_its_register_bound_is_accepted():
    cfg = TritonDecodeConfig(BLOCK_M=1, DOT=False)
    assert triton_decode.check(cfg, "sm90", 128) is cfg
    assert cfg.label == "triton-decode 1x64 w4 s3 reduce"


def test_config_text_keeps_the_problems_defaults():
    p = decode_problem(B=1)
    cfg = config_from_text("triton-decode:BLOCK_N=32", p)
    assert cfg == select(p).replace(BLOCK_N=32)
    assert family("triton-decode") is triton_decode


def test_paged_launches_get_the_dense_pipeline_depth():
    cfg = TritonDecodeConfig(num_stages=3)
    assert triton_stages(cfg, False) == 3 and triton_stages(cfg, True) == 5
    assert triton_stages(cfg.replace(num_stages=1), True) == 1


def test_inspect_defaults_are_a_decoding_problem():
    cfg = fcompile.default_config("triton-decode", "sm90")
    B, H, Hkv, Nq, Nk = fcompile.DECODE_PROBLEM
    assert cfg == select(Problem("sm90", "bfloat16", 128, False, Nq, Nk, B * H,
                                 group=H // Hkv))


def test_decoding_kernels_build_offline():
    """The attention compiles without a GPU for an AMD target, and a 64-row tile for sm_90
    with the shared memory the wgmma bound counts (the sm_90 defaults of the dense and
    paged attention and the merge: tests/report/test_decode_report.py; ``flashscope
    inspect --kernel decode_append`` builds the append)."""
    wgmma = TritonDecodeConfig(BLOCK_M=64, SPLITS=4)
    items = [("", "gfx942", dict(kernel="triton-decode")),
             (wgmma.text, "sm90", dict(kernel="triton-decode"))]
    amd, wide = fcompile.run_clean(fcompile._build_task, items)  # one worker process
    for art, target in ((amd, "gfx942"), (wide, "sm90")):
        assert not isinstance(art, Exception), art
        assert art.kernel == "triton-decode" and art.target == target and art.binary
    assert wide.metadata["shared"] == triton_decode.min_shared_bytes(
        wgmma, 128, "bfloat16", get_target("sm90"))


def test_paged_16_row_tiles_at_d64_of_one_to_two_programs_an_sm_take_4_stages():
    args = dict(units=132, wgmma=False)
    assert paged_stages(3, 64, 128, 16, 256, key_tiles=256, splits=1, **args) == 4  # B = 32
    assert paged_stages(3, 64, 128, 16, 128, key_tiles=64, splits=16, **args) == 3  # B = 1
    assert paged_stages(3, 64, 128, 16, 512, key_tiles=64, splits=1, **args) == 2  # B = 64
    assert paged_stages(3, 64, 128, 16, 256, key_tiles=8, splits=8, **args) == 2  # a tile a split
    assert paged_stages(3, 128, 128, 16, 256, key_tiles=64, splits=1, **args) == 2  # D = 128
    assert paged_stages(3, 64, 128, 32, 256, key_tiles=64, splits=1, **args) == 2  # 32 rows
    assert paged_stages(3, 64, 128, 16, 512, 132, 64, 1, True) == 3  # wgmma: never shallow
    assert paged_stages(2, 64, 128, 16, 256, key_tiles=64, splits=1, **args) == 2  # AMD's 2


def test_paged_d64_select_takes_the_deeper_pipeline_between_one_and_two_programs_an_sm():
    for b, n_k, stages in ((1, 8192, 3), (8, 32768, 3), (32, 32768, 4), (64, 8192, 2)):
        p = Problem("sm90", "bfloat16", 64, True, 1, n_k, b * 32, group=4, paged=True)
        assert select(p).num_stages == stages, (b, n_k)
        dense = select(Problem("sm90", "bfloat16", 64, True, 1, n_k, b * 32, group=4))
        assert dense.num_stages == (4 if b == 64 else 3)
