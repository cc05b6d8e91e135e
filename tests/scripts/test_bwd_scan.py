"""scripts/gpu/bwd_scan.py's arguments, on CPU: each bad one gets one line naming it and
exit code 2 before anything is written, an earlier sweep's results are not replaced
without --force, and without a GPU the scan says so instead of failing in torch."""

from pathlib import Path

import pytest

from .test_help import _load

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "bwd_scan.py"


@pytest.mark.parametrize("args,named", [
    (["--head-dim", "100"], "--head-dim 100"),
    (["--head-dim", "128", "--n", "3000"], "--n 3000"),
    (["--head-dim", "128", "--configs", "BLOCK_M1=64;NOPE=1"], "--configs 'NOPE=1'"),
    (["--head-dim", "128", "--configs", "BLOCK_M1=x"], "--configs 'BLOCK_M1=x'"),
    (["--head-dim", "128", "--configs", "sm90-fwd:BLOCK_M=64"], "--configs 'sm90-fwd:"),
    (["--shape", "4,16,4096"], "--shape '4,16,4096'"),
    (["--shape", "2,32,1024,128,1024,5"], "--shape '2,32,1024,128,1024,5'"),
    (["--shape", "4,16,1024,64", "--peers", "fa9"], "--peers 'fa9'"),
    (["--shape", "4,16,1024,64", "--rounds", "0"], "--rounds 0"),
    ([], "--shape or --head-dim"),
])
def test_bad_arguments_get_one_line(capsys, tmp_path, args, named):
    main = _load(SCRIPT).main
    assert main([str(tmp_path / "o"), *args]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"bwd_scan: {named}")
    assert not (tmp_path / "o").exists()


def test_earlier_results_and_no_gpu(capsys, tmp_path, monkeypatch):
    mod = _load(SCRIPT)
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "bwd_scan.json").write_text("{}")
    assert mod.main([str(tmp_path / "o"), "--head-dim", "128"]) == 2
    assert "pass --force" in capsys.readouterr().out
    assert (tmp_path / "o" / "bwd_scan.json").read_text() == "{}"
    monkeypatch.setattr(mod.torch.cuda, "is_available", lambda: False)
    assert mod.main([str(tmp_path / "p"), "--head-dim", "128", "--force"]) == 2
    assert "no GPU" in capsys.readouterr().out and not (tmp_path / "p").exists()


def test_configs_resolve_in_the_family_that_has_their_keys():
    """A bare config goes to the default's family where that has its keys, else to the
    backward family that has them; a prefixed one to its family's rule for the problem;
    one the family's rules refuse for the problem says why."""
    from flashscope.errors import FlashscopeError
    from flashscope.families import default_backward
    from flashscope.families.base import Problem

    mod = _load(SCRIPT)
    problem = Problem("sm90", "bfloat16", 64, False, 577, 577, 512)
    default = default_backward(problem)
    assert default.KERNEL == "sm90-bwd"
    got = [mod.resolve(k, b, problem, default, "sm90") for k, b in
           mod.parse_configs("BLOCK_M=64; BLOCK_N1=128 ;triton-bwd:;num_stages=2")]
    assert [c.KERNEL for c in got] == ["sm90-bwd", "triton-bwd", "triton-bwd", "sm90-bwd"]
    assert got[0].BLOCK_M == 64 and got[0].BLOCK_N == default.BLOCK_N
    assert got[1].BLOCK_N1 == 128 and got[2].BLOCK_N1 != 128
    assert got[3] == default
    with pytest.raises(FlashscopeError, match="shared memory"):
        mod.resolve(None, "num_stages=3", problem, default, "sm90")
