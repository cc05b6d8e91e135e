"""``flashscope inspect FILE.py:KERNEL``: any @triton.jit kernel compiled offline for any
target, with everything inspect gives flashscope's own kernels; bad input is one line and
exit 2."""

import csv
import io
import json

from .conftest import KERNELS
from .test_cli import _bad, _run

ADD = str(KERNELS / "small.py") + ":add"
ADD_SIG = ("--signature", "X=*fp32,Y=*fp32,Out=*fp32,N=i32", "--constexpr", "BLOCK=1024")


def test_user_kernel_json(capsys, user_builds):
    code, out, err = _run(capsys, ADD, *ADD_SIG, "--target", "sm90,gfx942", "--json",
                          "--lines")
    assert code == 0, err
    ks = json.loads(out)["kernels"]
    assert [k["target"] for k in ks] == ["sm90", "gfx942"]
    for k in ks:
        assert k["kernel"] == "add" and k["registers"] > 0 and k["occupancy"] > 0
        assert k["mix"] and k["cliffs"] and k["constants"]["BLOCK"] == 1024
        rows = k["lines"]["rows"]
        assert {r["line"] for r in rows} >= {12, 13, 14}  # offsets, the loads, the store
        assert all(c["ok"] for c in k["lines"]["checks"])
    assert ks[0]["mix"]["global"] > 0 and ks[1]["mix"]["buffer_load"] > 0


def test_user_kernel_table(capsys, user_builds):
    code, out, err = _run(capsys, ADD, *ADD_SIG, "--target", "sm90", "--csv")
    assert code == 0, err
    (row,) = csv.DictReader(io.StringIO(out))
    assert "BLOCK=1024" in row["config"] and float(row["occupancy"]) > 0


def test_bad_user_kernels(capsys, tmp_path):
    _bad(capsys, str(tmp_path / "none.py") + ":k", *ADD_SIG, match="no such file")
    _bad(capsys, str(KERNELS / "small.py") + ":nope", *ADD_SIG, match="no kernel 'nope'")
    _bad(capsys, ADD, "--signature", "*fp32,*fp32,i32", "--constexpr", "BLOCK=1024",
         match="3 types for the 4 non-constexpr parameters")
    _bad(capsys, ADD, "--signature", "X=*fp32,Y=*fp32,Out=*fp32,M=i32", "--constexpr",
         "BLOCK=1024", match="no parameter 'M'")
    _bad(capsys, ADD, "--signature", "X=*fp32,Y=*fp32,Out=*fp32,N=int", "--constexpr",
         "BLOCK=1024", match="N=int: expected a Triton type")
    _bad(capsys, ADD, "--signature", "X=*fp32,Y=*fp32,Out=*fp32,N=i32", match="no value for BLOCK")
    _bad(capsys, ADD, "--signature", "X=*fp32,Y=*fp32,Out=*fp32,N=i32", "--constexpr",
         "BLOCK", match="NAME=VALUE")
    _bad(capsys, ADD, "--signature", "X=*fp32,Y=*fp32,Out=*fp32,BLOCK=i32", match="tl.constexpr")
    _bad(capsys, "--signature", "X=*fp32", match="FILE.py:KERNEL")
    broken = tmp_path / "broken.py"
    broken.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                      "def k(X, BLOCK: tl.constexpr):\n"
                      "    x = tl.load(X + tl.arange(0, BLOCK))\n"
                      "    tl.store(X + tl.arange(0, 2 * BLOCK), x)\n")
    _bad(capsys, f"{broken}:k", "--signature", "X=*fp32", "--constexpr", "BLOCK=64",
         "--target", "sm90", match="could not compile it for sm90")
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def k(:\n")
    _bad(capsys, f"{syntax}:k", "--signature", "X=*fp32", match="importing it failed (line 1)")


def test_the_same_kernel_from_two_files_names_each(capsys, tmp_path):
    """Triton keys its cache on a kernel's text: a copy of small.py in another folder,
    built after the original (and the original then removed), still gets line tables
    naming its own file, with the source text beside each row."""
    first, second = tmp_path / "a" / "small.py", tmp_path / "b" / "small.py"
    for p in (first, second):
        p.parent.mkdir()
        p.write_text((KERNELS / "small.py").read_text())
    for p in (first, second):
        code, out, err = _run(capsys, f"{p}:add", *ADD_SIG, "--target", "sm90", "--json",
                              "--lines")
        assert code == 0, err
        rows = json.loads(out)["kernels"][0]["lines"]["rows"]
        assert {r["file"] for r in rows if r["line"] == 13} == {str(p)}
        assert any("tl.load(X + offs" in (r["source"] or "") for r in rows)
        if p == first:
            first.unlink()


def test_a_moved_package_file_is_read_from_the_installed_package():
    """A build of the packages' own kernels naming flashscope's or Triton's files at a
    path that no longer exists (a removed checkout or environment) reads them from the
    installed packages; a binary read from elsewhere keeps the texts it cannot read
    empty (the installed files may no longer hold its text)."""
    import flashscope
    from flashscope.isa.lines import source_lines

    here = flashscope.__file__.rsplit("/", 2)[0]
    want = open(f"{here}/flashscope/kernels/common.py").read().splitlines()
    assert source_lines("/gone/src/flashscope/kernels/common.py", packages=True) == want
    assert source_lines("/gone/venv/site-packages/triton/language/standard.py",
                        packages=True)
    assert source_lines("/gone/elsewhere/nothing_here.py", packages=True) is None
    assert source_lines("/gone/src/flashscope/kernels/common.py") is None


SOFTMAX = str(KERNELS / "small.py") + ":softmax"


def test_narrow_loads_are_counted_and_noted(capsys, compile_cache):
    """A row softmax over fp16 rows (their length a multiple of 16) whose stride the
    compiler may not take as a multiple of 16 elements reads them 16 bits a thread
    (``global_widths``' ``load.b16``, the CSV's column, the note under the table); the
    same kernel with ``stride=i32:16`` reads 128 bits at a time and gets no note."""
    sig = ("--constexpr", "BLOCK=1024", "--target", "sm90")
    code, out, err = _run(capsys, SOFTMAX, "--signature",
                          "X=*fp16,Out=*fp16,stride=i32,N=i32:16", *sig)
    assert code == 0, err
    assert "narrow loads: softmax @ sm90" in out.replace("\n", " ")
    code, out, err = _run(capsys, SOFTMAX, "--signature",
                          "X=*fp16,Out=*fp16,stride=i32,N=i32:16", *sig, "--csv")
    (row,) = csv.DictReader(io.StringIO(out))
    assert int(row["global.load.b16"]) >= 8 and not row.get("global.load.b128")
    code, out, err = _run(capsys, SOFTMAX, "--signature",
                          "X=*fp16,Out=*fp16,stride=i32:16,N=i32:16", *sig, "--json")
    (k,) = json.loads(out)["kernels"]
    assert k["global_widths"].get("load.b128", 0) > 0 and "load.b16" not in k["global_widths"]
    code, out, err = _run(capsys, SOFTMAX, "--signature",
                          "X=*fp16,Out=*fp16,stride=i32:16,N=i32:16", *sig)
    assert code == 0 and "narrow loads" not in out
