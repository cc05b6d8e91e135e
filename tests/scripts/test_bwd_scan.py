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
