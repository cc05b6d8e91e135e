"""Reader for Nsight Compute's ``--csv`` output.

ncu writes two layouts:

- the *details* page (default): one row per (kernel, metric), columns ``"ID","Process ID",
  "Process Name","Host Name","Kernel Name",...,"Metric Name","Metric Unit","Metric Value"``;
- the *raw* page (``--page raw``): one row per kernel, one column per metric, and a second
  row holding the units (its ``ID`` cell is empty).

Both may be preceded by the profiled program's own output and ``==PROF==`` lines, and
followed by ``==PROF== Disconnected``. Values may carry thousands separators
(``"65,536"``) and read ``n/a`` where a metric does not apply. Anything else malformed
(no header, a row of the wrong width, a value that is not a number, a negative or infinite
counter, binary garbage, a file that is not UTF-8) raises
:class:`~flashscope.errors.ParseError` naming the line.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import ParseError
from .metrics import METRICS, metric_by_key, to_base

_LONG = ("Metric Name", "Metric Unit", "Metric Value")
#: Identity columns of the raw page; every other column is a metric.
_IDENTITY = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time",
             "Context", "Stream", "Block Size", "Grid Size", "Device", "CC", "Section Name",
             "Function Name", "Demangled Name"}
_NA = {"", "n/a", "N/A", "nan", "NaN"}
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d+)?$")


@dataclass
class KernelCounters:
    """The counters of one profiled kernel launch, as ncu printed them."""

    id: int
    name: str
    block: str = ""
    grid: str = ""
    device: str = ""
    cc: str = ""
    raw: dict = field(default_factory=dict)  # ncu metric name -> value (None for n/a)
    units: dict = field(default_factory=dict)  # ncu metric name -> unit string

    def get(self, key: str) -> Optional[float]:
        """A metric by short key or ncu name, in flashscope's unit (ms, B, B/s, %, count);
        None when ncu did not collect it or printed n/a."""
        m = metric_by_key(key)
        name = m.ncu if m else key
        v = self.raw.get(name)
        if v is None:
            return None
        try:
            return to_base(v, self.units.get(name, ""), m.unit if m else None)
        except ValueError as e:
            raise ParseError(f"kernel {self.id} ({self.name[:40]}): {name}: {e}") from None

    def as_dict(self) -> dict:
        d = {"id": self.id, "kernel": self.name, "block": self.block, "grid": self.grid}
        d.update({m.key: self.get(m.key) for m in METRICS})
        return d


def parse_number(text: str, where: str) -> Optional[float]:
    """ncu's printed number -> float; n/a -> None; anything else (text, an infinity, a
    negative value: no counter ncu prints can be below zero) -> ParseError."""
    s = text.strip()
    if s in _NA:
        return None
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    try:
        v = float(s)
    except ValueError:
        raise ParseError(f"{where}: expected a number or n/a, got {text!r}") from None
    if v != v:
        return None
    if v in (float("inf"), float("-inf")) or v < 0:
        raise ParseError(f"{where}: {text.strip()!r} is impossible for a counter (expected a "
                         "finite number >= 0)")
    return v


def decode(data: bytes, source: str) -> str:
    """Bytes of a profiler export -> text; binary or non-UTF-8 input -> ParseError."""
    if not data.strip():
        raise ParseError(f"{source}: file is empty")
    if b"\x00" in data:
        raise ParseError(f"{source}: binary data (NUL bytes), expected a CSV text file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ParseError(f"{source}: not UTF-8 text (byte {e.start}), expected a CSV "
                         "export") from None


def read_ncu_csv(path) -> list:
    """Parse an ncu ``--csv`` file; see :func:`parse_ncu_csv`."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ParseError(f"{p}: cannot read ({e.strerror})") from None
    return parse_ncu_csv(decode(data, str(p)), source=str(p))


def _find_header(lines, source):
    for i, line in enumerate(lines):
        if line.startswith('"ID"') or line.startswith("ID,"):
            try:
                cells = next(csv.reader([line], strict=True))
            except csv.Error as e:
                raise ParseError(f"{source}: line {i + 1}: {e}") from None
            if "Kernel Name" in cells:
                return i, cells
    return None, None


def parse_ncu_csv(text: str, source: str = "ncu csv") -> list:
    """ncu ``--csv`` text -> one :class:`KernelCounters` per profiled launch, in order."""
    if not text.strip():
        raise ParseError(f"{source}: empty input")
    lines = text.splitlines()
    start, header = _find_header(lines, source)
    if header is None:
        raise ParseError(f'{source}: no ncu CSV header (a row starting "ID" with a "Kernel '
                         'Name" column); was ncu run with --csv?')
    col = {name: j for j, name in enumerate(header)}
    body = [(start + 1 + k, line) for k, line in enumerate(lines[start + 1:])
            if line.strip() and not line.startswith("==")]
    long = all(c in col for c in _LONG)
    kernels = {}
    units_row = None
    for lineno, line in body:
        try:
            cells = next(csv.reader([line], strict=True))
        except csv.Error as e:
            raise ParseError(f"{source}: line {lineno + 1}: {e}") from None
        if len(cells) != len(header):
            raise ParseError(f"{source}: line {lineno + 1}: {len(cells)} columns, the header "
                             f"has {len(header)}")
        if not long and cells[col["ID"]].strip() == "":
            units_row = cells
            continue
        where = f"{source}: line {lineno + 1}"
        try:
            kid = int(parse_number(cells[col["ID"]], f"{where}: ID"))
        except TypeError:
            raise ParseError(f"{where}: ID is empty") from None
        pid = cells[col["Process ID"]] if "Process ID" in col else ""
        k = kernels.get((pid, kid))
        if k is None:
            get = (lambda c: cells[col[c]] if c in col else "")
            k = kernels[(pid, kid)] = KernelCounters(
                kid, cells[col["Kernel Name"]], get("Block Size"), get("Grid Size"),
                get("Device"), get("CC"))
        if long:
            name = cells[col["Metric Name"]].strip()
            k.units[name] = cells[col["Metric Unit"]].strip()
            k.raw[name] = parse_number(cells[col["Metric Value"]], f"{where}: {name}")
        else:
            for j, name in enumerate(header):
                if name in _IDENTITY:
                    continue
                k.units[name] = units_row[j].strip() if units_row else ""
                k.raw[name] = parse_number(cells[j], f"{where}: {name}")
    if not kernels:
        raise ParseError(f"{source}: header but no kernel rows (did ncu profile any kernel? "
                         "check its --kernel-name filter)")
    return list(kernels.values())
