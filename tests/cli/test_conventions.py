"""One convention for every command: --json on stdout with the schema of the file --out
writes, --csv header first, --force before any replacement, tables readable at 100
columns when redirected with nothing cut or eaten, progress silent in pipes, one spelling
per argument, product names for targets, and main() ending every failure in one line.
Commands that compile or run kernels are checked by their own tests (report, inspect,
bench, sweep); these use recorded inputs and take seconds."""

import csv
import io
import json
from pathlib import Path

import pytest

from flashscope import cli
from flashscope.cli import main

DATA = Path(__file__).parents[1] / "data"
NCU = str(DATA / "profile" / "ncu_raw_h100.csv")
BD = DATA / "breakdown"

#: command line -> (command name) for commands that need no compile: each has --json,
#: --csv and --out DIR.
CHEAP = {
    "targets": ["targets"],
    "version": ["version"],
    "occupancy": ["occupancy", "--target", "H100,MI300X", "--threads", "256", "--regs", "128",
                  "--vgprs", "128", "--smem", "65536", "--lds", "32768"],
    "roofline": ["roofline", "--counters", NCU, "--causal"],
    "profile": ["profile", "--ncu-csv", NCU],
    "breakdown": ["breakdown", "--rocprof", str(BD / "rocprof_kernel_trace.csv"),
                  "--target", "RX7900"],
    "bench": ["bench", "--list-baselines", "--device", "cpu"],
}


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_json_stdout_is_the_file_and_csv_is_header_first(name, tmp_path, capsys):
    argv = CHEAP[name]
    assert main(argv + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(argv + ["--csv"]) == 0
    text = capsys.readouterr().out
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows and text.splitlines()[0] == ",".join(rows[0])  # the header is line 1
    out = tmp_path / "out"
    assert main(argv + ["--out", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    on_disk = json.loads((out / f"{name}.json").read_text())
    if name == "version":
        assert on_disk == again
    else:
        assert on_disk == again == doc or name == "bench"  # bench: same providers, again
    with open(out / f"{name}.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    # a second run replaces nothing without --force, and says so in one line
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{name}.json is already there" in err and "--force" in err
    assert main(argv + ["--out", str(out), "--force"]) == 0


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_redirected_tables_fit_100_columns_and_cut_nothing(name, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(CHEAP[name]) == 0
    out = capsys.readouterr().out
    assert out.strip()
    for line in out.splitlines():
        assert len(line.rstrip()) <= 100, line
    assert "\u2026" not in out  # no cell ends in an ellipsis


def test_wide_cells_wrap_at_spaces_not_inside_words():
    from flashscope.terminal import console, show, table

    t = table("config", "target", "note", left=("config", "target", "note"))
    label = "BLOCK_M=128 BLOCK_N=64 num_warps=8 num_stages=3 Q_IN_REGS=1"
    t.add_row(label, "gfx942", "the fwd kernel needs 81920 bytes of LDS per block; gfx942 "
              "allows 65536 " * 3)
    buf = io.StringIO()
    con = console()
    con.file = buf
    show(con, t)
    words = set(label.split()) | {"gfx942", "81920", "65536"}
    text = buf.getvalue()
    assert all(w in text for w in words)  # every word whole on some line
    assert max(len(x.rstrip()) for x in text.splitlines()) <= 100


def test_brackets_are_text_not_markup(capsys):
    from flashscope.commands.inspect import _diff_table
    from flashscope.terminal import console

    d = {"a": "_attn_fwd[m128n64w4s3q1]@sm90", "b": "_attn_fwd[m64n64w4s3q1]@sm90",
         "fields": {"registers": {"a": 168, "b": 128, "delta": -40}}, "mix": {}}
    _diff_table(console(), d)
    out = capsys.readouterr().out
    assert "[m128n64w4s3q1]" in out and "[m64n64w4s3q1]" in out and "-40" in out


def test_progress_is_silent_in_a_pipe(capsys):
    from flashscope.progress import Progress

    with Progress("compiling", 3) as bar:
        for _ in range(3):
            bar.note("a finished case")
            bar.advance()
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("name, arch", [("H100", "sm90"), ("h100 sxm5", "sm90"),
                                        ("NVIDIA H100 80GB HBM3", "sm90"), ("H200", "sm90"),
                                        ("A100", "sm80"), ("NVIDIA A100-SXM4-80GB", "sm80"),
                                        ("RTX 4090", "sm89"), ("B200", "sm100"),
                                        ("MI300X", "gfx942"), ("AMD Instinct MI300X", "gfx942"),
                                        ("MI250X", "gfx90a"), ("RX7900", "gfx1100"),
                                        ("Radeon RX 7900 XTX", "gfx1100"), ("sm_90a", "sm90"),
                                        ("gfx942:sramecc+", "gfx942")])
def test_product_names_resolve(name, arch):
    from flashscope.targets import get_target

    assert get_target(name).name == arch


def test_hopper_is_never_taken_for_blackwell(capsys):
    from flashscope.targets import get_target

    assert get_target("H100").family == "hopper" and get_target("B200").family == "blackwell"
    assert main(["targets", "--target", "H10"]) == 2
    err = capsys.readouterr().err
    assert "did you mean H100 (sm90)?" in err and "sm100" not in err.split(";")[0]


@pytest.mark.parametrize("text, want", [("bf16", ("bfloat16",)), ("fp16", ("float16",)),
                                        ("bfloat16,float16", ("bfloat16", "float16")),
                                        ("torch.bfloat16", ("bfloat16",)),
                                        ("half", ("float16",)), ("BF16, fp16, bf16",
                                                                 ("bfloat16", "float16"))])
def test_one_dtype_spelling_everywhere(text, want):
    from flashscope.commands.common import parse_dtypes

    assert parse_dtypes(text) == want


def test_causal_and_lists_spelled_one_way():
    from flashscope.cli import build_parser

    p = build_parser()
    for cmd in (["inspect"], ["bench", "--shape", "1,1,8,8"], ["sweep"]):
        a = p.parse_args(cmd + ["--causal"])
        assert tuple(a.causal) == (True,)
        a = p.parse_args(cmd + ["--causal", "both", "--head-dims", "64,128", "--dtypes",
                                "bf16,fp16"])
        assert tuple(a.causal) == (False, True) and tuple(a.head_dim) == (64, 128)
        assert tuple(a.dtype) == ("bfloat16", "float16")
    for cmd in (["inspect"], ["sweep"], ["report"], ["targets"], ["breakdown"],
                ["occupancy", "--threads", "64"]):  # bench times the device it runs on
        a = p.parse_args(cmd + ["--target", "H100,MI300X"])
        assert [t.name for t in a.target] == ["sm90", "gfx942"]
    for cmd in (["report"], ["roofline"], ["profile"]):
        assert tuple(p.parse_args(cmd + ["--causal", "yes"]).causal) == (True,)
        assert tuple(p.parse_args(cmd).causal) == (False,)


def test_occupancy_printed_one_way(capsys):
    assert main(["occupancy", "--target", "sm90", "--threads", "384", "--regs", "168"]) == 0
    assert "occupancy 18.8%" in capsys.readouterr().out  # 12 of 64 warps
    from flashscope.terminal import pct

    assert pct(0.375) == "37.5%" and pct(None) == "-" and pct(float("nan")) == "-"


def _cmd(fn):
    """A command whose run is ``fn`` (registered as 'version' for the test)."""
    parser = cli.build_parser()

    def build():
        return parser
    for a in parser._subparsers._group_actions:
        a.choices["version"].set_defaults(func=lambda args: fn())
    return build


@pytest.mark.parametrize("error, code, line", [
    (KeyboardInterrupt, 130, "flashscope version: interrupted"),
    (BrokenPipeError, 141, None),
    (lambda: OSError(28, "No space left on device", "/tmp/out/x.json"), 2,
     "flashscope version: error: /tmp/out/x.json: No space left on device"),
    (RecursionError, 2, "flashscope version: error: input nested too deeply to read"),
    (lambda: ZeroDivisionError("float division by zero"), 1,
     "flashscope version: internal error: ZeroDivisionError: float division by zero"),
    # a dependency missing from the environment is named, with its pip package
    (lambda: ModuleNotFoundError("No module named 'elftools'", name="elftools"), 1,
     "flashscope version: error: the package pyelftools is not installed (a dependency of "
     "flashscope: pip install pyelftools)"),
    # any other missing module is a bug
    (lambda: ModuleNotFoundError("No module named 'flashscope.nope'", name="flashscope.nope"),
     1, "flashscope version: internal error: ModuleNotFoundError"),
])
def test_every_failure_ends_in_one_line(error, code, line, monkeypatch, capsys):
    def fail():
        raise error() if callable(error) and not isinstance(error, type) else error

    if code == 141:  # main redirects fd 1 after a broken pipe: give it a fd of its own
        import os
        import sys

        fd = os.open(os.devnull, os.O_WRONLY)
        monkeypatch.setattr(sys, "stdout", os.fdopen(fd, "w"))
    monkeypatch.setattr(cli, "build_parser", _cmd(fail))
    assert main(["version"]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if line is None:
        assert err == ""
    else:
        assert err.strip() == line or err.strip().startswith(line), err


def test_traceback_flag_shows_an_internal_error(monkeypatch):
    def fail():
        raise ZeroDivisionError("x")

    monkeypatch.setattr(cli, "build_parser", _cmd(fail))
    with pytest.raises(ZeroDivisionError):
        main(["--traceback", "version"])


def test_cache_honours_xdg_cache_home(monkeypatch, tmp_path):
    from flashscope.compile import cache_root

    monkeypatch.delenv("FLASHSCOPE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "flashscope"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/not/allowed")  # the spec: ignore it
    assert cache_root() == Path.home() / ".cache" / "flashscope"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "flashscope"
    monkeypatch.setenv("FLASHSCOPE_CACHE", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "own"
