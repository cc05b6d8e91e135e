"""Offline builds: the JIT's specialization, the cache, and configs that cannot build."""

import json
import os

import pytest

from flashscope import compile as fcompile
from flashscope import TritonFwdConfig
from flashscope.errors import ConfigError, LimitError, UnknownTargetError
from flashscope.families import family
from flashscope.targets import get_target

from .golden import CASES, case_id


def test_constants_mirror_the_launch(artifacts):
    """The constexprs the binder produced are the launcher's keywords plus the specialized
    stride-1 / GROUP=1 integers of a contiguous MHA problem."""
    art = artifacts[case_id(CASES[0])]
    assert art.constants == {
        "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1, "GROUP": 1,
        "HEAD_DIM": 64, "HEAD_DIM_PAD": 64, "BLOCK_M": 128, "BLOCK_N": 64,
        "Q_IN_REGS": True, "RETURN_LSE": False, "EVEN_N": True, "SCALE_POS": True,
        "HEAVY_FIRST": False, "CAUSAL": False, "HAS_LEFT": False, "HAS_RIGHT": False,
        "SHIFTED": False, "GUARD": False, "SOFTCAP": False, "VARLEN": False, "ROW_UNIT": 1}
    assert art.metadata["num_warps"] == 8 and art.metadata["num_stages"] == 3
    assert art.metadata["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert art.binary[:4] == b"\x7fELF" and ".target sm_90a" in art.asm


def test_maxnreg_reaches_ptxas(artifacts):
    art = artifacts[case_id(CASES[2])]
    assert art.metadata["maxnreg"] == 32 and ".maxnreg 32" in art.asm


def test_cache_hit_is_the_same_artifact(artifacts, compile_cache):
    art = artifacts[case_id(CASES[0])]
    again = fcompile.build(TritonFwdConfig.parse(CASES[0][1]), "sm90", head_dim=64)
    assert again.key == art.key and again.binary == art.binary and again.path == art.path
    meta = json.loads((compile_cache / art.key[:2] / art.key / "artifact.json").read_text())
    assert meta["constants"] == art.constants


def test_key_covers_every_input():
    cfg = TritonFwdConfig(64, 64, 4, 2)
    base = fcompile.cache_key("fwd", cfg, "sm90", 64, "bfloat16", False)
    others = {
        fcompile.cache_key("fwd", cfg.replace(num_stages=3), "sm90", 64, "bfloat16", False),
        fcompile.cache_key("fwd", cfg.replace(maxnreg=128), "sm90", 64, "bfloat16", False),
        fcompile.cache_key("fwd", cfg, "sm80", 64, "bfloat16", False),
        fcompile.cache_key("fwd", cfg, "sm90", 128, "bfloat16", False),
        fcompile.cache_key("fwd", cfg, "sm90", 64, "float16", False),
        fcompile.cache_key("fwd", cfg, "sm90", 64, "bfloat16", True),
        fcompile.cache_key("fwd", cfg, "sm90", 64, "bfloat16", False, (1, 8, 8, 100, 100)),
        fcompile.cache_key("fwd", cfg, "sm90", 64, "bfloat16", False, return_lse=True),
        fcompile.cache_key("fwd", cfg, "sm90", 64, "bfloat16", False, window=(8, 0)),
        fcompile.cache_key("fwd", cfg, "sm90", 64, "bfloat16", False, varlen=True),
        fcompile.cache_key("fwd", cfg, "sm90", 64, "bfloat16", False, softcap=30.0),
    }
    assert base not in others and len(others) == 11
    assert base == fcompile.cache_key("fwd", cfg, "sm_90", 64, "bfloat16", False)


def test_damaged_cache_entry_is_a_miss(artifacts):
    art = artifacts[case_id(CASES[3])]
    assert fcompile.load_cached(art.key) is not None
    assert fcompile.load_cached("0" * 64) is None


@pytest.mark.parametrize("cfg, target, match", [
    (TritonFwdConfig(48, 64, 4, 2), "sm90", "BLOCK_M=48"),
    (TritonFwdConfig(64, 64, 32, 2), "sm90", "num_warps=32"),
    (TritonFwdConfig(64, 64, 4, 2, maxnreg=64), "gfx942", "NVIDIA register cap"),
    (TritonFwdConfig(64, 64, 4, 2, waves_per_eu=2), "sm90", "AMD option"),
    (TritonFwdConfig(256, 256, 8, 4), "sm80", "shared memory"),
])
def test_pure_checks_reject_before_compiling(cfg, target, match):
    with pytest.raises(ConfigError, match=match):
        fcompile.build(cfg, target, head_dim=128)


def test_unknown_target_suggests():
    with pytest.raises(UnknownTargetError, match="did you mean 'sm90'"):
        fcompile.build(TritonFwdConfig(), "sm9O")


def test_unknown_kernel_and_dtype():
    with pytest.raises(ConfigError, match="unknown kernel"):
        fcompile.build(TritonFwdConfig(), "sm90", kernel="fwdd")
    with pytest.raises(ConfigError, match="--dtype"):
        fcompile.build(TritonFwdConfig(), "sm90", dtype="float32")


def test_lds_limit_named_after_compile():
    """128x64 tiles, 3 stages, D=128 pass the pure lower bound on gfx942 but Triton's
    allocation (80 KB) is over the 64 KB of LDS a workgroup may have: a LimitError (the
    target cannot run it), which reports show as NOT BUILT, not as a failed build."""
    with pytest.raises(LimitError, match=r"81920 bytes of LDS per block; gfx942 allows 65536"):
        fcompile.build(TritonFwdConfig(128, 64, 8, 3), "gfx942", head_dim=128)


def test_rules_refusal_is_a_limit_and_a_compiler_failure_is_not():
    with pytest.raises(LimitError):  # a rule: at most 16 warps
        family("triton-fwd").check(TritonFwdConfig(128, 64, 32, 2), "gfx942", 128, "bfloat16")
    with pytest.raises(ConfigError) as failed:
        fcompile.build(TritonFwdConfig(64, 32, 4, 1, maxnreg=16), "sm90", head_dim=32)
    assert not isinstance(failed.value, LimitError)


def test_ptxas_register_failure_names_the_cap():
    with pytest.raises(ConfigError, match=r"maxnreg=16 is too few registers per thread for "
                                          r"sm90 \(ptxas(-blackwell)? fatal"):
        fcompile.build(TritonFwdConfig(64, 32, 4, 1, maxnreg=16), "sm90", head_dim=32)


def test_nested_frontend_error_names_its_reason():
    """A Gluon error inside a warp_specialize partition arrives as 'at 62:8:' plus source;
    the one-line failure must carry the innermost reason, not only the location."""
    try:
        try:
            try:
                raise RuntimeError("rank must be equal to or one less than the shape size")
            except RuntimeError as inner:
                raise ValueError("at 76:12:\n    pin.index(C).store(l_i)\n") from inner
        except ValueError as mid:
            raise ValueError("at 62:8:\n        gl.warp_specialize([\n        ^") from mid
    except ValueError as outer:
        text = fcompile.failure_text(outer)
    line = fcompile.compile_failure(text, TritonFwdConfig(), get_target("sm90"))
    assert "rank must be equal to or one less than the shape size (at 62:8)" in line
    plain = ValueError("ptxas fatal: out of registers")
    assert fcompile.failure_text(plain) == str(plain)


def test_register_kernel_extends_the_registry():
    import dataclasses

    spec = dataclasses.replace(fcompile.KERNELS["triton-fwd"], name="fwd_copy")
    fcompile.register_kernel(spec)
    try:
        assert fcompile.kernel_spec("fwd_copy") is spec and "fwd_copy" in fcompile.kernel_names()
    finally:
        del fcompile.KERNELS["fwd_copy"]


def test_fwd_stands_for_the_kernel_each_target_runs():
    assert fcompile.kernel_spec("fwd", "sm90").name == "sm90-fwd"
    assert fcompile.kernel_spec("fwd", "gfx942").name == "triton-fwd"
    assert fcompile.kernel_spec("fwd", "sm90", TritonFwdConfig()).name == "triton-fwd"
    cfg = fcompile.parse_config("BLOCK_M=64", "fwd", "gfx942", head_dim=128)
    assert cfg == fcompile.default_config("fwd", "gfx942", 128).replace(BLOCK_M=64)
    with pytest.raises(ConfigError, match="expected a sm90-fwd config"):
        fcompile.build(TritonFwdConfig(), "sm90", kernel="sm90-fwd")


def _native_assertion():
    """What an MLIR/LLVM assertion in Triton's native code does to its process: the
    assertion's line on file descriptor 2 (held by the caller, as _compile holds it), then
    SIGABRT. Done here directly: the Triton bugs that once did it are release-specific
    (3.6 to 3.8 assert in LinearLayoutConversions.cpp on ``slice`` of a 5-D shared buffer
    with a 4-D layout; 3.9 compiles it)."""
    with fcompile._native_stderr():
        os.write(2, b"python: /src/lib/Tools/LinearLayoutConversions.cpp:1183: "
                    b"LinearLayout f(ArrayRef<int64_t>): Assertion `isPowerOf2_32(dim)' "
                    b"failed.\n")
        os.abort()


def test_compiler_abort_is_an_error_not_the_end_of_the_process():
    """An MLIR assertion aborts the compiling process (SIGABRT, past Python's reach); the
    compile runs in a forked child, so the caller gets a ConfigError with the signal and
    the assertion, and goes on."""
    with pytest.raises(ConfigError, match=r"process ended \(signal SIGABRT\): "
                                          r"LinearLayoutConversions\.cpp:1183: Assertion"):
        fcompile._forked(_native_assertion, TritonFwdConfig(), get_target("sm90"))
    assert fcompile._forked(lambda: 6 * 7, TritonFwdConfig(), get_target("sm90")) == 42


def test_errors_of_the_compiling_child_come_back():
    """What the child raises is raised here: its own type when it pickles, else a
    FlashscopeError with its traceback's text."""
    from flashscope.errors import FlashscopeError

    def config_error():
        raise ConfigError("over the shared memory limit")

    class Local(Exception):  # a class pickle cannot find by name
        pass

    def local_error():
        raise Local("from a local class")

    t = get_target("sm90")
    with pytest.raises(ConfigError, match="over the shared memory limit"):
        fcompile._forked(config_error, TritonFwdConfig(), t)
    with pytest.raises(FlashscopeError, match="(?s)Local: from a local class"):
        fcompile._forked(local_error, TritonFwdConfig(), t)


def test_an_interrupted_compile_takes_its_child_along(monkeypatch):
    """Ctrl-C while the child compiles: the child is killed and reaped, the interrupt
    goes on to the caller."""
    import os
    import time

    children = []
    real_waitpid = os.waitpid

    def interrupted(pid, flags):
        if not children:
            children.append(pid)
            raise KeyboardInterrupt
        return real_waitpid(pid, flags)

    monkeypatch.setattr(os, "waitpid", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fcompile._forked(lambda: time.sleep(60), TritonFwdConfig(), get_target("sm90"))
    monkeypatch.undo()
    with pytest.raises(ChildProcessError):  # already reaped: no such child left
        os.waitpid(children[0], os.WNOHANG)


def test_variants_build_with_the_switches_a_launch_passes(compile_cache):
    """``--varlen``/``--window``/``--softcap`` builds: the packed portable forward (no
    tile-multiple claim about its sequences) and the Hopper kernel's band, whose default
    leaves the causal orderings off; the Hopper kernel builds a packed batch with its
    device-built list, and refuses the host-list switches for one."""
    jobs = [("", "sm90", dict(head_dim=64, causal=True, kernel="triton-fwd", varlen=True,
                              window=(32, 0), align="bottom_right")),
            ("", "sm90", dict(head_dim=64, causal=True, window=(32, 0), softcap=30.0))]
    packed, band = fcompile.run_clean(fcompile._build_task, jobs, jobs=2)
    assert packed.constants["VARLEN"] and packed.constants["HAS_LEFT"]
    assert packed.constants["SHIFTED"] and not packed.constants["EVEN_N"]
    assert band.name == "_attn_fwd_sm90" and band.constants["HAS_LEFT"]
    assert band.constants["SOFTCAP"] and not band.config["MASKED_FIRST"]
    hopper = fcompile.build("", "sm90", kernel="sm90-fwd", head_dim=64, varlen=True,
                            use_cache=False)
    assert hopper.name == "_attn_fwd_sm90" and hopper.constants["VARLEN"]
    assert hopper.constants["LPT"] == 1 and not hopper.config["BALANCE"]
    with pytest.raises(ConfigError, match="BALANCE=1 shapes the host's work list"):
        fcompile.build("BALANCE=1", "sm90", kernel="sm90-fwd", varlen=True, use_cache=False)
