"""scripts/gpu/decode_scan.py on CPU tensors (Triton's interpreter, perf_counter timing):
each config is checked against the reference before it is timed, a dense default gives the
speed column its base, and bad arguments get one line and exit code 2."""

import json
from pathlib import Path

import pytest
import torch

from .test_help import _load

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "decode_scan.py"


def test_scan_checks_then_times_each_config():
    scan = _load(SCRIPT).scan
    rows = scan((2, 4, 1, 32, 40, 2), [0, 16], ["SPLITS=2"], device="cpu",
                dtype=torch.float16)
    assert [(r["page"], r["default"]) for r in rows] == [(0, True), (0, False), (16, True),
                                                         (16, False)]
    assert rows[0]["of_dense_default"] == 1.0 and rows[1]["knobs"] == {"SPLITS": 2}
    assert all("failed" not in r and r["us"] > 0 and r["gbps"] > 0 for r in rows)
    assert [r["api_default"] for r in rows] == [True, False, True, False]


def test_a_routed_call_times_the_forward_config_too(monkeypatch):
    """Where attention_with_kvcache would run the sm_90 forward, its config gets a row of
    its own (here one the forward cannot run, D = 32 on the CPU: a failed row saying why)."""
    mod = _load(SCRIPT)
    monkeypatch.setattr(mod, "_default_config",
                        lambda q, cache, mask, scale: mod.forward_config(
                            mod.problem_of(q, cache, mask)))
    rows = mod.scan((2, 4, 1, 32, 40, 2), [0], ["SPLITS=2"], device="cpu",
                    dtype=torch.float16)
    assert [r["config"].split()[0] for r in rows] == ["triton-decode", "sm90-fwd",
                                                      "triton-decode"]
    assert [r["api_default"] for r in rows] == [False, True, False]
    assert rows[1]["failed"] and "us" not in rows[1] and rows[0]["us"] > 0


def test_a_config_the_rules_refuse_is_a_row_and_the_rest_run():
    scan = _load(SCRIPT).scan
    rows = scan((2, 4, 1, 32, 40, 2), [0], ["BLOCK_M=24", "SPLITS=2"], device="cpu",
                dtype=torch.float16)
    assert [("failed" in r) for r in rows] == [False, True, False]
    assert "BLOCK_M=24" in rows[1]["failed"] and rows[2]["us"] > 0


def test_finished_rows_are_kept_as_they_are_timed(tmp_path, monkeypatch):
    """A sweep killed after its first cache keeps that cache's rows in the partial file;
    a finished one leaves decode_scan.json and no partial file."""
    mod = _load(SCRIPT)
    real = mod.scan
    calls = []

    def scan_then_die(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as a signal would stop it, mid-sweep
        return real(*a, **kw)

    monkeypatch.setattr(mod, "scan", scan_then_die)
    argv = [str(tmp_path / "o"), "--shapes", "2,4,1,32,40,2;1,2,1,16,24,1", "--pages", "0",
            "--device", "cpu"]
    try:
        mod.main(argv)
    except KeyboardInterrupt:
        pass
    kept = (tmp_path / "o" / mod.PARTIAL).read_text().splitlines()
    assert len(kept) == 1 and not (tmp_path / "o" / "decode_scan.json").exists()
    assert json.loads(kept[0])["shape"] == [2, 4, 1, 32, 40, 2]
    calls.clear()
    monkeypatch.setattr(mod, "scan", real)
    assert mod.main([str(tmp_path / "p"), *argv[1:]]) == 0
    done = (tmp_path / "p" / "decode_scan.json").read_text()
    assert not (tmp_path / "p" / mod.PARTIAL).exists()
    assert mod.main([str(tmp_path / "p"), *argv[1:]]) == 2  # an earlier sweep's results
    assert (tmp_path / "p" / "decode_scan.json").read_text() == done
    assert mod.main([str(tmp_path / "p"), *argv[1:], "--force"]) == 0


def test_rounds_time_every_config_in_turn_and_keep_the_median():
    scan = _load(SCRIPT).scan
    rows = scan((2, 4, 1, 32, 40, 2), [0], ["SPLITS=2", "BLOCK_N=32"], device="cpu",
                dtype=torch.float16, rounds=3)
    assert len(rows) == 3 and all(len(r["us_rounds"]) == 3 for r in rows)
    assert all(r["us"] == sorted(r["us_rounds"])[1] for r in rows)


def test_bad_arguments_get_one_line(capsys, tmp_path):
    main = _load(SCRIPT).main
    assert main([str(tmp_path / "o"), "--shapes", "2,4,1", "--pages", "0"]) == 2
    assert main([str(tmp_path / "o"), "--shapes", "2,4,1,32,40,2", "--pages", "x"]) == 2
    assert main([str(tmp_path / "o"), "--shapes", "2,4,1,32,40,2", "--rounds", "0"]) == 2
    assert main([str(tmp_path / "o"), "--shapes", "2,4,1,32,40,2", "--configs",
                 "SPLITS=2;FOO=1"]) == 2
    assert main([str(tmp_path / "o"), "--shapes", "2,4,1,32,40,2", "--configs",
                 "sm90-fwd:;sm90-fwd:SPLITS=2"]) == 2  # a triton-decode knob
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 5 and "--shape" in out[0] and "--pages" in out[1]
    assert "--rounds '0'" in out[2] and "--configs 'FOO=1'" in out[3] and "FOO" in out[3]
    assert "--configs 'sm90-fwd:SPLITS=2'" in out[4] and "SPLITS" in out[4]
    assert not (tmp_path / "o").exists()


def test_against_times_another_rules_default_where_it_differs(tmp_path):
    mod = _load(SCRIPT)
    rules = (mod.ROOT / mod.RULES).read_text()
    old = rules.replace('("nvidia", 128, None, C(BLOCK_N=128,',
                        '("nvidia", 128, None, C(BLOCK_N=64,')
    assert old != rules
    (tmp_path / "old.py").write_text(old)
    rows = mod.scan((2, 4, 1, 32, 40, 2), [0], [], device="cpu", dtype=torch.float16,
                    against=mod.load_rules(str(tmp_path / "old.py")))
    assert [(r["default"], r["against"]) for r in rows] == [(True, False), (False, True)]
    assert "16x128" in rows[0]["config"] and "16x64" in rows[1]["config"]
    assert rows[1]["knobs"] == {"BLOCK_N": 64} and all(r["us"] > 0 for r in rows)
    (tmp_path / "same.py").write_text(rules)
    same = mod.scan((2, 4, 1, 32, 40, 2), [0], [], device="cpu", dtype=torch.float16,
                    against=mod.load_rules(str(tmp_path / "same.py")))
    assert len(same) == 1  # the same default is timed once


def test_against_that_cannot_load_is_one_line(capsys, tmp_path):
    main = _load(SCRIPT).main
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    (tmp_path / "binary.py").write_bytes(b"\xff\xfe\x00rules")
    for spec in ("no-such-revision-here", str(tmp_path / "broken.py"),
                 str(tmp_path / "binary.py")):
        assert main([str(tmp_path / "o"), "--shapes", "2,4,1,32,40,2", "--device", "cpu",
                     "--against", spec]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3 and all(line.startswith("decode_scan: --against") for line in out)
    assert "neither a file nor a git revision" in out[0] and "does not import" in out[1]
    assert "cannot be read" in out[2] and "[" not in out[0]
    assert not (tmp_path / "o").exists()


def test_page_orders_run_each_paged_cache_once_per_order(capsys, tmp_path):
    """--page-order: the dense cache once, each paged one per order, every row checked and
    timed with its speed over the same config on the dense cache; a bad order is one line
    and nothing written."""
    mod = _load(SCRIPT)
    rows = mod.scan((2, 4, 1, 32, 48, 2), [0, 16], [], device="cpu", dtype=torch.float16,
                    orders=["inorder", 2, "shuffled"])
    assert [(r["page"], r["order"]) for r in rows] == [(0, None), (16, "inorder"), (16, 2),
                                                       (16, "shuffled")]
    assert all("failed" not in r and r["of_dense_config"] > 0 for r in rows)
    assert rows[0]["of_dense_config"] == 1.0
    for bad in ("sideways", "0", "inorder,"):
        assert mod.main([str(tmp_path / "o"), "--shapes", "2,4,1,32,40,2", "--device",
                         "cpu", "--page-order", bad]) == 2
    out = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("{")]
    assert len(out) == 3 and all(line.startswith("decode_scan: --page-order") for line in out)
    assert not (tmp_path / "o").exists()


def test_page_order_hands_out_every_page_once():
    from flashscope.testing.inputs import page_order

    assert page_order(6, "inorder").tolist() == list(range(6))
    for order in ("shuffled", 4, 1, 10):
        perm = page_order(10, order)
        assert sorted(perm.tolist()) == list(range(10))
    grouped = page_order(10, 4).tolist()
    assert [sorted(grouped[s:s + 4]) for s in (0, 4, 8)] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                             [8, 9]]
    assert page_order(10, 1).tolist() == list(range(10))
    for bad in ("sideways", 0, -2, 2.5):
        with pytest.raises(ValueError, match="order"):
            page_order(10, bad)
