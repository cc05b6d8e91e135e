"""``flashscope bench --suite decode``: the suite as data, the decoding runner's checks
(planted cheats fail with their fault named, an honest provider passes), GB/s and the
fraction of the copy bandwidth, and the real flashscope providers through the
interpreter."""

import json

import pytest
import torch

from flashscope.bench import decode
from flashscope.bench.decode import COPY, DECODE, DecodeCase, suite_cases
from flashscope.bench.harness import run_bench
from flashscope.bench.providers import provider, select
from flashscope.bench.timing import Timer
from flashscope.cli import main
from flashscope.testing.reference import reference_kvcache

CASE = DecodeCase(2, 4, 2, 64, 16, 2, True, "float16")


def test_suite_covers_the_issue_grid():
    cases = suite_cases()
    assert len(cases) == 96 and all(isinstance(c, DecodeCase) and c.causal for c in cases)
    d128 = [c for c in cases if c.D == 128]
    assert {c.Nq for c in d128} == {1, 4, 16} and {c.B for c in d128} == {1, 8, 64}
    assert {c.Nk for c in d128} == {1024, 8192, 32768, 131072}
    assert {c.H // c.Hkv for c in d128} == {4, 8} and len(d128) == 72
    assert {c.D for c in cases} == {64, 128, 256}
    assert all(c.Nk % decode.PAGE_SIZE == 0 for c in cases)
    assert {c.D for c in suite_cases(head_dims=[256])} == {256}
    short = suite_cases(head_dims=[128], lengths=[1024, 8192])
    assert {c.Nk for c in short} == {1024, 8192} and len(short) == 36
    big = max(cases, key=lambda c: c.kv_bytes)
    assert big.kv_bytes == 2 * 64 * 131072 * 8 * 128 * 2  # 32 GiB: one copy fits an H100


def _reg(**builds):
    reg = {}
    for name, build in builds.items():
        provider(name, description=name, layout="bnhd", has_backward=False,
                 available=lambda device: None, registry=reg)(build)
    return reg


def _truth(inp):
    return reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.seqlens)[0].half()


def honest(case, options):
    return lambda inp: ((lambda: _truth(inp)), "dense")


def stale(case, options):
    memo = []

    def prepare(inp):
        def step():
            if not memo:
                memo.append(_truth(inp))
            return memo[0]
        return step, "dense"
    return prepare


def writes_cache(case, options):
    def prepare(inp):
        def step():
            inp.v_cache[0, 0, 0, 0] += 1
            return _truth(inp)
        return step, "dense"
    return prepare


def lazy_when_timed(case, options):
    calls = []

    def prepare(inp):
        def step():
            calls.append(1)
            return _truth(inp) if len(calls) <= 2 else torch.zeros_like(inp.q)
        return step, "dense"
    return prepare


def paged_answer(case, options):  # the right answer to the other cache
    def prepare(inp):
        return (lambda: reference_kvcache(inp.q, *inp.pages, inp.seqlens,
                                          block_table=inp.table)[0].half()), "dense"
    return prepare


def _run(reg, **kw):
    timer = Timer(device="cpu", cpu_reps=2)
    return run_bench([CASE], list(reg.values()), device="cpu", timer=timer, odd_shapes=False,
                     runner=decode.DecodeRunner, **kw)


def test_cheats_fail_with_their_fault_named():
    reg = _reg(copy=DECODE[COPY].build, honest=honest, stale=stale, writes=writes_cache,
               lazy=lazy_when_timed, paged=paged_answer)
    res = {r.provider: r for r in _run(reg)[0]}
    assert res["honest"].status == "ok" and res["honest"].max_rel_error < 1e-3
    assert "stale result" in res["stale"].reason
    assert "modified its inputs" in res["writes"].reason
    assert "last timed call" in res["lazy"].reason
    assert "relative error" in res["paged"].reason
    for name in ("stale", "writes", "lazy", "paged"):
        assert res[name].status == "failed" and res[name].ms is None


def test_bandwidth_is_against_the_copy_of_the_same_case():
    res = {r.provider: r for r in _run(_reg(copy=DECODE[COPY].build, honest=honest))[0]}
    copy, subject = res["copy"], res["honest"]
    assert copy.status == "ok" and copy.pct_copy == pytest.approx(100.0)
    assert copy.gbps == pytest.approx(2 * CASE.kv_bytes / (copy.ms * 1e-3) / 1e9)
    assert subject.gbps == pytest.approx(CASE.kv_bytes / (subject.ms * 1e-3) / 1e9)
    assert subject.pct_copy == pytest.approx(100 * subject.gbps / copy.gbps)


@pytest.mark.interpreter
def test_flashscope_dense_and_paged_pass_validation():
    provs = select(["copy", "flashscope", "flashscope-paged"], registry=DECODE)
    res = {r.provider: r for r in _run({p.name: p for p in provs})[0]}
    for name in ("flashscope", "flashscope-paged"):
        assert res[name].status == "ok", res[name].reason
        assert res[name].gbps and res[name].pct_copy and res[name].max_rel_error < 2e-3


def test_cli_lists_the_decoding_providers_and_needs_a_gpu(capsys):
    assert main(["bench", "--list-baselines", "--suite", "decode", "--device", "cpu",
                 "--json"]) == 0
    names = [r["name"] for r in json.loads(capsys.readouterr().out)]
    assert names[0] == "copy" and {"flashscope-paged", "fa2", "sdpa-cudnn", "fa4"} <= set(names)
    assert main(["bench", "--suite", "decode", "--device", "cpu"]) == 2
    assert "--suite needs a GPU" in capsys.readouterr().err


def test_config_names_the_decoding_kernel_or_the_forward():
    """``--config`` of a decoding run: the decoding kernel's knobs on its default, or
    ``sm90-fwd:`` knobs on the sm_90 forward's config for the case's packed rows (GQA 8:1
    at 4 tokens: one consumer's 64-row tile); a family that is not one is refused."""
    from flashscope.errors import FlashscopeError
    from flashscope.families.sm90_fwd import Sm90FwdConfig
    from flashscope.families.triton_decode import TritonDecodeConfig

    case = DecodeCase(64, 64, 4, 1024, 128, 8, True)
    cfg = decode.decode_config("SPLITS=2", case, "cpu")
    assert isinstance(cfg, TritonDecodeConfig) and cfg.SPLITS == 2
    cfg = decode.decode_config("sm90-fwd:num_stages=3", case, "cpu")
    assert isinstance(cfg, Sm90FwdConfig) and cfg.num_stages == 3
    assert cfg.BLOCK_M == 64 and not cfg.PINGPONG and not cfg.MASKED_FIRST
    with pytest.raises(FlashscopeError, match="not a kernel family"):
        decode.decode_config("sm91-fwd:num_stages=3", case, "cpu")
    with pytest.raises(FlashscopeError, match="BLOCK_Q"):
        decode.decode_config("sm90-fwd:BLOCK_Q=3", case, "cpu")


@pytest.mark.gpu
def test_gpu_decode_bench_small(tmp_path, capsys):
    """A few decoding steps through the CLI with every provider this GPU has."""
    # no suite row has D = 32: the one shape given runs alone
    argv = ["bench", "--suite", "decode", "--head-dim", "32", "--shape", "3,8,4,64,1008,2",
            "--causal", "yes", "--warmup-ms", "5", "--rep-ms", "20", "--out", str(tmp_path),
            "--json", "--device", "cuda"]  # named: a CPU test of this worker may have set
    assert main(argv) == 0                # TRITON_INTERPRET, which a left-out --device reads
    rows = json.loads(capsys.readouterr().out)["results"]
    ok = {r["provider"] for r in rows if r["status"] == "ok"}
    assert {"copy", "flashscope", "flashscope-paged"} <= ok
    assert all(r["status"] in ("ok", "unsupported", "unavailable") for r in rows), \
        [r["reason"] for r in rows if r["status"] in ("failed", "error")]
    assert "GB/s" in (tmp_path / "bench.md").read_text()


@pytest.mark.gpu
def test_gpu_time_leaves_the_host_out():
    """A call that takes the host 3 ms to queue a short kernel: do_bench's events time the
    host, :func:`gpu_time`'s the kernel."""
    import time

    import torch
    import triton.testing

    from flashscope.bench.timing import gpu_time

    x = torch.zeros(1 << 20, device="cuda")

    def slow_host():
        time.sleep(0.003)
        x.add_(1.0)

    assert triton.testing.do_bench(slow_host, warmup=10, rep=30, return_mode="median") > 2.5
    assert gpu_time(slow_host, warmup_ms=10, rep_ms=30) < 0.5
