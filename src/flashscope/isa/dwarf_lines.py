"""DWARF line tables (versions 2 to 4), read without a debugger: address -> (file, line).

A cubin built with ``-lineinfo`` (Triton always passes it) carries two such tables:
``.debug_line`` maps each SASS address to the kernel's source file and line, and
``.nv_debug_line_sass`` maps it to the line of the PTX that ptxas compiled. Each sequence
of a table starts with ``DW_LNE_set_address``, relocated against the kernel's ``.text``
section (``.rela.<table>``); that relocation says which kernel the sequence describes.

The line program is the standard state machine (DWARF 4, section 6.2): standard opcodes
1-12, extended opcodes (end_sequence, set_address, define_file, set_discriminator) and
special opcodes that advance address and line together. Anything malformed raises
:class:`~flashscope.errors.ArtifactError` naming the section.
"""

from __future__ import annotations

import struct

from ..errors import ArtifactError
from . import elf as elfmod


def _leb(data: bytes, off: int, signed: bool = False) -> tuple:
    """(value, next offset) of a LEB128 number at ``off``."""
    result = shift = 0
    while True:
        b = data[off]
        off += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            if signed and b & 0x40:
                result -= 1 << shift
            return result, off


def _uleb(data: bytes, off: int) -> tuple:
    return _leb(data, off)


def _cstr(data: bytes, off: int) -> tuple:
    end = data.index(b"\0", off)
    return data[off:end].decode("utf-8", "replace"), end + 1


def programs(data: bytes, what: str) -> list:
    """Every line program of a ``.debug_line``-style section: a list of
    ``(offset, files, rows)``, ``files`` the file names by index (1-based, joined with their
    include directory), ``rows`` the (address, file index, line, set_address offset)
    entries in program order, an end of sequence as ``line`` None."""
    out, off = [], 0
    try:
        while off + 4 <= len(data):
            start = off
            (unit,) = struct.unpack_from("<I", data, off)
            off += 4
            addr64 = unit == 0xFFFFFFFF
            if addr64:
                (unit,) = struct.unpack_from("<Q", data, off)
                off += 8
            end = off + unit
            if end > len(data):
                raise ArtifactError(f"{what}: truncated line table at offset {start}")
            (version,) = struct.unpack_from("<H", data, off)
            off += 2
            if not 2 <= version <= 4:
                raise ArtifactError(f"{what}: DWARF line table version {version} at offset "
                                    f"{start} (2 to 4 are read)")
            header_len, off = (struct.unpack_from("<Q", data, off)[0], off + 8) if addr64 \
                else (struct.unpack_from("<I", data, off)[0], off + 4)
            prog = off + header_len
            min_inst = data[off]
            off += 1
            if version >= 4:
                off += 1  # maximum_operations_per_instruction (VLIW only)
            off += 1  # default_is_stmt
            line_base = struct.unpack_from("<b", data, off)[0]
            line_range, opcode_base = data[off + 1], data[off + 2]
            off += 3
            std_lengths = list(data[off:off + opcode_base - 1])
            off += opcode_base - 1
            dirs = [""]
            while data[off]:
                d, off = _cstr(data, off)
                dirs.append(d)
            off += 1
            files = [None]
            while data[off]:
                name, off = _cstr(data, off)
                d, off = _uleb(data, off)
                _, off = _uleb(data, off)
                _, off = _uleb(data, off)
                files.append(_join(dirs[d] if d < len(dirs) else "", name))
            if line_range == 0:
                raise ArtifactError(f"{what}: line table with line_range 0")
            rows = _run(data, prog, end, min_inst, line_base, line_range, opcode_base,
                        std_lengths, files, dirs)
            out.append((start, files, rows))
            off = end
    except ArtifactError:
        raise
    except (IndexError, ValueError, struct.error):
        raise ArtifactError(f"{what}: corrupt or truncated DWARF line table") from None
    return out


def _join(d: str, name: str) -> str:
    if not d or name.startswith("/"):
        return name
    return d.rstrip("/") + "/" + name


def _run(data, off, end, min_inst, line_base, line_range, opcode_base, std_lengths, files,
         dirs) -> list:
    rows = []
    addr, file, line, addr_at = 0, 1, 1, None
    while off < end:
        op = data[off]
        off += 1
        if op >= opcode_base:
            adj = op - opcode_base
            addr += (adj // line_range) * min_inst
            line += line_base + adj % line_range
            rows.append((addr, file, line, addr_at))
        elif op == 0:
            length, off = _uleb(data, off)
            sub = data[off]
            body = off + 1
            if sub == 1:  # end_sequence
                rows.append((addr, file, None, addr_at))
                addr, file, line, addr_at = 0, 1, 1, None
            elif sub == 2:  # set_address
                size = length - 1
                addr = int.from_bytes(data[body:body + size], "little")
                addr_at = body
            elif sub == 3:  # define_file
                name, p = _cstr(data, body)
                d, _ = _uleb(data, p)
                files.append(_join(dirs[d] if d < len(dirs) else "", name))
            off += length
        elif op == 1:  # copy
            rows.append((addr, file, line, addr_at))
        elif op == 2:  # advance_pc
            v, off = _uleb(data, off)
            addr += v * min_inst
        elif op == 3:  # advance_line
            v, off = _leb(data, off, signed=True)
            line += v
        elif op == 4:  # set_file
            file, off = _uleb(data, off)
        elif op == 5:  # set_column
            _, off = _uleb(data, off)
        elif op == 8:  # const_add_pc
            addr += ((255 - opcode_base) // line_range) * min_inst
        elif op == 9:  # fixed_advance_pc
            addr += struct.unpack_from("<H", data, off)[0]
            off += 2
        elif op in (6, 7, 10, 11):  # negate_stmt, basic_block, prologue_end, epilogue_begin
            pass
        else:  # set_isa and any opcode this reader does not know: skip its operands
            for _ in range(std_lengths[op - 1] if op - 1 < len(std_lengths) else 0):
                _, off = _uleb(data, off)
    return rows


def _relocated_symbols(elf, section: str, what: str) -> dict:
    """{offset in ``section``: the section name its relocation points at} (``.text.<k>``
    for a kernel's code), from ``.rela<section>``."""
    out = {}
    with elfmod.guarded(what):
        rela = elf.get_section_by_name(f".rela{section}")
        if rela is None:
            return out
        symtab = elf.get_section(rela["sh_link"])
        for rel in rela.iter_relocations():
            sym = symtab.get_symbol(rel["r_info_sym"])
            if sym["st_shndx"] in ("SHN_UNDEF", "SHN_ABS") or not isinstance(
                    sym["st_shndx"], int):
                continue
            out[rel["r_offset"]] = elf.get_section(sym["st_shndx"]).name
    return out


def kernel_tables(elf, section: str, kernels: list, what: str) -> "dict | None":
    """{kernel: [(address, file, line), ...] sorted by address, ``line`` None where a
    sequence ends} from one line-table section of a cubin, or None without that section.

    A sequence belongs to the kernel whose ``.text`` section its set_address is relocated
    against; a cubin of one kernel needs no relocation."""
    data = elfmod.section_data(elf, section, what)
    if data is None:
        return None
    relocs = _relocated_symbols(elf, section, what)
    out = {k: [] for k in kernels}
    for start, files, rows in programs(data, f"{what}: {section}"):
        for addr, fi, line, at in rows:
            target = relocs.get(at) if at is not None else None
            k = target[len(".text."):] if target and target.startswith(".text.") else (
                kernels[0] if len(kernels) == 1 else None)
            if k not in out:
                continue
            name = files[fi] if 0 < fi < len(files) else None
            out[k].append((addr, name, line))
    for k in out:
        out[k].sort(key=lambda r: (r[0], r[2] is not None))
    return out


def lookup(table: list, addresses: list) -> list:
    """(file, line) or None for each address (ascending), from one kernel's sorted
    ``table``: the last row at or below the address, unless a sequence ended there."""
    out, j, cur = [], 0, None
    for a in addresses:
        while j < len(table) and table[j][0] <= a:
            cur = table[j]
            j += 1
        out.append(None if cur is None or cur[2] is None else (cur[1], cur[2]))
    return out
