"""``flashscope inspect``: output formats, and every bad-input path exits 2 with one line."""

import csv
import io
import json
import shutil

from flashscope import cli
from flashscope.isa import record_for

from .golden import CASES, case_id

SM80 = "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2"


def _registers(artifacts, case):
    """What the reader finds in a golden case's binary (tests/isa/test_readers.py pins it
    per Triton release): the command must report the same."""
    return record_for(artifacts[case_id(case)]).registers


def _run(capsys, *argv):
    code = cli.main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_record_keys(capsys, artifacts):
    code, out, err = _run(capsys, "--target", "sm80", "--config", SM80, "--head-dim", "64",
                          "--causal", "--json")
    assert code == 0, err
    doc = json.loads(out)
    (rec,) = doc["kernels"]
    for key in ("kernel", "target", "registers", "agprs", "sgprs", "spill_stores",
                "spill_loads", "vgpr_spills", "sgpr_spills", "local_bytes", "shared_bytes",
                "threads", "mix", "features", "config", "head_dim", "dtype", "causal",
                "num_warps", "wave_size", "opcodes", "occupancy", "limiter"):
        assert key in rec, key
    assert rec["target"] == "sm80" and rec["causal"] is True and doc["errors"] == []
    assert CASES[1] == ("sm80", SM80, 64, True)
    assert rec["registers"] == _registers(artifacts, CASES[1]) and rec["mix"]["mma"] > 0


def test_shape_builds_that_problem(capsys, artifacts):
    """--shape binds the build to that problem: a key length off the tiles specializes the
    kernel otherwise than the representative 1024 rows do (the launch a real call of
    that shape runs); its D is the head dim; beside --head-dim, or malformed, it is one
    line, exit 2."""
    from flashscope import compile as fcompile

    code, out, err = _run(capsys, "--target", "sm80", "--config", SM80, "--causal",
                          "--shape", "2,4,577,64", "--json")
    assert code == 0, err
    (rec,) = json.loads(out)["kernels"]
    assert rec["head_dim"] == 64 and CASES[1] == ("sm80", SM80, 64, True)
    golden = record_for(artifacts[case_id(CASES[1])])
    assert rec["instructions"] != golden.instructions
    # the default config follows the shape too: 64 rows split their keys on sm_90
    assert fcompile.parse_config("", "fwd", "sm90", 128, shape=(1, 8, 8, 64, 64)).SPLIT_KV
    assert not fcompile.parse_config("", "fwd", "sm90", 128).SPLIT_KV
    _bad(capsys, "--shape", "2,4,577,64", "--head-dim", "64", match="--head-dim")
    _bad(capsys, "--shape", "2,4,577", match="--shape '2,4,577'")
    _bad(capsys, "--shape", "2,3,64,64,64,2", match="must divide")


def test_csv_and_table(capsys, artifacts):
    code, out, _ = _run(capsys, "--target", "sm80", "--config", SM80, "--head-dim", "64",
                        "--causal", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    regs = _registers(artifacts, CASES[1])
    assert code == 0 and rows[0]["registers"] == str(regs) and int(rows[0]["mix.ldmatrix"]) > 0
    code, out, _ = _run(capsys, "--target", "sm80", "--config", SM80, "--head-dim", "64",
                        "--causal")
    assert code == 0 and "triton-fwd" in out and "64x64" in out and f" {regs} " in out


def test_table_marks_serialized_wgmma(capsys):
    # the Q_IN_REGS build of test_readers.py's serialized case (the same builds, which
    # the compile cache then shares): the table says so, not only --json
    cfg = ("sm90-fwd:BLOCK_M=192,num_stages=3,PINGPONG=1,LAZY_RESCALE=0,EARLY_Q=0,K_EARLY=0,"
           "MASKED_FIRST=0,OUT_RCP=0,Q_IN_REGS={}")
    for q_in_regs, marked in ((1, True), (0, False)):
        code, out, _ = _run(capsys, "--target", "sm90", "--config", cfg.format(q_in_regs),
                            "--head-dim", "64", "--lse")
        assert code == 0
        assert ("serial)" in out and "serial: wgmma that ptxas made wait" in out) is marked
        assert ("serial" in out) is marked


def test_path_and_diff(capsys, artifacts, tmp_path):
    a = artifacts[case_id(CASES[1])]
    b = artifacts[case_id(CASES[2])]
    regs_a, regs_b = _registers(artifacts, CASES[1]), _registers(artifacts, CASES[2])
    assert regs_a != regs_b == 32  # maxnreg=32
    code, out, _ = _run(capsys, a.path, "--json")
    assert code == 0 and json.loads(out)["kernels"][0]["registers"] == regs_a
    pa, pb = tmp_path / "a.cubin", tmp_path / "b.cubin"
    pa.write_bytes(a.binary)
    pb.write_bytes(b.binary)
    code, out, _ = _run(capsys, "--diff", str(pa), str(pb), "--json")
    d = json.loads(out)
    assert code == 0 and d["fields"]["registers"]["delta"] == regs_b - regs_a
    assert "opcodes" not in d
    code, out, _ = _run(capsys, "--diff", str(pa), str(pb), "--opcodes", "--json")
    ops = json.loads(out)["opcodes"]
    changes = [abs(e["delta"]) for e in ops.values()]
    assert code == 0 and changes and all(changes) and changes == sorted(changes, reverse=True)
    assert sum(e["delta"] for e in ops.values()) == d["fields"]["instructions"]["delta"]
    code, out, _ = _run(capsys, "--diff", str(pa), str(pb), "--opcodes")
    assert code == 0 and "opcode." in out


def test_diff_operands_name_their_own_build_settings(capsys, artifacts):
    """An operand's head_dim, dtype, causal or varlen build its side alone: one config
    causal against not, the labels saying which side is which; a bad setting is one
    line naming it (exit 2)."""
    cfg = "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2"
    code, out, err = _run(capsys, "--target", "sm80", "--head-dim", "64", "--diff",
                          f"{cfg},causal=1", f"{cfg},causal=0", "--json")
    d = json.loads(out)
    assert code == 0, err
    assert d["a"].endswith("(causal=1)") and d["b"].endswith("(causal=0)")
    assert d["fields"]["registers"]["a"] == _registers(artifacts, CASES[1])
    assert d["fields"]["instructions"]["delta"] != 0
    code, out, err = _run(capsys, "--kernel", "triton-fwd", "--head-dim", "64", "--diff",
                          "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3",
                          f"{cfg},target=sm80,causal=1", "--json")
    d = json.loads(out)
    assert code == 0, err
    assert (d["fields"]["registers"]["a"], d["fields"]["registers"]["b"]) == (
        _registers(artifacts, CASES[0]), _registers(artifacts, CASES[1]))
    code, out, err = _run(capsys, "--target", "sm80", "--head-dim", "64", "--diff",
                          "triton-fwd:", f"triton-fwd:{cfg}", "--json")
    assert code == 0, err  # a family's default against a config of it
    regs = json.loads(out)["fields"]["registers"]
    assert regs["a"] > 0 and regs["b"] > 0
    _bad(capsys, "--diff", "tritn-fwd:", "head_dim=64", match="tritn-fwd")
    _bad(capsys, "--diff", "target=sm99", "head_dim=64", match="unknown target")
    _bad(capsys, "--diff", "head_dim=x", "head_dim=64", match="head_dim")
    _bad(capsys, "--diff", "causal=maybe", "head_dim=64", match="causal")


def _bad(capsys, *argv, match):
    code, out, err = _run(capsys, *argv)
    assert code == 2, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert match in err, err


def test_bad_inputs(capsys, tmp_path):
    _bad(capsys, "--target", "sm9", match="did you mean")
    _bad(capsys, "--target", "gfx9422", match="unknown target")
    _bad(capsys, "--config", "BLOCK_M=48", match="BLOCK_M=48")
    _bad(capsys, "--config", "BLOCK_Q=64", match="unknown key")
    _bad(capsys, "--config", "BLOCK_M", match="KEY=VALUE")
    _bad(capsys, "--target", "gfx942", "--config", "maxnreg=64", match="NVIDIA register cap")
    _bad(capsys, "--kernel", "nope", match="unknown kernel")
    _bad(capsys, "--jobs", "-1", match="--jobs")
    cfgs = tmp_path / "c.json"
    cfgs.write_text("{not json")
    _bad(capsys, "--configs", str(cfgs), match="not valid JSON")
    cfgs.write_text("[3]")
    _bad(capsys, "--configs", str(cfgs), match="entry 0: expected an object or a 'K=V,...'")
    _bad(capsys, "--configs", str(tmp_path / "missing.json"), match="no such file")
    _bad(capsys, str(tmp_path / "nothing.cubin"), match="no such file")
    empty = tmp_path / "empty"
    empty.mkdir()
    _bad(capsys, str(empty), match="no kernels here")
    junk = tmp_path / "junk.cubin"
    junk.write_bytes(b"\0" * 100)
    _bad(capsys, str(junk), match="not an ELF")
    other = tmp_path / "ls.hsaco"
    shutil.copy(shutil.which("ls"), other)
    _bad(capsys, str(other), match="not a GPU binary")
    _bad(capsys, "--diff", "nothing", "BLOCK_M=64", match="neither an existing file")
    _bad(capsys, "--window", "64", match="argument --window: expected L,R")
    _bad(capsys, "--window", "a,0", match="argument --window: expected L,R as integers")
    _bad(capsys, "--softcap", "0", match="argument --softcap: expected a finite number > 0")
    _bad(capsys, "--kernel", "sm90-fwd", "--varlen", "--target", "sm90", "--config",
         "BALANCE=1", match="BALANCE=1 shapes the host's work list")


def test_truncated_cubin(capsys, tmp_path, cubin):
    p = tmp_path / "t.cubin"
    p.write_bytes(cubin[:len(cubin) // 3])
    _bad(capsys, str(p), match="t.cubin")


def test_over_the_lds_limit(capsys):
    _bad(capsys, "--target", "gfx942", "--config", "BLOCK_M=128,BLOCK_N=64,num_warps=8,"
         "num_stages=3", "--head-dim", "128", match="LDS per block; gfx942 allows 65536")


def test_a_directory_is_read_without_following_links_out_of_it(capsys, tmp_path, cubin):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "k.cubin").write_bytes(cubin)
    inside = tmp_path / "cache"
    (inside / "sub").mkdir(parents=True)
    (inside / "sub" / "away.cubin").symlink_to(outside / "k.cubin")
    (inside / "away_dir").symlink_to(outside, target_is_directory=True)
    _bad(capsys, str(inside), match="links leading outside it are not followed")
    (inside / "sub" / "own.cubin").write_bytes(cubin)  # a link within the folder is read
    (inside / "near.cubin").symlink_to(inside / "sub" / "own.cubin")
    code, out, _ = _run(capsys, str(inside), "--json")
    assert code == 0 and len(json.loads(out)["kernels"]) == 2
