"""Source locations in the assembly Triton keeps (PTX, amdgcn): the ``.file`` table and the
``.loc`` directive in effect at each line, with the chain of call sites it was inlined
through.

Triton inlines every ``@triton.jit`` call, so one instruction has a place in the helper
that produced it and a place in each caller up to the kernel. LLVM writes that chain as
the comment of each ``.loc``::

    .loc 1 142 45   // attention_fwd.py:142:45 @[ attention_fwd.py:287:54 ]      (PTX)
    .loc 1 103 54   ; attention_fwd.py:103:54 @[ a.py:155:58 @[ a.py:287:54 ] ]  (amdgcn)

The directive's own file and line is the innermost frame; each ``@[ file:line:col`` is
the call site one level out, the last one a line of the kernel itself. The comment names
files by base name; they are matched back to the ``.file`` table (a base name two files
share stays a base name). Line 0 means no location.
"""

from __future__ import annotations

import re

_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s+"([^"]*)")?')
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)")
_CALLER = re.compile(r"@\[\s*([^\s:\[\]]+):(\d+)")


class LocTracker:
    """Feed it the ``.file``/``.loc`` lines in order; ``frames`` is the chain in effect:
    ((file, line), ...) innermost first, or () where there is no location."""

    def __init__(self):
        self.files = {}
        self._by_base = {}
        self.frames = ()

    def feed(self, line: str) -> None:
        m = _FILE.match(line)
        if m:
            path = m.group(2) if m.group(3) is None else \
                (m.group(2).rstrip("/") + "/" + m.group(3) if m.group(2) else m.group(3))
            self.files[int(m.group(1))] = path
            base = path.rsplit("/", 1)[-1]
            self._by_base[base] = path if self._by_base.get(base, path) == path else base
            return
        m = _LOC.match(line)
        if not m:
            return
        num, ln = int(m.group(1)), int(m.group(2))
        if ln == 0:
            self.frames = ()
            return
        inner = (self.files.get(num, str(num)), ln)
        comment = line.split("//", 1)[1] if "//" in line else (
            line.split(";", 1)[1] if ";" in line else "")
        outer = tuple((self._by_base.get(f, f), int(n)) for f, n in _CALLER.findall(comment))
        self.frames = (inner,) + outer


def ptx_frames(ptx: str) -> list:
    """The frames in effect at each line of a PTX text (index 0 = line 1): what
    ``.nv_debug_line_sass`` points into. ``.file`` lines come last in Triton's PTX, so the
    text is read twice: the file table first, then the ``.loc`` lines in order."""
    tracker = LocTracker()
    lines = ptx.splitlines()
    for ln in lines:
        if ln.lstrip().startswith(".file"):
            tracker.feed(ln)
    out = []
    for ln in lines:
        if ln.lstrip().startswith(".loc"):
            tracker.feed(ln)
        out.append(tracker.frames)
    return out
