"""Nsight Compute's source page, per SASS instruction, joined to the per-line view.

``ncu -i REPORT --page source --csv --print-source sass`` writes, for each profiled kernel,
a ``"Kernel Name","<name>"`` line, then a header (``"Address","Source",<counters>...``) and
one row per SASS instruction: its runtime address, its text, and counters summed over the
launch. The counters read here: ``Instructions Executed`` (warp instructions),
``Thread Instructions Executed``, ``Warp Stall Sampling (All Samples)`` and
``(Not-issued Samples)``, and one ``stall_<reason>`` column per warp-stall reason (the
``(Not Issued)`` variants are left out). A report recorded with ``--section SourceCounters
--section WarpStateStats`` has them all.

The join (:func:`join`): the first row is the kernel's first instruction, so address -
first address is the section-relative offset the cubin's own listing uses; every row must
land on an instruction of the binary, with the same text once predicates' spacing, commas,
``.reuse`` flags and branch targets (absolute at runtime) are set aside. A page of another
build of the kernel fails there, with the first address that differs, rather than adding
counters to the wrong lines.

Without the binary (another library's kernel), a page reads alone (:func:`page_alone`: the
samples by reason and by opcode, the top instructions), and pages of several kernels side
by side (:func:`compare`).
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from dataclasses import dataclass, field

from ..errors import ParseError
from .ncu_csv import decode, parse_number

EXECUTED = "Instructions Executed"
#: page column -> counter key in the per-line rows
COLUMNS = {
    EXECUTED: "instructions_executed",
    "Thread Instructions Executed": "thread_instructions_executed",
    "Warp Stall Sampling (All Samples)": "stall_samples",
    "Warp Stall Sampling (Not-issued Samples)": "stall_samples_not_issued",
}


@dataclass
class SourcePage:
    """One kernel of a source page: addresses, SASS text and counters per instruction."""

    kernel: str
    addresses: list = field(default_factory=list)
    sass: list = field(default_factory=list)
    counters: list = field(default_factory=list)  # one {key: value} per instruction
    source: str = ""


def read(text: str, source: str) -> list:
    """The kernels of a source-page CSV, in order; ParseError naming the line for anything
    malformed (a row of the wrong width, a count that is not a number), or naming the file
    where no page is in it. What ncu's live profiling prints to the same stdout is passed
    over: the profiled program's own output before the first page, and ncu's messages
    (``==PROF==``, ``==WARNING==``, ``==ERROR==`` lines) anywhere."""
    pages, cur, header, kernel = [], None, None, None
    rows = list(csv.reader(io.StringIO(text)))
    for n, row in enumerate(rows, 1):
        if not row or not any(c.strip() for c in row) or _NCU_MESSAGE.match(row[0]):
            continue
        if row[0] == "Kernel Name":
            kernel, header, cur = (row[1] if len(row) > 1 else ""), None, None
            continue
        if row[0] == "Address":
            header = row
            if "Source" not in header:
                raise ParseError(f"{source}:{n}: source-page header without a Source column")
            cur = SourcePage(kernel or "", source=source)
            pages.append(cur)
            continue
        if header is None:
            if not pages:  # the profiled program's output, before ncu's page
                continue
            raise ParseError(f"{source}:{n}: expected a \"Kernel Name\" or \"Address\" line "
                             "of ncu's source page (--page source --csv)")
        if len(row) != len(header):
            raise ParseError(f"{source}:{n}: {len(row)} fields, the header has {len(header)}")
        d = dict(zip(header, row))
        try:
            addr = int(d["Address"], 16)
        except ValueError:
            raise ParseError(f"{source}:{n}: address {d['Address']!r} is not hexadecimal") \
                from None
        values = {}
        for col, val in d.items():
            key = COLUMNS.get(col) or (f"stall.{col[len('stall_'):]}" if col.startswith(
                "stall_") and "Not Issued" not in col else None)
            if key:
                v = parse_number(val, f"{source}:{n} {col}")
                if v is not None:
                    values[key] = v
        cur.addresses.append(addr)
        cur.sass.append(d["Source"])
        cur.counters.append(values)
    if not pages or not any(p.addresses for p in pages):
        raise ParseError(f"{source}: no instruction rows of ncu's source page (expected the "
                         "output of --page source --csv --print-source sass)")
    return pages


#: a line ncu prints among the profiled program's output (and so in a page exported to stdout)
_NCU_MESSAGE = re.compile(r"==(PROF|WARNING|ERROR|INFO)==")


def load(path) -> list:
    """:func:`read` of a file, plain or gzipped."""
    p = str(path)
    try:
        with open(p, "rb") as f:
            data = f.read()
        if p.endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ParseError(f"{p}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    return read(decode(data, p), p)


def pick(pages: list, kernel: str = "") -> SourcePage:
    """The page of ``kernel`` (a substring of its name), or the only one."""
    hits = [p for p in pages if kernel in p.kernel] if kernel else pages
    if len(hits) != 1:
        names = ", ".join(p.kernel for p in pages)
        raise ParseError(f"{pages[0].source}: {len(hits)} kernels match {kernel!r} "
                         f"({names}); name one with --kernel-name")
    return hits[0]


_NORM = [(re.compile(r"\.reuse\b"), ""), (re.compile(r"\(\*.*?\*\)"), ""),
         (re.compile(r"[\s,;]+"), " ")]
_BRANCH = re.compile(r"\b(BRA|BRX|CALL|JMP|JMX|BSSY|RET)\b")
_TARGET = re.compile(r"`?\(?\.L_x_\d+\)?|0x[0-9a-f]+")


def _norm(text: str) -> str:
    """SASS text as both listings agree on it: no ``.reuse``, one space between operands,
    branch targets (absolute at runtime, labels or offsets offline) left out."""
    t = text
    for pat, rep in _NORM:
        t = pat.sub(rep, t)
    if _BRANCH.search(t):
        t = _TARGET.sub("T", t)
    return t.strip()


def join(page: SourcePage, instructions: list) -> None:
    """Set ``counters`` on each :class:`~flashscope.isa.lines.Instruction` from the page
    row at its offset; ParseError when a row finds no instruction or another one."""
    at = {i.address: i for i in instructions}
    base = page.addresses[0]
    for addr, sass, values in zip(page.addresses, page.sass, page.counters):
        off = addr - base
        ins = at.get(off)
        if ins is None:
            raise ParseError(f"{page.source}: the page has an instruction at +0x{off:x} "
                             f"({sass.strip()}), the binary none: not this build's page")
        if _norm(ins.text) != _norm(sass):
            raise ParseError(f"{page.source}: at +0x{off:x} the page has "
                             f"{sass.strip()!r}, the binary {ins.text!r}: not this build's page")
        ins.counters = values


def by_reason(rows) -> dict:
    """{stall reason: samples} summed over per-line rows' own counters."""
    return _reasons(r.counters or {} for r in rows)


def _reasons(counters) -> dict:
    """{stall reason: samples} summed over counter dicts (``stall.<reason>`` keys)."""
    out = {}
    for c in counters:
        for k, v in c.items():
            if k.startswith("stall."):
                out[k[len("stall."):]] = out.get(k[len("stall."):], 0) + v
    return out


_PREDICATE = re.compile(r"^@!?U?P\w+$")


def opcode(sass: str) -> str:
    """The mnemonic of a SASS line without its modifiers: ``@!P2 BRA 0x..`` -> BRA,
    ``HGMMA.64x64x16.F32.BF16 ..`` -> HGMMA."""
    words = sass.split()
    if words and _PREDICATE.match(words[0]):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def page_alone(page: SourcePage, top: int = 20) -> dict:
    """A page read without its binary (another library's kernel, whose build flashscope
    cannot make): the launch's stall samples by reason and by opcode, and the ``top``
    instructions by samples (offset from the first, SASS, counters). Shares are of the
    page's stall samples."""
    total = sum(c.get("stall_samples", 0) for c in page.counters)
    reasons, ops = _reasons(page.counters), {}
    for sass, c in zip(page.sass, page.counters):
        op = ops.setdefault(opcode(sass), {"instructions": 0, "instructions_executed": 0,
                                           "stall_samples": 0})
        op["instructions"] += 1
        op["instructions_executed"] += c.get("instructions_executed", 0)
        op["stall_samples"] += c.get("stall_samples", 0)
    base = page.addresses[0]
    order = sorted(range(len(page.sass)), key=lambda i: -page.counters[i].get(
        "stall_samples", 0))
    return {"kernel": page.kernel, "instructions": len(page.sass), "stall_samples": total,
            "stalls_by_reason": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
            "by_opcode": [{"opcode": k, **v} for k, v in sorted(
                ops.items(), key=lambda kv: (-kv[1]["stall_samples"], kv[0]))],
            "top": [{"offset": page.addresses[i] - base, "sass": page.sass[i].strip(),
                     "counters": page.counters[i]} for i in order[:top]]}


def compare(pages: list) -> dict:
    """Several pages alone (:func:`page_alone`) side by side: each opcode's and each stall
    reason's share of every page's samples (0 where a page has none), the opcodes ordered
    by their largest share, and each opcode's warp instructions executed per page."""
    alone = [page_alone(p, 0) for p in pages]
    totals = [a["stall_samples"] or 1.0 for a in alone]
    ops = sorted({o["opcode"] for a in alone for o in a["by_opcode"]})
    by_op = []
    for op in ops:
        got = [next((o for o in a["by_opcode"] if o["opcode"] == op), None) for a in alone]
        by_op.append({"opcode": op,
                      "share": [(g["stall_samples"] if g else 0) / t
                                for g, t in zip(got, totals)],
                      "instructions_executed": [g["instructions_executed"] if g else 0
                                                for g in got]})
    reasons = sorted({r for a in alone for r in a["stalls_by_reason"]})
    by_reason = [{"reason": r, "share": [a["stalls_by_reason"].get(r, 0) / t
                                         for a, t in zip(alone, totals)]} for r in reasons]
    return {"pages": [{k: a[k] for k in ("kernel", "instructions", "stall_samples")}
                      for a in alone],
            "by_opcode": sorted(by_op, key=lambda r: (-max(r["share"]), r["opcode"])),
            "by_reason": sorted(by_reason, key=lambda r: (-max(r["share"]), r["reason"]))}
