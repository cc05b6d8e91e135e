"""Carry a newer Triton to a GPU machine that has no network, in parts, and install it there.

The Triton 3.9 wheel (cp312-abi3, manylinux x86_64) is 286 MB, more than one call may carry
(64 MiB). ``pack`` strips what a CUDA run does not use and splits the rest, xz-compressed,
into parts below 60 MiB; ``stage`` and ``install`` put them back together on the GPU
machine in consecutive calls, and install the wheel into a folder of its own, which goes
first on PYTHONPATH so the image's Triton stays as it is.

Stripped: the AMD backend (and its entry point), static libraries (``*.a``), CUPTI and
Proton (the profiler: flashscope does not use it), the MLIR headers and test plugins,
FileCheck, and the debug sections and symbol table of ``libtriton.so`` (500 MB to 192
MB; Python loads it through its dynamic symbols). Kept: every Python file, ``libtriton``,
``ptxas``, ``ptxas-blackwell`` (which 3.9 runs from sm_90 on), ``nvdisasm``,
``cuobjdump``, ``libdevice.10.bc`` and the CUDA headers the launcher is compiled against.

Here (a machine with PyPI, binutils' ``strip``):

    pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux_2_28_x86_64 -d /tmp/whl triton==3.9.0
    python scripts/gpu/triton_wheel.py pack /tmp/whl/triton-3.9.0-*.whl .whl-triton

writes ``.whl-triton/p1``, ``p2``, ... (one part each, with the whole file's sha256).
On the GPU machine, one call per part, each within the machine's idle time of the last
(a warm machine keeps /root), carrying that part's folder:

    python3 scripts/gpu/triton_wheel.py stage .whl-triton/p1        # carry .whl-triton/p1
    python3 scripts/gpu/triton_wheel.py install .whl-triton/p2      # carry .whl-triton/p2

``install`` takes the last part, checks the sha256, and installs the wheel with pip
(``--no-deps --no-index``) into /tmp/site; then ``PYTHONPATH=/tmp/site`` (and
``TRITON_BACKENDS_IN_TREE=1``: backends from the imported package's folder, not from
whichever Triton's entry points come first) selects it.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: Files a CUDA run of flashscope does not read (paths inside the wheel, fnmatch patterns).
DROP = (
    "triton/backends/amd/*",
    "*.a",
    "triton/backends/nvidia/lib/cupti/*",
    "triton/backends/nvidia/lib/cupti-blackwell/*",
    "triton/_C/libproton.so",
    "triton/include/*",
    "triton/plugins/*",
    "triton/instrumentation/*.so",
    "triton/FileCheck",
)
#: Shared objects whose debug sections and symbol table are dropped (strip --strip-unneeded).
STRIP = ("triton/_C/libtriton.so",)
PART_BYTES = 60_000_000  # below 60 MiB: each part is one call's carry
STAGED = Path("/root/triton-wheel-parts")
SITE = Path("/tmp/site")
NAME = "triton.whl.xz"


def _fail(message: str):
    """One line on stderr and exit status 2 (bad input), as flashscope's commands do."""
    print(f"triton_wheel: {message}", file=sys.stderr)
    sys.exit(2)


def _dropped(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in DROP)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _entry_points(text: str) -> str:
    """entry_points.txt without the AMD backend's entry (its package is gone)."""
    return "".join(ln for ln in text.splitlines(keepends=True)
                   if not ln.strip().startswith("amd ="))


def strip_wheel(src: Path, dst: Path) -> dict:
    """Write the stripped wheel ``dst`` from ``src``: uncompressed (xz compresses the
    whole better than per-file deflate), RECORD rewritten for what is kept. Returns
    {"kept": n, "dropped": n, "bytes": size of what is kept}."""
    kept, dropped, total, record = 0, 0, 0, []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        infos = zin.infolist()
        record_name = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        for info in infos:
            name = info.filename
            if name == record_name or name.endswith("/"):
                continue
            if _dropped(name):
                dropped += 1
                continue
            data = zin.read(info)
            if name in STRIP:
                data = _strip_symbols(data)
            elif name.endswith(".dist-info/entry_points.txt"):
                data = _entry_points(data.decode()).encode()
            out = zipfile.ZipInfo(name, date_time=info.date_time)
            out.external_attr = info.external_attr  # keeps the tools executable
            zout.writestr(out, data)
            record.append(_record_line(name, data))
            kept += 1
            total += len(data)
        record.append(f"{record_name},,")
        out = zipfile.ZipInfo(record_name, date_time=(2020, 1, 1, 0, 0, 0))
        zout.writestr(out, "\n".join(record) + "\n")
    return {"kept": kept, "dropped": dropped, "bytes": total}


def _strip_symbols(data: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "lib.so"
        path.write_bytes(data)
        subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
        return path.read_bytes()


def pack(wheel: Path, out: Path) -> list:
    """Strip ``wheel``, xz-compress it and split it into ``out/p1``, ``out/p2``, ...;
    returns the part paths. ``out`` must not hold parts already."""
    if not zipfile.is_zipfile(wheel):
        _fail(f"wheel {wheel}: not a wheel (zip) file")
    if list(out.glob("p*/" + NAME + ".*")):
        _fail(f"out {out}: holds parts already (remove them first)")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        stripped = Path(d) / wheel.name
        stats = strip_wheel(wheel, stripped)
        data = lzma.compress(stripped.read_bytes(), preset=9)
    sha = hashlib.sha256(data).hexdigest()
    parts = []
    for i in range(0, len(data), PART_BYTES):
        folder = out / f"p{len(parts) + 1}"
        folder.mkdir(exist_ok=True)
        path = folder / f"{NAME}.{len(parts) + 1:02d}"
        path.write_bytes(data[i:i + PART_BYTES])
        (folder / "whole.json").write_text(
            f'{{"wheel": "{wheel.name}", "sha256": "{sha}", "bytes": {len(data)}, '
            f'"parts": {-(-len(data) // PART_BYTES)}}}\n')
        parts.append(path)
    print(f"{wheel.name}: kept {stats['kept']} files ({stats['bytes'] / 1e6:.0f} MB), "
          f"dropped {stats['dropped']}; {len(data) / 1e6:.1f} MB in {len(parts)} part(s): "
          + " ".join(str(p) for p in parts))
    return parts


def _whole(folder: Path) -> dict:
    import json

    try:
        whole = json.loads((folder / "whole.json").read_text())
        return {k: whole[k] for k in ("wheel", "sha256", "bytes", "parts")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        _fail(f"{folder / 'whole.json'}: not a part's description ({e})")


def stage(folder: Path) -> None:
    """Copy the part in ``folder`` to :data:`STAGED` (kept between calls on a warm machine)."""
    _whole(folder)
    if not list(folder.glob(NAME + ".*")):
        _fail(f"folder {folder}: no part ({NAME}.NN) in it")
    STAGED.mkdir(parents=True, exist_ok=True)
    for p in folder.glob(NAME + ".*"):
        shutil.copy(p, STAGED / p.name)
    shutil.copy(folder / "whole.json", STAGED / "whole.json")
    print(f"staged: {' '.join(sorted(p.name for p in STAGED.glob(NAME + '.*')))}")


def assemble(staged: "Path | None" = None) -> tuple:
    """(wheel file name, wheel bytes) from the parts in ``staged`` (:data:`STAGED`),
    checked against the packed archive's count and sha256."""
    staged = staged or STAGED
    whole = _whole(staged)
    parts = sorted(staged.glob(NAME + ".*"))
    if len(parts) != whole["parts"]:
        _fail(f"{len(parts)} of {whole['parts']} parts in {staged} (the machine went cold "
              "between the calls? stage the others again)")
    data = b"".join(p.read_bytes() for p in parts)
    if hashlib.sha256(data).hexdigest() != whole["sha256"]:
        _fail(f"the parts in {staged} do not make the packed archive (sha256 differs); "
              "stage them again")
    return whole["wheel"], lzma.decompress(data)


def install(folder: Path, site: Path = SITE) -> None:
    """Stage the last part, put the wheel together, install it into ``site`` with pip."""
    stage(folder)
    name, data = assemble()
    with tempfile.TemporaryDirectory() as d:
        wheel = Path(d) / name
        wheel.write_bytes(data)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-index", "--no-compile", "--upgrade", "--target", str(site),
                        str(wheel)], check=True)
    env = dict(os.environ, PYTHONPATH=str(site), TRITON_BACKENDS_IN_TREE="1")
    subprocess.run([sys.executable, "-c", "import triton, triton.backends as b; "
                    "print('triton', triton.__version__, 'from', triton.__file__, "
                    "'backends', sorted(b.backends))"], check=True, env=env)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    a = sub.add_parser("pack", help="strip, compress and split a wheel (here)")
    a.add_argument("wheel", type=Path)
    a.add_argument("out", type=Path)
    a = sub.add_parser("stage", help="keep one part on the GPU machine")
    a.add_argument("folder", type=Path)
    a = sub.add_parser("install", help="the last part: check and install (GPU machine)")
    a.add_argument("folder", type=Path)
    a.add_argument("--site", type=Path, default=SITE)
    args = p.parse_args(argv)
    if args.step == "pack":
        pack(args.wheel, args.out)
    elif args.step == "stage":
        stage(args.folder)
    else:
        install(args.folder, args.site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
