"""ELF reading shared by both vendors: open, check the machine, sections, symbols, notes.

A cubin is an ELF with ``e_machine`` EM_CUDA (190), an AMD code object (hsaco) one with
EM_AMDGPU (224). Anything else, or bytes that are not a well-formed ELF, raises
:class:`~flashscope.errors.ArtifactError` with one line saying what the file is and what
was expected. pyelftools raises a zoo of exceptions on corrupt input (ELFError,
struct.error, ValueError, IndexError, ...): every read goes through :func:`guarded`.
"""

from __future__ import annotations

import io
import struct
from contextlib import contextmanager

from ..errors import ArtifactError

EM_CUDA = 190
EM_AMDGPU = 224
MACHINES = {EM_CUDA: "nvidia", EM_AMDGPU: "amd"}
ELF_MAGIC = b"\x7fELF"


@contextmanager
def guarded(what: str):
    """Turn any parse failure inside the block into one ArtifactError naming ``what``."""
    try:
        yield
    except ArtifactError:
        raise
    except Exception as e:  # corrupt input reaches pyelftools/msgpack in many ways
        raise ArtifactError(f"{what}: corrupt or truncated ELF ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else 'no detail'})") from None


def open_elf(data: bytes, what: str = "artifact"):
    """Parse ``data`` as an ELF; returns (ELFFile, vendor) for a cubin or a hsaco."""
    from elftools.elf.elffile import ELFFile

    if not isinstance(data, (bytes, bytearray)):
        raise ArtifactError(f"{what}: expected binary data, got {type(data).__name__}")
    if len(data) < 64 or data[:4] != ELF_MAGIC:
        raise ArtifactError(f"{what}: not an ELF file (expected a .cubin or .hsaco)")
    with guarded(what):
        elf = ELFFile(io.BytesIO(bytes(data)))
        machine = elf.header["e_machine"]
        num = machine if isinstance(machine, int) else _MACHINE_NUMBERS.get(machine)
        if num not in MACHINES:
            raise ArtifactError(f"{what}: ELF for {machine}, not a GPU binary (expected "
                                "EM_CUDA for a cubin or EM_AMDGPU for a hsaco)")
        # Touch every section header now, so that corruption surfaces here.
        _ = [s.name for s in elf.iter_sections()]
    return elf, MACHINES[num]


_MACHINE_NUMBERS = {"EM_CUDA": EM_CUDA, "EM_AMDGPU": EM_AMDGPU}


def section_data(elf, name: str, what: str) -> "bytes | None":
    with guarded(what):
        sec = elf.get_section_by_name(name)
        if sec is None:
            return None
        return sec.data()


def sections(elf, what: str) -> list:
    """[(name, header dict)] for every section; header keys as pyelftools names them."""
    with guarded(what):
        return [(s.name, dict(s.header)) for s in elf.iter_sections()]


def symbols(elf, what: str) -> list:
    """Names of the symbol table, index order (index 0 is the null symbol)."""
    with guarded(what):
        tab = elf.get_section_by_name(".symtab")
        if tab is None:
            return []
        return [s.name for s in tab.iter_symbols()]


def notes(data: bytes, what: str) -> list:
    """(name, type, desc bytes) of each ELF note record in ``data`` (a SHT_NOTE body).

    Layout: namesz u32, descsz u32, type u32, name (padded to 4), desc (padded to 4)."""
    out, off = [], 0
    while off + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, off)
        off += 12
        name_end = off + namesz
        desc_off = off + ((namesz + 3) & ~3)
        desc_end = desc_off + descsz
        if name_end > len(data) or desc_end > len(data):
            raise ArtifactError(f"{what}: truncated ELF note")
        name = data[off:name_end].rstrip(b"\0").decode("ascii", "replace")
        out.append((name, ntype, bytes(data[desc_off:desc_end])))
        off = desc_off + ((descsz + 3) & ~3)
    return out
