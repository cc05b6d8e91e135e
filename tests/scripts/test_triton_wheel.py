"""scripts/gpu/triton_wheel.py: a wheel stripped for a CUDA run, packed into parts and put
back together (no GPU; a small stand-in wheel with the real one's layout)."""

import base64
import hashlib
import os
import sys
import zipfile

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path[:0] = [os.path.join(ROOT, "scripts", "gpu")]

import triton_wheel  # noqa: E402

FILES = {
    "triton/__init__.py": b"__version__ = '3.9.0'\n",
    "triton/backends/nvidia/compiler.py": b"# nvidia\n",
    "triton/backends/nvidia/bin/ptxas": os.urandom(3000),
    "triton/backends/nvidia/lib/libdevice.10.bc": b"bc" * 500,
    "triton/backends/nvidia/include/cuda.h": b"/* cuda */\n",
    "triton/backends/nvidia/lib/cupti/libcupti.so": b"x" * 100,
    "triton/backends/nvidia/lib/cupti/libcupti_static.a": b"x" * 100,
    "triton/backends/amd/compiler.py": b"# amd\n",
    "triton/_C/libproton.so": b"p" * 100,
    "triton/include/triton/Dialect/X.h": b"// mlir\n",
    "triton/FileCheck": b"fc",
    "triton-3.9.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: triton\nVersion: 3.9.0\n",
    "triton-3.9.0.dist-info/entry_points.txt":
        b"[triton.backends]\namd = triton.backends.amd\nnvidia = triton.backends.nvidia\n",
}
KEPT = {"triton/__init__.py", "triton/backends/nvidia/compiler.py",
        "triton/backends/nvidia/bin/ptxas", "triton/backends/nvidia/lib/libdevice.10.bc",
        "triton/backends/nvidia/include/cuda.h", "triton-3.9.0.dist-info/METADATA",
        "triton-3.9.0.dist-info/entry_points.txt", "triton-3.9.0.dist-info/RECORD"}


@pytest.fixture
def wheel(tmp_path):
    path = tmp_path / "triton-3.9.0-cp312-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in FILES.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o755 if name.endswith("ptxas") else 0o644) << 16
            z.writestr(info, data)
        z.writestr("triton-3.9.0.dist-info/RECORD", "stale\n")
    return path


def test_strip_keeps_what_a_cuda_run_reads_and_records_it(wheel, tmp_path):
    out = tmp_path / "stripped.whl"
    stats = triton_wheel.strip_wheel(wheel, out)
    with zipfile.ZipFile(out) as z:
        assert set(z.namelist()) == KEPT and stats["kept"] == len(KEPT) - 1
        assert stats["dropped"] == len(FILES) - len(KEPT) + 1
        assert z.getinfo("triton/backends/nvidia/bin/ptxas").external_attr >> 16 == 0o755
        assert b"amd" not in z.read("triton-3.9.0.dist-info/entry_points.txt")
        record = z.read("triton-3.9.0.dist-info/RECORD").decode().splitlines()
        for line in record[:-1]:
            name, digest, size = line.rsplit(",", 2)
            data = z.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + want.decode() and int(size) == len(data), name
        assert record[-1] == "triton-3.9.0.dist-info/RECORD,,"


def test_parts_come_back_as_the_stripped_wheel(wheel, tmp_path, monkeypatch):
    monkeypatch.setattr(triton_wheel, "PART_BYTES", 1000)
    monkeypatch.setattr(triton_wheel, "STAGED", tmp_path / "staged")
    parts = triton_wheel.pack(wheel, tmp_path / "out")
    assert len(parts) >= 2 and all(p.stat().st_size <= 1000 for p in parts)
    for p in parts[:-1]:
        triton_wheel.stage(p.parent)
    with pytest.raises(SystemExit) as e:  # the last part not staged yet
        triton_wheel.assemble()
    assert e.value.code == 2
    triton_wheel.stage(parts[-1].parent)
    name, data = triton_wheel.assemble()
    triton_wheel.strip_wheel(wheel, tmp_path / "again.whl")
    assert name == wheel.name and data == (tmp_path / "again.whl").read_bytes()
    parts[0].write_bytes(b"damaged")  # a part from another pack
    triton_wheel.stage(parts[0].parent)
    with pytest.raises(SystemExit):
        triton_wheel.assemble()


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "not.whl").write_text("text")
    for argv in (["pack", str(tmp_path / "not.whl"), str(tmp_path / "o")],
                 ["stage", str(tmp_path)]):
        with pytest.raises(SystemExit) as e:
            triton_wheel.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("triton_wheel: ")
