"""Decoding against a KV cache (``flashscope.attention_with_kvcache``) against the float64
reference, on fresh random inputs each run.

On CPU the kernels run in Triton's interpreter on small shapes chosen so that every path
occurs: ragged lengths (0 and 1 included), Nq > 1 with causal masks, query rows that see
no key (zeros, log-sum-exp -inf), dense caches and pages handed out in random order
(a key tile inside one page of 16, 32 or 64 keys, a tile of four 8-key pages, and pages
of 5 keys that tiles straddle: the block table's three reads), appends that cross a page
boundary, GQA with a group that is not a power of two, MQA, windows, softcap, head dims
that need padding, fp16 and bf16, splits of the keys (with splits left empty by short
sequences), and the sm_90 default of a wide GQA tile cut into two row blocks. Every
allocation is NaN until written; the cache after an append is checked bit for bit
against the expected one; refused calls leave the cache as it was. GPU tests (``--device
cuda``) add the default configs on larger shapes, CUDA graphs and torch.compile.
"""

import itertools

import pytest
import torch

import flashscope
from flashscope import TritonDecodeConfig
from flashscope.errors import ConfigError, FlashscopeError
from flashscope.testing.inputs import fresh_seed, make_kvcache, nan_allocations
from flashscope.testing.reference import ERROR_BOUND, reference_kvcache, rel_error

SPLIT = TritonDecodeConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, SPLITS=3)
WHOLE = TritonDecodeConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)

# (B, Nq, H, Hkv, D, capacity, lens, page, n_new, causal, window, softcap, dtype, cfg)
CASES = [
    # GQA 2:1, ragged lengths with 0 and 1, dense, one query, splits
    (3, 1, 4, 2, 32, 80, [0, 1, 61], 0, 0, True, None, None, torch.float16, SPLIT),
    # group of 3, padded head dim, shuffled pages of 16, the append crosses a page
    (3, 3, 6, 2, 24, 96, [5, 14, 70], 16, 3, True, None, None, torch.bfloat16, SPLIT),
    # MQA, pages of 32, left window and softcap, an append from length 0
    (3, 2, 4, 1, 64, 96, [0, 31, 40], 32, 2, True, (8, -1), 5.0, torch.float16,
     SPLIT.replace(SPLITS=2)),
    # MHA, not causal, a two-sided window
    (2, 4, 2, 2, 32, 48, [9, 40], 0, 0, False, (5, 2), None, torch.bfloat16, WHOLE),
    # pages of 5 keys (a tile spans several), group of 4 packed into 16 rows
    (2, 4, 8, 2, 32, 40, [12, 3], 5, 4, True, None, None, torch.float16, WHOLE),
    # more queries than keys: the first rows see none (zeros, lse -inf)
    (2, 4, 2, 1, 32, 16, [0, 1], 0, 0, True, None, None, torch.float16, SPLIT),
    # 37 splits, more than the merge loads at once, 17 of them empty; a padded head dim
    # the merge covers in four column chunks; an empty sequence beside a long one
    (2, 2, 8, 1, 80, 640, [0, 600], 0, 0, True, None, None, torch.bfloat16,
     WHOLE.replace(SPLITS=37)),
    # 32-key tiles of four 8-key pages, lengths and an append off the page boundaries
    (2, 2, 4, 2, 32, 104, [37, 90], 8, 2, True, None, None, torch.bfloat16,
     TritonDecodeConfig(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=2, SPLITS=2)),
    # pages of 64 keys, two 32-key tiles each, not causal
    (2, 1, 4, 1, 16, 192, [100, 150], 64, 1, False, None, None, torch.float16,
     SPLIT.replace(BLOCK_N=32)),
    # the CUDA-core path (DOT=0): 2 packed rows, paged, an append, softcap, splits
    (2, 1, 4, 2, 24, 48, [0, 29], 16, 1, True, None, 5.0, torch.float16,
     TritonDecodeConfig(BLOCK_M=2, BLOCK_N=16, num_stages=1, DOT=False, SPLITS=2)),
    # the sm_90 default (what CPU calls select) for GQA 8:1 at 16 tokens on a short
    # cache: 128 packed rows cut into two 64-row blocks, 64-key tiles, 2 splits
    (2, 16, 16, 2, 16, 200, [150, 3], 16, 2, True, None, None, torch.bfloat16, None),
]


def _expected_cache(inp, lens, n_new):
    """The caches after appending inp.k, inp.v at each sequence's length."""
    kc, vc = inp.k_cache.clone(), inp.v_cache.clone()
    for b, n in enumerate(lens):
        for i in range(n_new):
            pos = n + i
            if inp.block_table is None:
                kc[b, pos], vc[b, pos] = inp.k[b, i], inp.v[b, i]
            else:
                page, row = int(inp.block_table[b, pos // kc.shape[1]]), pos % kc.shape[1]
                kc[page, row], vc[page, row] = inp.k[b, i], inp.v[b, i]
    return kc, vc


def check_decode(device, B, Nq, H, Hkv, D, capacity, lens, page, n_new, causal, window,
                 softcap, dtype, cfg):
    seed = fresh_seed()
    tag = (f"seed={seed} B={B} Nq={Nq} H={H}/{Hkv} D={D} lens={lens} page={page} "
           f"new={n_new} causal={causal} window={window} softcap={softcap} {dtype}")
    inp = make_kvcache(device, B, Nq, H, Hkv, D, capacity, lens=lens, page=page,
                       n_new=n_new, dtype=dtype, spare_pages=2 if page else 0)
    ref, ref_lse = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens,
                                     block_table=inp.block_table, k=inp.k, v=inp.v,
                                     is_causal=causal, window=window, softcap=softcap)
    want_k, want_v = _expected_cache(inp, lens, n_new)
    with nan_allocations():
        out, lse = flashscope.attention_with_kvcache(
            inp.q, inp.k_cache, inp.v_cache, **inp.kwargs(), is_causal=causal,
            window=window, softcap=softcap, return_lse=True, config=cfg)
    assert torch.equal(inp.k_cache, want_k) and torch.equal(inp.v_cache, want_v), \
        f"cache after the append ({tag})"
    assert out.shape == inp.q.shape and out.dtype == dtype
    assert not torch.isnan(out).any(), f"unwritten or NaN output ({tag})"
    err = rel_error(out, ref)
    assert err <= ERROR_BOUND[dtype], f"relative error {err:.2e} ({tag})"
    assert lse.shape == (B, H, Nq) and lse.dtype == torch.float32
    got = lse.double().cpu()
    want = ref_lse.cpu()
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)), f"-inf rows ({tag})"
    finite = torch.isfinite(want)
    assert finite.any() and (got - want)[finite].abs().max() < 2e-3, f"lse ({tag})"
    blind = torch.isneginf(want).permute(0, 2, 1)  # (B, Nq, H): rows that see no key
    assert bool((out.cpu()[blind] == 0).all()), f"rows that see no key ({tag})"


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_decode_matches_float64(device, case):
    check_decode(device, *case)


def test_splits_merge_to_the_unsplit_result(device):
    """The same call split in 1, 2 and 5 (more splits than key tiles) agrees."""
    fresh_seed()
    inp = make_kvcache(device, 2, 2, 4, 2, 32, 64, lens=[50, 7], dtype=torch.float16)
    outs = [flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache,
                                              **inp.kwargs(), config=WHOLE.replace(SPLITS=s))
            for s in (1, 2, 5)]
    for o in outs[1:]:
        assert (o.double() - outs[0].double()).abs().max() < 2e-3


def test_strided_views(device):
    """q, the caches, the new keys and the output's layout as views with no copy: q and
    k/v (B, H, N, D) seen through transpose(1, 2), the caches the first of two halves of
    a wider allocation; the append writes through the view, bit for bit."""
    seed = fresh_seed()
    dev = "cuda" if device == "cuda" else "cpu"
    B, Nq, H, Hkv, D, N, lens = 2, 2, 4, 2, 32, 40, [7, 30]

    def view(*shape):
        return torch.randn(*shape, device=dev).half()

    q = view(B, H, Nq, D).transpose(1, 2)
    k_cache, v_cache = (view(B, N, Hkv, 2 * D)[..., :D] for _ in range(2))
    k_new, v_new = (view(B, Hkv, 2, D).transpose(1, 2) for _ in range(2))
    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    kc, vc = k_cache.clone(), v_cache.clone()
    ref, _ = reference_kvcache(q, kc, vc, lens_t, k=k_new, v=v_new)
    with nan_allocations():
        out = flashscope.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens_t,
                                                k=k_new, v=v_new, config=SPLIT)
    for b, n in enumerate(lens):
        kc[b, n:n + 2], vc[b, n:n + 2] = k_new[b], v_new[b]
    assert torch.equal(k_cache, kc) and torch.equal(v_cache, vc), f"seed={seed}"
    assert out.stride() == q.stride() and not torch.isnan(out).any()
    assert rel_error(out, ref) <= ERROR_BOUND[torch.float16], f"seed={seed}"


@pytest.mark.parametrize("page", [0, 16])
def test_lengths_and_block_table_as_strided_views(device, page):
    """cache_seqlens every other value of a wider tensor, and a block table whose columns
    are every other one of a wider table (its rows a wider stride apart too), with an
    append: the kernels read them as they are laid out, not as packed int32 vectors."""
    seed = fresh_seed()
    lens = [50, 7, 30]
    inp = make_kvcache(device, 3, 2, 4, 2, 32, 64, lens=lens, page=page, n_new=2,
                       dtype=torch.float16)
    want_k, want_v = _expected_cache(inp, lens, 2)
    ref, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens,
                               block_table=inp.block_table, k=inp.k, v=inp.v)
    kw = inp.kwargs()
    wide = torch.full((3, 2), 63, dtype=torch.int32, device=inp.q.device)
    wide[:, 0] = inp.cache_seqlens
    kw["cache_seqlens"] = wide[:, 0]
    if page:
        table = inp.block_table
        spread = torch.full((table.shape[0], 2 * table.shape[1] + 3), -1, dtype=torch.int32,
                            device=table.device)
        spread[:, 0:2 * table.shape[1]:2] = table
        kw["block_table"] = spread[:, 0:2 * table.shape[1]:2]
        assert kw["block_table"].stride() == (spread.shape[1], 2)
    assert kw["cache_seqlens"].stride() == (2,)
    with nan_allocations():
        out = flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache, **kw)
    assert torch.equal(inp.k_cache, want_k) and torch.equal(inp.v_cache, want_v), \
        f"seed={seed}"
    assert not torch.isnan(out).any()
    assert rel_error(out, ref) <= ERROR_BOUND[torch.float16], f"seed={seed}"


def test_no_queries_still_appends(device):
    fresh_seed()
    inp = make_kvcache(device, 2, 0, 2, 1, 16, 32, lens=[3, 20], page=16, n_new=2)
    want_k, want_v = _expected_cache(inp, [3, 20], 2)
    out = flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache, **inp.kwargs())
    assert out.shape == (2, 0, 2, 16)
    assert torch.equal(inp.k_cache, want_k) and torch.equal(inp.v_cache, want_v)


def test_unused_table_entries_are_not_read(device):
    """Entries past a sequence's last page may hold anything (-1 padding, as servers
    fill them): accepted and never read."""
    fresh_seed()
    inp = make_kvcache(device, 2, 1, 2, 2, 16, 64, lens=[20, 3], page=16)
    inp.block_table[0, 2:] = -1
    inp.block_table[1, 1:] = 10 ** 6
    ref, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens,
                               block_table=inp.block_table)
    out = flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache, **inp.kwargs())
    assert rel_error(out, ref) <= ERROR_BOUND[torch.float16]


def _bad(device):
    """A valid paged call with an append, to be broken one argument at a time."""
    inp = make_kvcache(device, 2, 2, 4, 2, 16, 32, lens=[10, 20], page=16, n_new=2)
    return dict(q=inp.q, k_cache=inp.k_cache, v_cache=inp.v_cache, **inp.kwargs())


def _with(**changes):
    def edit(a):
        for name, fn in changes.items():
            a[name] = fn(a)
        return a
    return edit


def _set(name, index, value):
    def edit(a):
        t = a[name].clone()
        t[index] = value
        a[name] = t
        return a
    return edit


REFUSED = [
    (_set("block_table", (1, 1), 4), FlashscopeError, r"block_table\[1, 1\] = 4: expected a "
                                                      r"page in 0\.\.3"),
    (_set("block_table", (0, 0), -1), FlashscopeError, r"block_table\[0, 0\] = -1"),
    (_set("cache_seqlens", 1, 31), FlashscopeError, r"cache_seqlens\[1\] = 31: expected 0\.\.30 "
                                                    r"\(the cache holds 32 keys per sequence "
                                                    r"and 2 are appended\)"),
    (_set("cache_seqlens", 0, -1), FlashscopeError, r"cache_seqlens\[0\] = -1"),
    (_with(cache_seqlens=lambda a: a["cache_seqlens"].long()), TypeError,
     "cache_seqlens: expected dtype int32"),
    (_with(block_table=lambda a: a["block_table"].long()), TypeError,
     "block_table: expected dtype int32"),
    (_with(k_cache=lambda a: a["k_cache"].float()), TypeError, "k_cache: dtype torch.float32"),
    (_with(q=lambda a: a["q"][0]), FlashscopeError, r"q: expected rank 4 \(B, Nq, H, D\)"),
    (_with(v=lambda a: None), FlashscopeError, "k, v: give both"),
    (_with(k=lambda a: a["k"][:, :, :1], v=lambda a: a["v"][:, :, :1]), FlashscopeError,
     r"k: shape \(2, 2, 1, 16\), expected \(2, Nnew, 2, 16\)"),
    (_with(q=lambda a: a["q"][:, :, :3]), FlashscopeError, "2 kv heads must divide q's 3"),
    (_with(q=lambda a: a["q"][..., :8]), FlashscopeError, "head dim 16 does not match"),
    (_with(block_table=lambda a: a["block_table"][:1]), FlashscopeError,
     "block_table: 1 rows for q's batch of 2"),
    (_with(block_table=lambda a: None), FlashscopeError, "a paged cache needs block_table"),
    (_with(k=lambda a: a["k"][:, :1].expand(2, 40, 2, 16),
           v=lambda a: a["v"][:, :1].expand(2, 40, 2, 16)),
     FlashscopeError, "k: 40 new keys do not fit a cache of 32"),
    (_with(cache_seqlens=lambda a: a["cache_seqlens"].to("meta")), FlashscopeError,
     "cache_seqlens: on meta"),
    (_with(window=lambda a: (1, 2, 3)), FlashscopeError, "window: expected"),
    (_with(softcap=lambda a: -1.0), FlashscopeError, "softcap: expected a finite number > 0"),
    (_with(scale=lambda a: float("nan")), FlashscopeError, "scale: expected a finite"),
    (_with(config=lambda a: TritonDecodeConfig(BLOCK_M=8)), ConfigError,
     "BLOCK_M=8 with DOT=1"),
    (_with(config=lambda a: flashscope.TritonFwdConfig()), FlashscopeError,
     "a triton-fwd config is not one of triton-decode"),
]


@pytest.mark.parametrize("edit,error,message", REFUSED, ids=range(len(REFUSED)))
def test_refused_calls_name_the_argument_and_write_nothing(device, edit, error, message):
    """On the GPU the values are checked by check_kvcache (the call itself reads none)."""
    fresh_seed()
    args = edit(_bad(device))
    caches = args["k_cache"], args["v_cache"]
    before = [c.clone() for c in caches]
    call = flashscope.attention_with_kvcache if device == "cpu" else flashscope.check_kvcache
    with pytest.raises(error, match=message):
        call(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), **args)
    assert all(torch.equal(c, b) for c, b in zip(caches, before))


def test_check_kvcache_accepts_a_valid_call(device):
    args = _bad(device)
    assert flashscope.check_kvcache(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"),
                                    **args) is None


def test_paged_caches_get_their_own_default():
    """A paged cache's problem says so, and its default (one program an SM) is never the
    one remembered for a dense cache of the same tensor shapes."""
    from flashscope.kvcache import _default_config, problem_of
    from flashscope.families.triton_decode import Cache
    from flashscope.masks import Mask

    q = torch.zeros(8, 1, 32, 128, dtype=torch.bfloat16)
    kv = torch.zeros(8, 8192, 8, 128, dtype=torch.bfloat16)
    lens = torch.zeros(8, dtype=torch.int32)
    one_page = torch.zeros(8, 1, dtype=torch.int32)  # 8 pages of 8192 keys: dense's shape
    mask = Mask.of(True, (-1, -1), "bottom_right", None)
    dense, paged = Cache.of(kv, kv, lens), Cache.of(kv, kv, lens, one_page)
    assert not problem_of(q, dense, mask).paged and problem_of(q, paged, mask).paged
    # 64 work tiles on sm90: unsplit when dense, two splits (one program an SM) when paged
    assert (_default_config(q, dense, mask, 0.1).SPLITS,
            _default_config(q, paged, mask, 0.1).SPLITS) == (1, 2)


def test_paged_launches_take_two_stages_past_one_program_an_sm():
    """sm90, GQA 4:1, D = 128, 16-key pages: one query token for 64 sequences (512
    programs) and 8 splits of one key tile take 2 stages; 8 sequences at 8k keys (128
    programs of 32 tiles) keep 3, so do 16 query tokens (64-row wgmma tiles) and a dense
    cache, but for the dense 512 programs at 1k keys: 64-key tiles in 4 stages
    (``short_read_keys``)."""
    from flashscope.families.base import Problem
    from flashscope.families.triton_decode import select

    def stages(B, n_k, paged, n_q=1):
        return select(Problem("sm90", "bfloat16", 128, True, n_q, n_k, B * 32, group=4,
                              paged=paged)).num_stages

    assert [stages(64, 1024, True), stages(64, 8192, True), stages(1, 1024, True)] == [2] * 3
    assert [stages(8, 8192, True), stages(1, 8192, True), stages(8, 32768, True)] == [3] * 3
    assert [stages(64, 1024, True, 16), stages(1, 1024, False)] == [3, 3]
    assert stages(64, 1024, False) == 4


# -- GPU ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("Nq,Hkv,page", [(1, 8, 0), (4, 8, 16), (16, 4, 256), (1, 1, 64)])
def test_gpu_default_configs_match_float64(device, Nq, Hkv, page):
    """Default configs (splits chosen by the rule) on ragged lengths up to 4k keys."""
    lens = [0, 1, 777, 4000 - 16, 2049, 64]
    check_decode(device, len(lens), Nq, 32, Hkv, 128, 4000, lens, page, 16 if page else 0,
                 True, None, None, torch.bfloat16, None)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 96, 256])
def test_gpu_head_dims_and_windows(device, D):
    check_decode(device, 4, 4, 16, 4, D, 3000, [2999, 100, 0, 1500], 32, 1, True,
                 (256, -1), 30.0, torch.float16, None)


@pytest.mark.gpu
def test_gpu_paged_in_order_equals_dense(device):
    """A paged cache whose pages hold the dense cache in order gives the dense result."""
    fresh_seed()
    inp = make_kvcache(device, 4, 4, 32, 8, 128, 8192, lens=[8192, 5000, 17, 1],
                       dtype=torch.bfloat16)
    dense = flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache,
                                              **inp.kwargs())
    pages = inp.k_cache.view(-1, 64, 8, 128), inp.v_cache.view(-1, 64, 8, 128)
    table = torch.arange(4 * 128, device="cuda", dtype=torch.int32).view(4, 128)
    paged = flashscope.attention_with_kvcache(inp.q, *pages, cache_seqlens=inp.cache_seqlens,
                                              block_table=table)
    assert (paged.double() - dense.double()).abs().max() < 1e-2


@pytest.mark.gpu
def test_gpu_cuda_graph_replays_a_decoding_step(device):
    """One decoding step (append, attend) captured in a CUDA graph: no host sync inside;
    replays follow new queries and lengths written into the captured tensors."""
    fresh_seed()
    inp = make_kvcache(device, 8, 1, 32, 8, 128, 4096, lens=[100] * 8, page=64, n_new=1,
                       dtype=torch.bfloat16)
    step = lambda: flashscope.attention_with_kvcache(  # noqa: E731
        inp.q, inp.k_cache, inp.v_cache, **inp.kwargs())
    step()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for n in (200, 3000):
        inp.cache_seqlens.fill_(n)
        inp.q.copy_(torch.randn_like(inp.q))
        graph.replay()
        ref, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens + 1,
                                   block_table=inp.block_table)
        assert rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_torch_compile_without_graph_breaks(device):
    fresh_seed()
    inp = make_kvcache(device, 2, 2, 8, 2, 64, 512, lens=[10, 300], page=16, n_new=2)
    kc, vc = inp.k_cache.clone(), inp.v_cache.clone()
    ref, _ = reference_kvcache(inp.q, kc, vc, inp.cache_seqlens, block_table=inp.block_table,
                               k=inp.k, v=inp.v)

    def step(q, k_cache, v_cache, lens, table, k, v):
        return flashscope.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                                 block_table=table, k=k, v=v) * 2

    out = torch.compile(step, fullgraph=True)(inp.q, inp.k_cache, inp.v_cache,
                                              inp.cache_seqlens, inp.block_table, inp.k, inp.v)
    assert rel_error(out / 2, ref) <= ERROR_BOUND[torch.float16]
    want_k, _ = _expected_cache(inp._replace(k_cache=kc, v_cache=vc), [10, 300], 2)
    assert torch.equal(inp.k_cache, want_k)


# -- wide rows on the sm_90 forward ---------------------------------------------------------

def _forward_cfg(B, Nq, H, Hkv, D, capacity, causal=True, split=None):
    """The sm_90 forward's config the default would pick for these rows (the default
    itself routes only long caches: these tests pass it by hand); ``split``: SPLIT_KV
    forced on or off (default: the rule's, on for fewer row blocks than SMs)."""
    from flashscope.families.base import Problem
    from flashscope.kvcache import forward_config

    cfg = forward_config(Problem("sm90", "bfloat16", D, causal, Nq, capacity, B * H,
                                 group=H // Hkv))
    return cfg if split is None else cfg.replace(SPLIT_KV=split, BALANCE=False)


# (B, Nq, H, Hkv, D, capacity, lens, n_new, causal, window, softcap, dtype)
FORWARD_CASES = [
    # GQA 8:1 at 16 tokens (128 rows, a position every 8), sequences of 0 and 1 keys and
    # fewer keys than tokens (rows that see none), an append
    (4, 16, 64, 8, 128, 1000, [0, 1, 700, 9], 2, True, None, None, torch.bfloat16),
    # a group of 12 (rows of one position straddle the 64-row blocks), 48 rows, fp16
    (3, 4, 24, 2, 64, 300, [37, 250, 296], 3, True, None, None, torch.float16),
    # MQA, 8 query heads at 5 tokens, D = 256, a left window and softcap
    (2, 5, 8, 1, 256, 520, [129, 511], 2, True, (64, -1), 30.0, torch.bfloat16),
    # not causal, a two-sided window, lengths on and off the 128-key tiles
    (2, 16, 32, 4, 128, 2000, [1999, 64], 0, False, (100, 20), None, torch.float16),
    # not causal, no window: every tile whole but each sequence's last
    (4, 16, 64, 8, 128, 640, [639, 1, 300, 128], 1, False, None, None, torch.bfloat16),
    # split into 8 pieces of 16 key tiles: a long sequence and one of a single tile
    # (seven of its pieces hold no key), with the log-sum-exp
    (2, 16, 64, 8, 128, 8192, [8000, 100], 1, True, None, None, torch.bfloat16),
    # D = 256, 4 pieces, one sequence without keys
    (3, 8, 32, 2, 256, 4096, [0, 4000, 2100], 0, True, None, None, torch.float16),
    # D = 64, GQA 4:1 at 32 tokens, a sequence shorter than its tokens
    (3, 32, 16, 4, 64, 1500, [1400, 3, 640], 1, True, None, None, torch.float16),
    # GQA 8:1 at 4 tokens: 32 rows, one consumer's 64-row tile (a paged cache's default)
    (5, 4, 32, 4, 128, 3000, [2999, 0, 1, 1500, 17], 1, True, None, None, torch.bfloat16),
]


#: how the forward's programs find their row blocks: whole blocks or pieces from the
#: program index (as many programs as entries), or whole blocks through the
#: device-built list, longest first, with three programs taking several each
MODES = ["whole", "split", "listed"]


def _mode_cfg(monkeypatch, mode, B, Nq, H, Hkv, D, capacity, causal):
    """The config of ``mode`` (:data:`MODES`); "listed" runs on three SMs' worth of
    programs, with the launch plans and bound calls of the default grid set aside."""
    if mode == "listed":
        from flashscope import kvcache, launch
        from flashscope.families import sm90_fwd

        monkeypatch.setattr(launch, "sm_count", lambda device: 3)
        monkeypatch.setattr(sm90_fwd, "_PLANS", {})
        monkeypatch.setattr(kvcache, "_BOUND", {})
    return _forward_cfg(B, Nq, H, Hkv, D, capacity, causal, mode == "split")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", FORWARD_CASES, ids=range(len(FORWARD_CASES)))
def test_gpu_forward_rows_match_float64(device, case, mode, monkeypatch):
    """Decoding on the sm_90 forward (packed rows of G query heads a position, each
    sequence's keys in use from the device) against the float64 reference, each row
    block whole or cut along its keys (SPLIT_KV: pieces merged by a second kernel;
    where a sequence has fewer key tiles than pieces, some pieces hold none), found from
    the program index or from the list (:data:`MODES`)."""
    if device != "cuda":
        pytest.skip("the sm_90 forward runs on the GPU")
    B, Nq, H, Hkv, D, capacity, lens, n_new, causal, window, softcap, dtype = case
    cfg = _mode_cfg(monkeypatch, mode, B, Nq, H, Hkv, D, capacity, causal)
    check_decode(device, B, Nq, H, Hkv, D, capacity, lens, 0, n_new, causal, window,
                 softcap, dtype, cfg)


# (FORWARD_CASES index, keys a page): pages of 16 (8 a key tile) to 256 (2 tiles a page);
# 32 to 48 rows on 64-row tiles (1, 2, 8)
PAGED_CASES = [(0, 16), (3, 32), (5, 64), (6, 128), (4, 256), (1, 16), (2, 32), (8, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case,page", PAGED_CASES)
def test_gpu_forward_rows_read_paged_caches(device, case, page, mode, monkeypatch):
    """The sm_90 forward on a paged cache (pages handed out in random order, spare
    pages, appends across page boundaries, the table's last column past a sequence's
    last key tile) against the float64 reference, whole, cut and listed."""
    if device != "cuda":
        pytest.skip("the sm_90 forward runs on the GPU")
    B, Nq, H, Hkv, D, capacity, lens, n_new, causal, window, softcap, dtype = \
        FORWARD_CASES[case]
    cfg = _mode_cfg(monkeypatch, mode, B, Nq, H, Hkv, D, capacity, causal)
    check_decode(device, B, Nq, H, Hkv, D, capacity, lens, page, n_new, causal, window,
                 softcap, dtype, cfg)


@pytest.mark.gpu
def test_gpu_paged_forward_rows_read_only_their_pages(device):
    """Every page slot a sequence does not use holding NaN (spare pages, the slots past
    each length in its last page): the paged forward's output stays finite and matches
    the reference, whole and cut."""
    if device != "cuda":
        pytest.skip("the sm_90 forward runs on the GPU")
    fresh_seed()
    lens, page = [0, 5, 200, 997], 16
    inp = make_kvcache(device, 4, 16, 64, 8, 128, 1000, lens=lens, page=page,
                       dtype=torch.bfloat16, spare_pages=3)
    used = torch.zeros(inp.k_cache.shape[:2], dtype=torch.bool, device=device)
    for b, n in enumerate(lens):
        i = torch.arange(n, device=device)
        used[inp.block_table[b, i // page].long(), i % page] = True
    inp.k_cache[~used] = float("nan")
    inp.v_cache[~used] = float("nan")
    ref, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens,
                               block_table=inp.block_table)
    for split in (False, True):
        out = flashscope.attention_with_kvcache(
            inp.q, inp.k_cache, inp.v_cache, **inp.kwargs(),
            config=_forward_cfg(4, 16, 64, 8, 128, 1000, split=split))
        assert torch.isfinite(out).all() and rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
def test_gpu_forward_rows_never_read_past_the_lengths(device, fill):
    """Cache slots past each sequence's length holding NaN or infinity (a torch.empty
    cache) do not reach the output: their scores are masked and their values zeroed
    before the product (0 x NaN would be NaN), in both kernels."""
    if device != "cuda":
        pytest.skip("the sm_90 forward runs on the GPU")
    fresh_seed()
    lens = [0, 5, 200, 1000 - 3]
    inp = make_kvcache(device, 4, 16, 64, 8, 128, 1000, lens=lens, dtype=torch.bfloat16)
    for b, n in enumerate(lens):
        inp.k_cache[b, n:] = fill
        inp.v_cache[b, n:] = fill
    ref, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens)
    for cfg in (_forward_cfg(4, 16, 64, 8, 128, 1000, split=False),
                _forward_cfg(4, 16, 64, 8, 128, 1000, split=True), None):
        out = flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache,
                                                **inp.kwargs(), config=cfg)
        assert torch.isfinite(out).all() and rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_forward_rows_replay_in_a_cuda_graph(device):
    """A decoding step on the sm_90 forward (append, q packed, the device-built list,
    attend, output unpacked) captured in a CUDA graph: replays follow new queries and
    lengths written into the captured tensors."""
    if device != "cuda":
        pytest.skip("the sm_90 forward runs on the GPU")
    fresh_seed()
    inp = make_kvcache(device, 4, 16, 64, 8, 128, 1024, lens=[100] * 4, n_new=1,
                       dtype=torch.bfloat16)
    cfg = _forward_cfg(4, 16, 64, 8, 128, 1024)
    step = lambda: flashscope.attention_with_kvcache(  # noqa: E731
        inp.q, inp.k_cache, inp.v_cache, **inp.kwargs(), config=cfg)
    step()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for n in (200, 1000):
        inp.cache_seqlens.copy_(torch.tensor([n, 5, n - 7, 0], dtype=torch.int32))
        inp.q.copy_(torch.randn_like(inp.q))
        graph.replay()
        ref, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens + 1)
        assert rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_forward_rows_under_torch_compile(device):
    """A shape the default sends to the sm_90 forward (64 sequences, GQA 8:1 at 16
    tokens, 1024-key caches), one new key appended, through torch.compile without graph
    breaks: the custom op's path takes the route too and matches the reference."""
    from flashscope import kvcache
    from flashscope.masks import Mask

    if device != "cuda" or launch_target() != "sm90":
        pytest.skip("an sm_90 GPU")
    fresh_seed()
    inp = make_kvcache(device, 64, 16, 64, 8, 128, 1024, lens=[1000] * 63 + [0], n_new=1,
                       dtype=torch.bfloat16)
    cache = kvcache.Cache.of(inp.k_cache, inp.v_cache, inp.cache_seqlens)
    mask = Mask.of(True, None, "bottom_right", None)
    assert isinstance(kvcache._default_config(inp.q, cache, mask, 0.1), kvcache.Sm90FwdConfig)
    kc, vc = inp.k_cache.clone(), inp.v_cache.clone()
    ref, _ = reference_kvcache(inp.q, kc, vc, inp.cache_seqlens, k=inp.k, v=inp.v)

    def step(q, k_cache, v_cache, lens, k, v):
        return flashscope.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                                 k=k, v=v)

    out = torch.compile(step, fullgraph=True)(inp.q, inp.k_cache, inp.v_cache,
                                              inp.cache_seqlens, inp.k, inp.v)
    assert rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16]


def test_forward_rows_read_q_in_place_where_the_group_divides_64():
    """The route reads q and writes the output where they are (rank-5 descriptors over
    (B, Nq, Hkv, G, D)) when G divides 64 and TMA can address both; a group of 12, an
    output column stride of 2 or a log-sum-exp whose tokens are not adjacent take the
    packed copies instead."""
    from flashscope.kvcache import _grouped

    q = torch.empty(2, 16, 64, 128, dtype=torch.bfloat16)
    lse = torch.empty(2, 64, 16)
    assert _grouped(q, torch.empty_like(q), lse, 8) and _grouped(q, q, None, 1)
    assert _grouped(q.transpose(1, 2).contiguous().transpose(1, 2), q, lse, 4)
    q12 = torch.empty(2, 16, 24, 64, dtype=torch.bfloat16)
    assert not _grouped(q12, q12, None, 2)
    wide = torch.empty(2, 16, 64, 256, dtype=torch.bfloat16)[..., ::2]
    assert not _grouped(q, wide, None, 8)
    assert not _grouped(q, q, lse.transpose(1, 2).contiguous().transpose(1, 2), 8)


@pytest.mark.parametrize("block_m,page,loaders",
                         [(128, 0, 1), (128, 16, 2), (128, 64, 2), (128, 128, 1),
                          (128, 256, 1), (64, 16, 1), (192, 16, 1)])
def test_paged_forward_rows_bring_values_with_a_second_loader(block_m, page, loaders):
    """Pages smaller than the route's 128-key tile take a TMA copy a page: beside two
    consumers their builds load V from a second one-warp producer (LOADERS = 2, 40
    registers each); dense caches, pages of a key tile or more and other consumer counts
    keep one."""
    from flashscope import compile as fc

    cfg = flashscope.Sm90FwdConfig(BLOCK_M=block_m, BLOCK_N=128, MASKED_FIRST=False)
    _, consts = fc._decode_rows_call(cfg, (8, 64, 8, 16, 8192), 128, "bfloat16", True,
                                     page=page or None)
    assert consts["LOADERS"] == loaders
    assert consts["PRODUCER_REGS"] == (40 if loaders == 2 else 24)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_gpu_forward_rows_in_place_on_strided_views(device, split):
    """q a (B, H, Nq, D) tensor seen as (B, Nq, H, D), read in place by the rank-5
    descriptors, and a group of 16 (4 tokens a 64-row block, 20 tokens: the last block
    half past them), whole and cut: output (laid out like q, NaN until written) and
    log-sum-exp against the float64 reference."""
    from flashscope import kvcache

    if device != "cuda" or launch_target() != "sm90":
        pytest.skip("an sm_90 GPU")
    fresh_seed()
    B, Nq, H, Hkv, D = 3, 20, 32, 2, 128
    inp = make_kvcache(device, B, Nq, H, Hkv, D, 2048, lens=[2000, 0, 700],
                       dtype=torch.bfloat16)
    q = inp.q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q.is_contiguous() and kvcache._grouped(q, q, None, Hkv)
    ref, ref_lse = reference_kvcache(q, inp.k_cache, inp.v_cache, inp.cache_seqlens)
    cfg = _forward_cfg(B, Nq, H, Hkv, D, 2048, split=split)
    with nan_allocations():
        out, lse = flashscope.attention_with_kvcache(q, inp.k_cache, inp.v_cache,
                                                     **inp.kwargs(), return_lse=True,
                                                     config=cfg)
    assert out.stride() == q.stride() and not torch.isnan(out).any()
    assert rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16]
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse.double()).cpu(), torch.isneginf(ref_lse).cpu())
    assert (lse.double() - ref_lse.to(lse.device))[finite].abs().max() < 2e-3


@pytest.mark.gpu
def test_gpu_wide_rows_default_to_the_forward(device):
    """GQA 8:1 at 16 tokens on 17 sequences of 8192-key caches (136 row blocks: one an
    SM) defaults to the sm_90 forward on a dense cache, and to the decoding kernel when
    the sequences do not lie one stride apart; both match the reference. A paged cache
    of 64-key pages defaults to the forward, one of 24-key pages to the decoding
    kernel."""
    from flashscope import kvcache
    from flashscope.masks import Mask

    if device != "cuda" or launch_target() != "sm90":
        pytest.skip("an sm_90 GPU")
    fresh_seed()
    lens = [int(x) for x in torch.randint(0, 8192, (17,))]
    inp = make_kvcache(device, 17, 16, 64, 8, 128, 8192, lens=lens, dtype=torch.bfloat16)
    mask = Mask.of(True, None, "bottom_right", None)
    cache = kvcache.Cache.of(inp.k_cache, inp.v_cache, inp.cache_seqlens)
    assert isinstance(kvcache._default_config(inp.q, cache, mask, 0.1), kvcache.Sm90FwdConfig)
    wide = inp.k_cache.new_zeros(17, 8200, 8, 128)[:, :8192]  # sequences 8200 keys apart
    wide.copy_(inp.k_cache)
    strided = kvcache.Cache.of(wide, wide, inp.cache_seqlens)
    assert "k_cache" in kvcache.forward_layout(inp.q, strided, 0.1)
    ref, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens)
    out = flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache, **inp.kwargs())
    assert rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16]
    out = flashscope.attention_with_kvcache(inp.q, wide, inp.v_cache, **inp.kwargs())
    assert rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16]
    # the same keys in 64-key pages take the route too, and a 24-key page does not
    for page, routed in ((64, True), (24, False)):
        n_pages = 17 * -(-8192 // page)
        pk = inp.k_cache.new_empty(n_pages, page, 8, 128)
        table = torch.arange(n_pages, device=device, dtype=torch.int32).view(17, -1)
        paged = kvcache.Cache.of(pk, pk, inp.cache_seqlens, table)
        cfg = kvcache._default_config(inp.q, paged, mask, 0.1)
        assert isinstance(cfg, kvcache.Sm90FwdConfig) == routed, page


@pytest.mark.gpu
def test_gpu_long_caches_of_few_sequences_default_to_the_cut_forward(device):
    """Two sequences of GQA 8:1 at 16 tokens in 128k-key slots (16 row blocks, 8 pieces
    each) default to the sm_90 forward cut along the keys; lengths long, short and
    empty across two calls match the reference."""
    from flashscope import kvcache
    from flashscope.masks import Mask

    if device != "cuda" or launch_target() != "sm90":
        pytest.skip("an sm_90 GPU")
    fresh_seed()
    inp = make_kvcache(device, 2, 16, 64, 8, 128, 131072, lens=[131000, 70000],
                       dtype=torch.bfloat16)
    cache = kvcache.Cache.of(inp.k_cache, inp.v_cache, inp.cache_seqlens)
    cfg = kvcache._default_config(inp.q, cache, Mask.of(True, None, "bottom_right", None),
                                  0.1)
    assert isinstance(cfg, kvcache.Sm90FwdConfig) and cfg.SPLIT_KV
    for lens in ([131000, 70000], [0, 300]):
        inp.cache_seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        ref, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens)
        out = flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache,
                                                **inp.kwargs())
        assert rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16], lens


@pytest.mark.gpu
@pytest.mark.parametrize("B,Nq,H,page,n,routed", [
    (3, 4, 32, 16, 2048, True),    # paged, each block cut in 4 pieces
    (3, 4, 16, 16, 2048, False),   # 16 rows, 11 SMs a block
    (2, 4, 32, 16, 1024, False),   # paged, read whole with 16 SMs a block
    (12, 4, 32, 0, 1024, True),    # dense, read whole with 2 SMs a block, 3 stages
    (3, 4, 32, 0, 1024, False),    # dense, 11 SMs a block
    (12, 4, 16, 16, 1024, True),   # 16 rows, read whole with 2 SMs a block
    (12, 1, 32, 0, 1024, True),    # one token, 8 rows
    (12, 1, 4, 16, 1024, True),    # one token, one head a kv head
    (34, 1, 32, 0, 1024, False),   # one token on more blocks than SMs
])
def test_gpu_narrow_rows_default_to_the_forward(device, B, Nq, H, page, n, routed):
    """Up to 32 rows of 4 kv heads default to the sm_90 forward on one consumer's 64-row
    tile where :func:`~flashscope.families.triton_decode.narrow_rows` takes them, else
    to the decoding kernel; each matches the reference on ragged lengths (empty and full
    sequences among them)."""
    from flashscope import kvcache
    from flashscope.masks import Mask

    if device != "cuda" or launch_target() != "sm90":
        pytest.skip("an sm_90 GPU")
    fresh_seed()
    lens = [(n - 1, 0, 700, n)[b % 4] for b in range(B)]
    inp = make_kvcache(device, B, Nq, H, 4, 128, n, lens=lens, page=page,
                       dtype=torch.bfloat16)
    cache = kvcache.Cache.of(inp.k_cache, inp.v_cache, inp.cache_seqlens, inp.block_table)
    cfg = kvcache._default_config(inp.q, cache, Mask.of(True, None, "bottom_right", None),
                                  0.1)
    assert isinstance(cfg, kvcache.Sm90FwdConfig) == routed
    assert not routed or (cfg.BLOCK_M == 64 and not cfg.PINGPONG)
    assert not routed or page or cfg.num_stages == kvcache.WHOLE_READ_STAGES
    ref, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens,
                               block_table=inp.block_table)
    out = flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache, **inp.kwargs())
    assert rel_error(out, ref) <= ERROR_BOUND[torch.bfloat16]


def launch_target():
    from flashscope.launch import device_target

    return device_target(torch.device("cuda"))


def test_wide_rows_rule():
    """The rule sending decoding to the sm_90 forward: sm_90, D = 64, 128 or 256, 128
    packed rows or more, and 3072 keys or more for each of the 132 SMs to read across
    the row blocks, whole or (fewer blocks than SMs) cut along their keys (SPLIT_KV)
    into the pieces the SMs leave each block (4 key tiles at least; a read under 32 key
    tiles into 4 pieces or none); or 17-32 rows of a group dividing 64 on one consumer's
    64-row tile: dense where the forward reads each block whole with fewer than 3 SMs to
    itself (D = 64: no more blocks than SMs), paged unless it reads each whole with 8 or
    more; whole reads of grids of at most half the SMs in 3 stages."""
    from flashscope.families.base import Problem
    from flashscope.families.sm90_fwd import packed_pieces
    from flashscope.families.triton_decode import forward_blocks, forward_rows
    from flashscope.kvcache import forward_config

    def problem(B, Nq=16, H=64, Hkv=8, D=128, paged=False, target="sm90", n_k=8192):
        return Problem(target, "bfloat16", D, True, Nq, n_k, B * H, group=H // Hkv,
                       paged=paged)

    def wide(*args, **kw):
        return forward_rows(problem(*args, **kw))

    # 8 row blocks a sequence: 64 x 8 x 1024 keys over 132 SMs is 3971 an SM
    assert wide(64, n_k=1024) and wide(17) and wide(64, D=256) and wide(64, D=64)
    assert wide(32, n_k=2048) and wide(16, n_k=4096) and not wide(16, n_k=2048)
    assert not wide(32, n_k=1024) and not wide(64, n_k=512)
    # fewer row blocks than SMs, cut into pieces: the same count of keys an SM
    assert wide(8) and wide(2, n_k=32768) and wide(1, n_k=65536)
    assert not wide(1, n_k=32768) and not wide(8, n_k=4096)
    assert not wide(64, Nq=8)  # 64 rows
    assert wide(64, paged=True)  # the page size is the layout's to check
    # a paged cache of 17-32 rows of a group dividing 64, at any length and batch but
    # read whole with 8 SMs or more a block
    assert wide(64, Nq=4, paged=True) and wide(1, Nq=3, paged=True, n_k=2048)
    assert not wide(1, Nq=3, paged=True, n_k=1024) and not wide(2, Nq=4, paged=True,
                                                                n_k=1024)
    assert wide(3, Nq=4, paged=True, n_k=1024) and wide(1, Nq=4, paged=True)
    # a dense one where each block is read whole (under 32 key tiles, fewer than 4 SMs
    # a block) with fewer than 3 SMs to itself
    assert wide(6, Nq=4, n_k=3072) and wide(8, Nq=4, n_k=3968) and wide(128, Nq=4, n_k=768)
    assert not wide(5, Nq=4, n_k=1024) and not wide(8, Nq=4, n_k=4096)
    assert wide(16, Nq=4, D=64, n_k=2048) and not wide(17, Nq=4, D=64, n_k=1024)
    assert wide(8, Nq=4, D=256, n_k=1024) and not wide(8, Nq=4, D=256, n_k=2048)
    assert wide(8, Nq=8, H=32, n_k=1024) and wide(8, Nq=3, n_k=1024)
    assert not wide(8, Nq=2, H=96, n_k=1024)  # a group of 12
    stages = {B: forward_config(problem(B, Nq=4, n_k=1024)).num_stages for B in (6, 8, 9, 64)}
    assert stages == {6: 3, 8: 3, 9: 2, 64: 2}  # 48 and 64 blocks of 132 SMs, 72, 512
    assert forward_config(problem(1, Nq=4, paged=True)).num_stages == 2  # cut in 16
    assert wide(64, Nq=8, H=32, D=64, paged=True) and wide(8, Nq=4, paged=True, D=256)
    assert wide(64, Nq=2, H=16, Hkv=1, paged=True)  # MQA of 16 heads at 2 tokens
    assert not wide(64, Nq=2, paged=True)  # 16 rows on more blocks than SMs
    # up to 16 rows, dense or paged: read whole on more blocks than a third of the SMs,
    # no more than the SMs
    assert wide(6, Nq=1, H=32, n_k=1024) and wide(16, Nq=2, n_k=2048, paged=True)
    assert not wide(5, Nq=1, H=32, n_k=1024) and not wide(17, Nq=1, H=32, n_k=1024)
    assert not wide(8, Nq=1, H=32, n_k=4096) and wide(8, Nq=1, H=8, Hkv=8, n_k=1024)
    assert not wide(1, Nq=5, paged=True, n_k=1024)  # 40 rows: this family's wgmma tiles
    assert not wide(64, Nq=2, H=96, paged=True)  # a group of 12: q copied
    assert not wide(64, Nq=4) and not wide(64, Nq=4, paged=True, D=96)  # 64 tiles
    # up to 64 rows on one consumer's tile, without the two consumers' ping-pong
    for D in (64, 128, 256):
        cfg = forward_config(problem(64, Nq=4, D=D, paged=True))
        assert cfg.BLOCK_M == 64 and not cfg.PINGPONG, D
    assert forward_config(problem(64, Nq=8, D=64)).BLOCK_M == 64
    assert forward_config(problem(64, Nq=16, D=64)).BLOCK_M == 128
    assert not wide(64, D=96) and not wide(64, target="sm80")
    assert wide(5, Nq=32, H=256, Hkv=32)  # 5 x 32 kv heads of 256 rows
    assert forward_blocks(problem(5, Nq=32, H=256, Hkv=32)) == 5 * 32 * 2
    assert [forward_config(problem(B)).SPLIT_KV for B in (1, 8, 16, 17, 64)] == [
        True, True, False, False, False]
    assert not forward_config(problem(1)).BALANCE
    # SMs a block, at least 4 key tiles a piece
    assert [packed_pieces(b, 64, 132) for b in (8, 16, 64, 128, 132, 200)] == [
        16, 8, 2, 1, 1, 1]
    assert packed_pieces(8, 20, 132) == 5 and packed_pieces(8, 3, 132) == 1
    # a read of fewer than 32 key tiles in 4 pieces or more, or none
    assert [packed_pieces(b, t, 132) for b, t in ((64, 8), (44, 12), (64, 24))] == [1] * 3
    assert packed_pieces(32, 16, 132) == 4 and packed_pieces(64, 32, 132) == 2


def test_split_plan_sizes_its_merge_and_workspace_and_lists_only_crowded_grids():
    """A decoding call's SPLIT_KV plan (meta tensors: nothing runs): 2 sequences x 8 kv
    heads of 128 packed rows over 8192-key slots, 16 row blocks on 132 SMs: 8 pieces a
    block, one program a piece, entries from the program index (no list: the kernel
    reads the cache's lengths, LPT = 0, with the appended keys and the pieces as
    arguments), a merge row per block naming its 8 slots, and BLOCK_M x (D + 2) floats
    a slot; without SPLIT_KV, none of it. A batch of more row blocks than programs
    (40 x 8 = 320 on 132) takes the device-built list of 5 fields, longest first."""
    from flashscope import launch
    from flashscope.families import sm90_fwd
    from flashscope.masks import Mask

    def plan(B, cfg):
        q = torch.empty(1, Hkv, B * rows, D, device="meta", dtype=torch.bfloat16)
        kv = torch.empty(1, Hkv, B * cap, D, device="meta", dtype=torch.bfloat16)
        cu = [torch.empty(B + 1, dtype=torch.int32, device="meta") for _ in range(2)]
        used = torch.empty(B, dtype=torch.int32, device="meta")
        packed = launch.Packed(*cu, rows, cap, seqused_k=used, added_k=1, row_group=8)
        mask = Mask.of(True, None, "bottom_right", None)
        p = sm90_fwd.plan(q, kv, kv, q, None, mask=mask, scale=0.1, cfg=cfg,
                          packed=packed)
        return p, packed, p.args(q, kv, kv, q, None, sched=p.packed_list(packed))

    B, Hkv, rows, D, cap = 2, 8, 128, 128, 8192
    cfg = _forward_cfg(B, 16, 64, Hkv, D, cap)
    assert cfg.SPLIT_KV
    split, packed, args = plan(B, cfg)
    assert split.consts["SPLIT"] and split.consts["VARLEN"] and split.consts["CACHE"]
    assert split.consts["LPT"] == 0 and split.cache == (1, 8) and args[-2:] == (1, 8)
    assert split.packed == (B, Hkv, 1, 16 * 8, 128, 8) and split.grid == (128,)
    assert split.packed_list(packed) is packed.seqused_k and args[5] is packed.seqused_k
    assert split.split.slots == 128
    assert split.workspace(torch.empty(0, device="meta")).numel() == 128 * 128 * 130
    assert split.split.merges.shape == (16, 3)
    whole, packed, args = plan(B, cfg.replace(SPLIT_KV=False))
    assert whole.split is None and whole.packed == (B, Hkv, 1, 16, 16, 1)
    assert whole.consts["LPT"] == 0 and whole.cache == (1, 1) and whole.grid == (16,)
    crowded, packed, args = plan(40, cfg.replace(SPLIT_KV=False))
    assert crowded.consts["LPT"] == 2 and crowded.cache == (0, 1) and args[-2:] == (0, 1)
    assert crowded.grid == (132,) and crowded.packed == (40, Hkv, 1, 320, 132, 1)
    assert args[5].numel() == 133 + 5 * 320


def test_forward_config_is_refused_where_it_cannot_run(device):
    """An sm_90 forward's config passed for a call it cannot run (CPU tensors here; a
    paged cache, a head dim with a tail, MASKED_FIRST) is refused naming ``config``."""
    from flashscope.kvcache import forward_config
    from flashscope.families.base import Problem

    if device != "cpu":
        pytest.skip("CPU tensors under the interpreter")

    cfg = forward_config(Problem("sm90", "bfloat16", 64, True, 16, 96, 2 * 16, group=8))
    assert not cfg.MASKED_FIRST and cfg.BLOCK_M == 128
    inp = make_kvcache("cpu", 2, 16, 16, 2, 64, 96, lens=[3, 50])
    with pytest.raises(FlashscopeError, match="config: sm90-fwd cannot run this call: it "
                       "runs on an sm_90 GPU"):
        flashscope.attention_with_kvcache(inp.q, inp.k_cache, inp.v_cache, **inp.kwargs(),
                                          config=cfg)
    # what the GPU's checks refuse after the layout's (the kernel's static assertions)
    from flashscope.families.sm90_fwd import check_cache

    check_cache(cfg, 64)
    with pytest.raises(ConfigError, match="MASKED_FIRST=1 reads a sequence's last key"):
        check_cache(cfg.replace(MASKED_FIRST=True), 64)
    with pytest.raises(ConfigError, match="head dim 80 against a KV cache"):
        check_cache(cfg, 80)
    check_cache(cfg, 64, 16)
    check_cache(cfg, 64, 512)
    for page in (8, 48, 100):
        with pytest.raises(ConfigError, match=f"pages of {page} keys: expected a power"):
            check_cache(cfg, 64, page)


def test_equal_call_keys_mean_equal_checks(monkeypatch):
    """A call whose :func:`flashscope.kvcache._call_key` was seen before skips the checks
    on the GPU (which read no values there): equal keys must mean the same refusal or the
    same cache, appended keys, mask, scale and config. The refused calls above, keywords
    of another type with equal values, a cache of another shape with the key's strides."""
    from flashscope import kvcache

    monkeypatch.setattr(kvcache, "check_device", lambda name, dev: None)
    monkeypatch.setattr(kvcache, "_check_values", lambda cache, n_new: None)
    base = _bad("cpu")
    variants = {"base": base, "fresh": _bad("cpu")}
    for i, (edit, _, _) in enumerate(REFUSED):
        variants[f"refused {i}"] = edit(dict(base))
    variants["v_cache view"] = dict(base, v_cache=base["v_cache"].clone()[:3])
    variants["dense"] = dict(base, block_table=None, k_cache=base["k_cache"][:2],
                             v_cache=base["v_cache"][:2])
    keywords = [dict(), dict(is_causal=1), dict(is_causal=False), dict(scale=1),
                dict(scale=1.0), dict(scale=True), dict(window=(4, 0)), dict(window=[4, 0]),
                dict(softcap=5), dict(softcap=5.0), dict(return_lse=True),
                dict(return_lse=1), dict(config=WHOLE)]
    seen = {}
    for (name, a), kw in itertools.product(variants.items(), keywords):
        a = dict(a, **kw)
        args = [a.pop(n) for n in ("q", "k_cache", "v_cache", "cache_seqlens")]
        args += [a.pop(n, None) for n in ("k", "v", "block_table")]
        key = kvcache._call_key(*args, a.get("is_causal", True), a.get("scale"),
                                a.get("window"), a.get("softcap"),
                                a.get("return_lse", False), a.get("config"))
        if key is None:
            continue
        try:
            cache, n_new, mask, cfg = kvcache._checked(
                *args[:4], args[4], args[5], args[6], a.get("is_causal", True),
                a.get("scale"), a.get("window"), a.get("softcap"),
                a.get("return_lse", False), a.get("config"))
            got = (cache.page, cache.capacity, cache.pages, n_new, mask, cfg,
                   a.get("scale"))
        except (TypeError, ValueError) as e:
            got = (type(e).__name__, str(e))
        if key in seen:
            assert seen[key][1] == got, f"{name} {kw} and {seen[key][0]}: one key"
        seen[key] = ((name, kw), got)
    assert len(seen) >= 200  # the calls that differ in geometry or keywords, keyed apart
    assert 0 < sum(isinstance(g[0], str) for _, g in seen.values()) < len(seen)


@pytest.mark.gpu
def test_gpu_repeated_calls_take_the_bound_record(device):
    """Later calls of one geometry launch from the record the first call bound (no
    checks, no plan lookup): fresh caches, lengths and appended keys each time, dense
    and paged, still match the float64 reference and append bit for bit."""
    from flashscope import kvcache

    if device != "cuda":
        pytest.skip("bound records are for GPU tensors")
    for page in (0, 16):
        before = set(kvcache._BOUND)
        for _ in range(3):
            check_decode(device, 3, 2, 8, 2, 64, 96, [0, 1, 50], page, 2, True, None, None,
                         torch.bfloat16, None)
        assert len(set(kvcache._BOUND) - before) == 1
