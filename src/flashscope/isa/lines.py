"""Registers, spills and instructions per source line, read from a kernel's binary.

Every instruction gets a place in the source and a count of live registers; the per-line
view sums the first and takes the peak and mean of the second.

Where an instruction comes from
  NVIDIA: ``.nv_debug_line_sass`` (in every cubin Triton builds, which passes ptxas
  ``-lineinfo``) gives the PTX line each SASS instruction was compiled from; the ``.loc``
  in effect there in Triton's PTX gives its file and line and the chain of call sites it
  was inlined through (:mod:`.locations`). Without the PTX (a bare cubin) ``.debug_line``
  gives the innermost file and line alone, and the call sites are unknown.
  AMD: the ``.loc`` directives of the amdgcn text Triton keeps beside the code object.
  A code object read alone has no instructions to attribute (no disassembler here).

What is live
  Liveness of the binary's own registers over its control-flow graph (:mod:`.dataflow`,
  with :mod:`.sass_flow` for SASS and :mod:`.amdgcn_flow` for AMDGCN). On NVIDIA it
  equals ``nvdisasm --life-range-mode count`` at every instruction (tested), and it also
  works where nvdisasm refuses ("Invalid register count" at 255 registers, the spilling
  kernels). On AMD it counts VGPRs, AGPRs and SGPRs apart; a row's live registers are
  VGPRs + AGPRs, the per-lane vector registers.

Inlined helpers
  An instruction counts for its innermost line (``instructions``, ``live_registers_*``,
  spills) and, under ``inlined``, for each call site it was inlined through: a kernel line
  that calls a helper shows the helper's instructions there too, and the helper's own lines
  show them as their own. Sums over rows of the own counts equal the kernel's totals.

Checks (:func:`checks`), on every kernel read:
  NVIDIA: the highest register used + 1 + 2 reserved = the registers the cubin allocates
  (R252 -> 255); with ``setmaxnreg`` (warp-specialized kernels raise one partition's
  budget) the highest + 3 is at most the largest budget set. AMD: highest VGPR + 1 =
  NumVgprs (``.vgpr_count``: on gfx90a+ VGPRs rounded up to 4 plus AGPRs), highest AGPR + 1
  = ``.agpr_count``, highest SGPR + 1 + the reserved SGPRs (VCC; on gfx9 FLAT_SCRATCH and
  XNACK_MASK too) = ``.sgpr_count``. Everywhere: the live peak is at most the allocation
  (with ``setmaxnreg``, the largest budget); the gap between them (alignment of register
  groups, fragmentation) is reported.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePath
from typing import Optional

from ..errors import ArtifactError
from . import amd, amdgcn_flow, dwarf_lines, nvidia, sass_flow
from .dataflow import defining_steps, liveness
from .elf import open_elf
from .locations import ptx_frames

#: Bumped whenever what this module extracts changes, so stored views are recomputed.
LINES_VERSION = 5
#: Registers ptxas reserves beyond the highest one a kernel names (registers = R_max + 3).
NVIDIA_RESERVED = 2

_SETMAXNREG = re.compile(r"USETMAXREG\.\S+\s+(?:U?P\w+,\s*)?(0x[0-9a-f]+)")
_AMD_RESERVE = re.compile(r"^\s*\.amdhsa_(reserve_vcc|reserve_xnack_mask|"
                          r"reserve_flat_scratch)\s+(\d)")
_AMD_KERNEL = re.compile(r"^\s*\.amdhsa_kernel\s+(\S+)")


@dataclass
class LineRow:
    """One source line: own instructions by class, live registers over them, spills, and
    (``inlined``) the same over the instructions of helpers inlined at this line."""

    file: str
    line: int
    source: Optional[str] = None
    helper: bool = False  # never the kernel's outermost frame: a helper's line
    count: int = 0
    instructions: dict = field(default_factory=dict)
    live_registers_max: Optional[int] = None
    live_registers_mean: Optional[float] = None
    spill_stores: int = 0
    spill_loads: int = 0
    inlined: Optional[dict] = None
    counters: Optional[dict] = None  # profiler counters summed over own instructions


@dataclass
class KernelLines:
    """The per-line view of one kernel and the checks of its registers."""

    kernel: str
    target: str
    vendor: str
    rows: list
    instructions: int
    unattributed: int
    line_table: bool
    call_sites: bool
    registers: Optional[int]
    highest_register: dict
    reserved_registers: Optional[int]
    live_peak: Optional[int]
    live_mean: Optional[float]
    gap: Optional[int]
    peak: Optional[dict]
    checks: list
    setmaxnreg: list = field(default_factory=list)
    live_peaks: dict = field(default_factory=dict)  # AMD: per register class
    note: Optional[str] = None
    source: Optional[str] = None
    loops: list = field(default_factory=list)  # :func:`loop_rows`

    def as_dict(self) -> dict:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "KernelLines":
        d = dict(d)
        d["rows"] = [LineRow(**r) for r in d["rows"]]
        return cls(**d)


# -- shared aggregation ---------------------------------------------------------------

def _library(path: str) -> bool:
    """A file of Triton's own language (tl.max, tl.sum, ...), not the user's."""
    return "/triton/language/" in path or "/triton/experimental/" in path


def row_order(path: str, line: int) -> tuple:
    """Rows in reading order: the user's files first, then Triton's own."""
    return (_library(path), path, line)


@functools.lru_cache(maxsize=None)
def _package_roots() -> tuple:
    """The folders holding the installed flashscope and Triton packages (found, not
    imported)."""
    roots = []
    for name in ("flashscope", "triton"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).resolve().parent.parent)
    return tuple(dict.fromkeys(roots))


def source_lines(path: str, packages: bool = False) -> "list | None":
    """The lines of a source file a line table names, or None where it cannot be read.

    ``packages``: for a build of the installed packages' own source (a flashscope kernel
    built or found in a cache by its current text). Such a build names the file its
    text was first compiled from: Triton's cache and flashscope's own key a kernel on
    its text, not its path, so the name may be a checkout or virtual environment removed
    since, or another checkout whose file has changed since. With ``packages`` the name
    is looked up first by its last three, then two components under the installed
    flashscope and Triton packages (``flashscope/kernels/x.py``,
    ``triton/language/standard.py``), whose text the build was keyed on, then as named.
    Not for binaries read from elsewhere, whose text the installed files may no longer
    hold."""
    parts = PurePath(path).parts
    tries = [Path(root, *parts[-k:]) for k in (3, 2) if packages and len(parts) > k
             for root in _package_roots()] + [Path(path)]
    for p in tries:
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                return f.read().splitlines()
        except OSError:
            continue
    return None


class _Sources:
    """Line texts of the files named by the line tables (None where unreadable), each
    file read once (:func:`source_lines`)."""

    def __init__(self, packages: bool = False):
        self._files = {}
        self._packages = packages

    def text(self, path: str, line: int) -> Optional[str]:
        if path not in self._files:
            self._files[path] = source_lines(path, self._packages)
        lines = self._files[path]
        return lines[line - 1].rstrip() if lines and 0 < line <= len(lines) else None


def _summary(items: list, mix_of) -> dict:
    ops = Counter(i.opcode for i in items)
    mix, _ = mix_of(ops)
    live = [i.live for i in items if i.live is not None]
    out = {"count": len(items),
           "instructions": {k: v for k, v in mix.items() if v},
           "live_registers_max": max(live) if live else None,
           "live_registers_mean": round(sum(live) / len(live), 2) if live else None,
           "spill_stores": sum(1 for i in items if i.spill == "store"),
           "spill_loads": sum(1 for i in items if i.spill == "load")}
    if any(i.counters for i in items):
        total = Counter()
        for i in items:
            total.update(i.counters or {})
        out["counters"] = dict(total)
    return out


@dataclass
class Instruction:
    """One instruction as the per-line view needs it."""

    address: int  # section-relative (NVIDIA) or index in the kernel (AMD)
    text: str
    opcode: str  # the mix's opcode (SASS base mnemonic, MUFU.<fn>; amdgcn mnemonic)
    frames: tuple  # ((file, line), ...) innermost first; () without a location
    live: Optional[int]
    spill: Optional[str] = None  # "store" / "load"
    counters: Optional[dict] = None


def aggregate(instrs: list, mix_of, sources: "_Sources | None" = None) -> tuple:
    """(rows, unattributed count) from :class:`Instruction` values: own counts on the
    innermost frame, ``inlined`` on each call site (``sources``: the files' texts, read
    once per kernel with :func:`loop_rows`)."""
    own, via, outermost = {}, {}, set()
    unattributed = 0
    for ins in instrs:
        frames = ins.frames
        if not frames:
            unattributed += 1
            continue
        own.setdefault(frames[0], []).append(ins)
        outermost.add(frames[-1])
        for f in set(frames[1:]):
            via.setdefault(f, []).append(ins)
    sources = sources or _Sources()
    rows = []
    for key in sorted(set(own) | set(via), key=lambda k: row_order(*k)):
        r = LineRow(file=key[0], line=key[1], source=sources.text(*key),
                    helper=key not in outermost)
        if key in own:
            s = _summary(own[key], mix_of)
            r.count, r.instructions = s["count"], s["instructions"]
            r.live_registers_max, r.live_registers_mean = (s["live_registers_max"],
                                                           s["live_registers_mean"])
            r.spill_stores, r.spill_loads = s["spill_stores"], s["spill_loads"]
            r.counters = s.get("counters")
        if key in via:
            r.inlined = _summary(via[key], mix_of)
        rows.append(r)
    return rows, unattributed


def loop_rows(instrs: list, steps: list, mix_of, sources: "_Sources | None" = None) -> list:
    """The loops of one kernel in program order: each branch back to an earlier
    instruction closes one, from its target to the branch (back edges to one head make
    one loop, to the farthest). Back edges past the kernel's last exit are left out: they
    close the compiler's out-of-line retry blocks (a failed mbarrier wait), which jump
    back into the code they left. Each row: ``first``/``last`` (the instructions'
    addresses), ``depth`` (loops around it), ``file``/``line``/``source`` of the back
    edge (the loop's own statement, where the line table names it) and the
    instructions' summary: count and classes, live registers, spill stores and loads
    (a spill inside a hot loop costs every iteration; one outside it, once)."""
    exits = [k for k, ins in enumerate(instrs) if ins.opcode in ("EXIT", "s_endpgm")]
    last_exit = exits[-1] if exits else len(steps)
    heads = {}
    for k, st in enumerate(steps[:last_exit]):
        for t in st.targets:
            if t < k:
                heads[t] = max(heads.get(t, k), k)
    spans = sorted(heads.items())
    sources = sources or _Sources()
    rows = []
    for t, k in spans:
        frame = instrs[k].frames[0] if instrs[k].frames else None
        rows.append({
            "first": instrs[t].address, "last": instrs[k].address,
            "depth": sum(1 for a, b in spans if a <= t and k <= b and (a, b) != (t, k)),
            "file": frame[0] if frame else None, "line": frame[1] if frame else None,
            "source": sources.text(*frame) if frame else None,
            **_summary(instrs[t:k + 1], mix_of)})
    return rows


def _peak(steps, live, count_of, frames_of, sources: "_Sources | None" = None
          ) -> Optional[dict]:
    """The instruction where the most registers are live, and which source lines wrote the
    values live there: each live register counts once, for the nearest write that reaches
    it (its innermost frame outside Triton's own library); ``unexplained``: registers no
    write reaches (live from the kernel's entry)."""
    counts = [count_of(m) for m in live]
    if not counts:
        return None
    at = max(range(len(counts)), key=lambda i: counts[i])
    by_line, seen = Counter(), 0
    for i, mask in defining_steps(steps, live, at).items():
        fr = frames_of(i)
        user = next((f for f in fr if not _library(f[0])), fr[0] if fr else None)
        by_line[user] += count_of(mask)
        seen |= mask
    sources = sources or _Sources()
    lines = [{"file": k[0], "line": k[1], "source": sources.text(*k), "registers": n}
             if k else {"file": None, "line": None, "source": None, "registers": n}
             for k, n in by_line.most_common()]
    fr = frames_of(at)
    return {"index": at, "file": fr[0][0] if fr else None, "line": fr[0][1] if fr else None,
            "live": counts[at], "by_line": lines,
            "unexplained": count_of(live[at] & ~seen)}


def _check(name: str, ok: bool, detail: str) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail}


# -- NVIDIA ---------------------------------------------------------------------------

def _sass_for(cubin: bytes, what: str, sass: Optional[str]) -> tuple:
    """(listing, labels by kernel): the raw listing of :func:`nvidia.disassemble_many`
    (branch targets as addresses), else the ELF-mode one with its ``.L_x_N`` labels."""
    if sass is None:
        sass = nvidia.disassemble_many([cubin])[0]
    if sass is not None:
        return sass, {}
    sass = nvidia.disassemble(cubin, what)
    labels, cur, pending = {}, None, []
    for line in sass.splitlines():
        m = re.match(r"^\s*\.section\s+\.text\.([^,\s]+)", line)
        if m:
            cur = labels.setdefault(m.group(1), {})
            continue
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"^\s*/\*([0-9a-f]{4,})\*/", line)
        if m and cur is not None:
            for lab in pending:
                cur[lab] = int(m.group(1), 16)
            pending = []
    return sass, labels


def nvidia_instructions(cubin: bytes, what: str = "cubin", ptx: Optional[str] = None,
                        sass: Optional[str] = None) -> dict:
    """{kernel: (record row, [Instruction], steps, live masks, call sites agree?)} of every
    kernel of a cubin: what :func:`nvidia_lines` sums, and what a profiler's per-address
    counters are joined to (``ptx``: Triton's PTX, for the inlined call sites; ``sass``:
    a listing made already)."""
    rows_meta, _, _ = nvidia.cubin_parts(cubin, what)
    elf, _ = open_elf(cubin, what)
    kernels = [r["kernel"] for r in rows_meta]
    src = dwarf_lines.kernel_tables(elf, ".debug_line", kernels, what)
    via_ptx = dwarf_lines.kernel_tables(elf, ".nv_debug_line_sass", kernels, what) \
        if ptx else None
    ptx_fr = ptx_frames(ptx) if ptx else None
    listing, labels = _sass_for(cubin, what, sass)
    by_kernel = nvidia.sass_lines(listing)
    out = {}
    for meta in rows_meta:
        k = meta["kernel"]
        lines = [ln for _, ln in by_kernel.get(k, [])]
        head = re.match(r"^\s*/\*([0-9a-f]+)\*/", lines[0]) if lines else None
        start = int(head.group(1), 16) if head else 0
        instrs, steps = sass_flow.kernel_steps(lines, start, labels.get(k),
                                               nvidia.indirect_branches(cubin, k, what))
        live = [lv | i.defs for lv, i in zip(liveness(steps), instrs)]
        addrs = [i.addr for i in instrs]
        flat = dwarf_lines.lookup(src[k], addrs) if src and src.get(k) else None
        frames, agree = _nvidia_frames(addrs, flat, via_ptx, ptx_fr, k)
        ops = [op for op, _ in by_kernel.get(k, [])]
        out[k] = (meta, [Instruction(i.addr, i.text, op, f, sass_flow.count(m),
                                     {"STL": "store", "LDL": "load"}.get(op))
                         for i, op, f, m in zip(instrs, ops, frames, live)],
                  steps, live, (flat is not None, via_ptx is not None and agree,
                                via_ptx is not None))
    return out


def nvidia_lines(cubin: bytes, what: str = "cubin", ptx: Optional[str] = None,
                 sass: Optional[str] = None, target: Optional[str] = None,
                 counters=None, packages: bool = False) -> list:
    """:class:`KernelLines` for every kernel of a cubin (``ptx``: Triton's PTX of it, for
    the inlined call sites; ``sass``: a listing made already; ``counters(kernel,
    instructions)``: sets profiler counters on the instructions before they are summed;
    ``packages``: a build of the installed packages' kernels, :func:`source_lines`)."""
    out, sources = [], _Sources(packages)  # each file's text read once for every table
    for k, (meta, instrs, steps, live, (has_table, sites, had_ptx)) in \
            nvidia_instructions(cubin, what, ptx, sass).items():
        if counters is not None:
            counters(k, instrs)
        rows, unattributed = aggregate(instrs, nvidia.mix_of, sources)
        used = 0
        for st in steps:
            used |= st.uses | st.defs
        caps = [int(m.group(1), 16) for m in (_SETMAXNREG.search(i.text) for i in instrs
                                               if i.opcode == "USETMAXREG") if m]
        counts = [i.live for i in instrs]
        peak = _peak(steps, live, sass_flow.count, lambda j: instrs[j].frames, sources)
        if peak:
            peak["address"] = instrs[peak.pop("index")].address
        kl = KernelLines(
            kernel=k, target=target or meta.get("arch") or "unknown", vendor="nvidia",
            rows=rows, instructions=len(instrs), unattributed=unattributed,
            line_table=has_table, call_sites=sites, registers=meta["registers"],
            highest_register={"R": sass_flow.highest(used)},
            reserved_registers=NVIDIA_RESERVED,
            live_peak=max(counts) if counts else None,
            live_mean=round(sum(counts) / len(counts), 2) if counts else None,
            gap=max([meta["registers"]] + caps) - max(counts) if counts else None,
            peak=peak, checks=[], setmaxnreg=sorted(set(caps)), source=what,
            loops=loop_rows(instrs, steps, nvidia.mix_of, sources))
        kl.checks = _nvidia_checks(kl, sites if had_ptx else None)
        if not has_table:
            kl.note = "no line table (.debug_line) in this cubin: totals only"
        elif not had_ptx:
            kl.note = "no PTX beside this cubin: own lines only, inlined call sites unknown"
        out.append(kl)
    return out


def _nvidia_frames(addrs, flat, via_ptx, ptx_fr, k) -> tuple:
    """Frames per instruction and whether the PTX chain agrees with ``.debug_line``."""
    if not via_ptx or not via_ptx.get(k) or ptx_fr is None:
        return [(f,) if f else () for f in (flat or [None] * len(addrs))], False
    out, agree = [], True
    for a, pl, fl in zip(addrs, dwarf_lines.lookup(via_ptx[k], addrs),
                         flat or [None] * len(addrs)):
        fr = ptx_fr[pl[1] - 1] if pl and 0 < pl[1] <= len(ptx_fr) else ()
        # Lines only: ptxas starts no .debug_line row where only the file changes (line
        # 24 of one helper right after line 24 of another keeps the first file's name),
        # which the PTX chain gets right.
        if fl and fr and fr[0][1] != fl[1]:
            agree = False
        out.append(fr or ((fl,) if fl else ()))
    if not agree:  # this PTX is not the one the cubin was built from
        return [(f,) if f else () for f in (flat or [None] * len(addrs))], False
    return out, True


def _nvidia_checks(kl: KernelLines, ptx_agrees) -> list:
    high = kl.highest_register.get("R")
    out = []
    if high is not None:
        want = high + 1 + NVIDIA_RESERVED
        if kl.setmaxnreg:
            cap = max(kl.setmaxnreg)
            out.append(_check("highest register", want <= cap,
                              f"R{high} + 1 + {NVIDIA_RESERVED} reserved = {want}, within "
                              f"the largest setmaxnreg budget {cap} (launch allocation "
                              f"{kl.registers})"))
        else:
            out.append(_check("highest register", want == kl.registers,
                              f"R{high} + 1 + {NVIDIA_RESERVED} reserved = {want}; the cubin "
                              f"allocates {kl.registers}"))
    if kl.live_peak is not None:
        cap = max([kl.registers] + kl.setmaxnreg)
        out.append(_check("live peak", kl.live_peak <= cap,
                          f"{kl.live_peak} live at most, {cap} allocated: gap "
                          f"{cap - kl.live_peak}"))
    out.append(_check("rows add up", sum(r.count for r in kl.rows) + kl.unattributed
                      == kl.instructions, f"{kl.instructions} instructions, "
                      f"{kl.unattributed} without a line"))
    if ptx_agrees is not None:
        out.append(_check("PTX matches the cubin", ptx_agrees,
                          "the PTX .loc chain names the line .debug_line names"
                          if ptx_agrees else "PTX lines disagree with .debug_line: call "
                          "sites not used"))
    return out


# -- AMD ------------------------------------------------------------------------------

def _amd_reserved(text: str) -> dict:
    """{kernel: {"reserve_vcc": 0/1, ...}} from the ``.amdhsa_kernel`` blocks."""
    out, cur = {}, None
    for line in text.splitlines():
        m = _AMD_KERNEL.match(line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        m = _AMD_RESERVE.match(line)
        if m and cur is not None:
            cur[m.group(1)] = int(m.group(2))
    return out


def reserved_sgprs(arch: str, reserve: dict) -> int:
    """SGPRs a code object counts beyond those the kernel names (LLVM's
    getNumExtraSGPRs): VCC (2) when reserved; on GFX8/9 4 with XNACK_MASK and 6 with
    FLAT_SCRATCH, which gfx940 and later (architected flat scratch) always count."""
    vcc = reserve.get("reserve_vcc", 1)
    extra = 2 if vcc else 0
    major = int(arch[3:-2]) if re.fullmatch(r"gfx\d+[0-9a-f]{2}", arch or "") else 10
    if major >= 10:
        return extra
    if reserve.get("reserve_xnack_mask"):
        extra = 4
    if reserve.get("reserve_flat_scratch", 0) or arch.startswith(("gfx94", "gfx95")):
        extra = 6
    return extra


def amd_lines(hsaco: bytes, text: str, what: str = "hsaco",
              target: Optional[str] = None, packages: bool = False) -> list:
    """:class:`KernelLines` for every kernel of a code object from its amdgcn ``text``
    (``packages`` as in :func:`nvidia_lines`)."""
    metas = amd.read_hsaco(hsaco, what, text=None)
    parsed = amdgcn_flow.parse_kernels(text, [m["kernel"] for m in metas])
    reserves = _amd_reserved(text)
    out, sources = [], _Sources(packages)  # each file's text read once for every table
    for meta in metas:
        k = meta["kernel"]
        instrs = parsed.get(k, [])
        steps = amdgcn_flow.kernel_steps(instrs)
        live = [lv | i.defs for lv, i in zip(liveness(steps), instrs)]
        vec = [amdgcn_flow.count(m, "v") + amdgcn_flow.count(m, "a") for m in live]
        per_instr = [Instruction(i.index, i.text, i.opcode, i.frames, c,
                                 "store" if i.opcode.startswith("scratch_store") else
                                 "load" if i.opcode.startswith("scratch_load") else None)
                     for i, c in zip(instrs, vec)]
        rows, unattributed = aggregate(per_instr, amd.mix_of, sources)
        used = 0
        for i in instrs:
            used |= i.uses | i.defs
        high = {c: amdgcn_flow.highest(used, c) for c in ("v", "a", "s")}
        peaks = {c: max((amdgcn_flow.count(m, c) for m in live), default=0)
                 for c in ("v", "a", "s")}
        arch = target or meta.get("arch") or "unknown"

        def vec_count(m):
            return amdgcn_flow.count(m, "v") + amdgcn_flow.count(m, "a")

        peak = _peak(steps, live, vec_count, lambda j: instrs[j].frames, sources)
        if peak:
            peak["instruction"] = instrs[peak.pop("index")].text
        reg = meta["registers"]
        kl = KernelLines(
            kernel=k, target=arch, vendor="amd", rows=rows, instructions=len(instrs),
            unattributed=unattributed, line_table=any(i.frames for i in instrs),
            call_sites=any(i.frames for i in instrs), registers=reg,
            highest_register=high,
            reserved_registers=reserved_sgprs(arch, reserves.get(k, {})),
            live_peak=max(vec) if vec else None,
            live_mean=round(sum(vec) / len(vec), 2) if vec else None,
            gap=reg - max(vec) if vec and reg is not None else None, peak=peak, checks=[],
            live_peaks=peaks, source=what,
            loops=loop_rows(per_instr, steps, amd.mix_of, sources))
        kl.checks = _amd_checks(kl, meta)
        if not kl.line_table:
            kl.note = "no .loc directives in the amdgcn text: totals only"
        out.append(kl)
    return out


def _amd_checks(kl: KernelLines, meta: dict) -> list:
    h = kl.highest_register
    arch_v = (h["v"] + 1) if h["v"] is not None else 0
    agprs = (h["a"] + 1) if h["a"] is not None else 0
    out = []
    if meta.get("agprs") is not None or agprs:
        unified = (arch_v + 3) // 4 * 4 + agprs if agprs else arch_v
        out.append(_check("highest VGPR/AGPR", unified == kl.registers,
                          f"v{h['v']} + 1 = {arch_v} VGPRs (to a multiple of 4 when AGPRs "
                          f"follow) + {agprs} AGPRs = {unified}; .vgpr_count {kl.registers}"))
        used = f"a{h['a']} + 1 = {agprs}" if h["a"] is not None else "no AGPR used"
        out.append(_check("highest AGPR", agprs == (meta.get("agprs") or 0),
                          f"{used}; .agpr_count {meta.get('agprs')}"))
    else:
        out.append(_check("highest VGPR", arch_v == kl.registers,
                          f"v{h['v']} + 1 = {arch_v}; .vgpr_count {kl.registers}"))
    if h["s"] is not None and meta.get("sgprs") is not None:
        want = h["s"] + 1 + kl.reserved_registers
        out.append(_check("highest SGPR", want == meta["sgprs"],
                          f"s{h['s']} + 1 + {kl.reserved_registers} reserved = {want}; "
                          f".sgpr_count {meta['sgprs']}"))
    if kl.live_peak is not None and kl.registers is not None:
        out.append(_check("live peak", kl.live_peak <= kl.registers,
                          f"{kl.live_peak} VGPRs + AGPRs live at most, {kl.registers} "
                          f"allocated: gap {kl.registers - kl.live_peak}"))
    out.append(_check("rows add up", sum(r.count for r in kl.rows) + kl.unattributed
                      == kl.instructions, f"{kl.instructions} instructions, "
                      f"{kl.unattributed} without a line"))
    return out


# -- entry points ---------------------------------------------------------------------

def lines_for_binary(data: bytes, what: str, asm_text: Optional[str] = None,
                     sass: Optional[str] = None, target: Optional[str] = None,
                     packages: bool = False) -> list:
    """:class:`KernelLines` of every kernel in a cubin (``asm_text``: its PTX) or a code
    object (``asm_text``: its amdgcn text, required: a code object alone cannot be
    disassembled here); ``packages``: a build of the installed packages' kernels, whose
    texts come from them (:func:`source_lines`)."""
    _, vendor = open_elf(data, what)
    if vendor == "nvidia":
        return nvidia_lines(data, what, ptx=asm_text, sass=sass, target=target,
                            packages=packages)
    if not asm_text:
        raise ArtifactError(f"{what}: a code object alone has no instructions to attribute "
                            "to lines; the amdgcn text Triton keeps beside it (<name>.amdgcn) "
                            "is needed")
    return amd_lines(data, asm_text, what, target=target, packages=packages)


def _stored(art) -> "str | None":
    return os.path.join(art.path, f"lines-v{LINES_VERSION}.json") if art.path else None


def lines_for_artifact(art, sass: Optional[str] = None) -> KernelLines:
    """The per-line view of a compiled :class:`~flashscope.compile.Artifact`, kept next to
    it (``lines-v<N>.json``) so that a second reading is one JSON load."""
    path = _stored(art)
    if path and os.path.exists(path):
        try:
            with open(path) as f:
                kl = KernelLines.from_dict(json.load(f))
            _package_texts(kl)  # stored where the texts could not be read
            return kl
        except (OSError, ValueError, TypeError):
            pass
    views = lines_for_binary(art.binary, f"{art.kernel}@{art.target}", art.asm, sass,
                             target=art.target, packages=True)
    kl = next((v for v in views if v.kernel == art.name), views[0])
    kl.source = art.path
    if path:
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                json.dump(kl.as_dict(), f)
            os.replace(tmp, path)
        except OSError:
            pass
    return kl


def _package_texts(kl: KernelLines) -> None:
    """Fill the texts a stored view left empty, its files named at a path that was gone
    when it was read (:func:`source_lines` with ``packages``: an artifact is built, or
    found in the cache, by its kernel's current text)."""
    sources = _Sources(packages=True)
    for r in kl.rows:
        if r.source is None and r.file:
            r.source = sources.text(r.file, r.line)
    for d in (*(kl.peak or {}).get("by_line", ()), *kl.loops):
        if d.get("source") is None and d.get("file"):
            d["source"] = sources.text(d["file"], d["line"])


def lines_for_artifacts(arts) -> list:
    """:func:`lines_for_artifact` over many artifacts, the cubins not read before
    disassembled together (one nvdisasm run per architecture); one KernelLines or the
    FlashscopeError that stopped it per artifact."""
    from ..errors import FlashscopeError

    todo = [i for i, a in enumerate(arts) if a.vendor == "nvidia" and not (
        _stored(a) and os.path.exists(_stored(a)))]
    listings = dict(zip(todo, nvidia.disassemble_many([arts[i].binary for i in todo])))
    out = []
    for i, a in enumerate(arts):
        try:
            out.append(lines_for_artifact(a, listings.get(i)))
        except FlashscopeError as e:
            out.append(e)
    return out


def lines_for_path(path) -> list:
    """[(binary path, [KernelLines] or the FlashscopeError that stopped it)] for a .cubin,
    a .hsaco (with its .amdgcn beside it) or every kernel of a Triton or flashscope cache
    directory."""
    from ..errors import FlashscopeError
    from .cache_dir import find

    out = []
    for f in find(path):
        try:
            data = f.binary.read_bytes()
            asm_text = f.asm.read_text(errors="replace") if f.asm is not None else None
            target = (f.artifact or {}).get("target")
            out.append((str(f.binary), lines_for_binary(data, str(f.binary), asm_text,
                                                        target=target)))
        except OSError as e:
            out.append((str(f.binary), ArtifactError(f"{f.binary}: cannot read "
                                                     f"({e.strerror})")))
        except FlashscopeError as e:
            out.append((str(f.binary), e))
    return out


# -- two kernels side by side -----------------------------------------------------------

#: what :func:`diff_lines` reads of a loop or a line on each side
_SIDE_KEYS = ("count", "instructions", "live_registers_max", "spill_stores", "spill_loads")


def _side(summary: Optional[dict]) -> Optional[dict]:
    """A loop's summary or a row's fields (``vars`` of a :class:`LineRow`), as a side."""
    return None if summary is None else {k: summary[k] for k in _SIDE_KEYS}


def _paired(a: Optional[dict], b: Optional[dict]) -> dict:
    return {"a": a, "b": b,
            "delta": None if a is None or b is None else b["count"] - a["count"]}


def diff_lines(a: KernelLines, b: KernelLines, top: int = 20) -> dict:
    """B - A by structure and by source line, for two builds of one kernel (two configs,
    two head dims, a change and the tree before it): where instructions came or went.

    ``loops``: the loops of both, matched by their statement (file and line of the back
    edge), nesting depth and rank among the loops of that statement and depth (a helper
    inlined three times closes three loops at one line), in A's program order and then
    B's loops that A lacks; each side's instruction count, instructions by class, live
    registers at most and spills (None where that side has no such loop). ``lines``: the
    ``top`` source lines (0: all) whose own instruction count changed most, each side as
    for a loop. ``delta``: B's count minus A's, None where a side lacks it."""
    def keyed(loops):
        seen, out = Counter(), {}
        for lp in loops:
            base = (lp.get("file"), lp.get("line"), lp.get("depth"))
            out[base + (seen[base],)] = lp
            seen[base] += 1
        return out

    la, lb = keyed(a.loops), keyed(b.loops)
    loops = []
    for key in list(la) + [k for k in lb if k not in la]:
        lp = la.get(key) or lb[key]
        loops.append({"file": key[0], "line": key[1], "depth": key[2], "rank": key[3],
                      "source": lp.get("source"),
                      **_paired(_side(la.get(key)), _side(lb.get(key)))})
    ra = {(r.file, r.line): vars(r) for r in a.rows if r.count}
    rb = {(r.file, r.line): vars(r) for r in b.rows if r.count}
    lines = []
    for key in sorted(set(ra) | set(rb), key=lambda k: row_order(*k)):
        r = ra.get(key) or rb[key]
        lines.append({"file": key[0], "line": key[1], "source": r["source"],
                      **_paired(_side(ra.get(key)), _side(rb.get(key)))})

    def change(e):
        return abs(e["delta"]) if e["delta"] is not None else (e["a"] or e["b"])["count"]
    changed = sorted((e for e in lines if change(e)), key=lambda e: -change(e))
    if top:
        changed = changed[:top]
    kept = {(e["file"], e["line"]) for e in changed}
    return {"a": f"{a.kernel} @ {a.target}", "b": f"{b.kernel} @ {b.target}",
            "instructions": {"a": a.instructions, "b": b.instructions,
                             "delta": b.instructions - a.instructions},
            "loops": loops, "lines": [e for e in lines if (e["file"], e["line"]) in kept]}
