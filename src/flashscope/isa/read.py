"""From binaries to :class:`KernelRecord`: a compiled artifact, or files on disk.

shared_bytes = static (in the binary, less the sm_90+ system reserve, which is
``reserved_shared_bytes``) + dynamic (Triton's ``metadata.shared``, which is the dynamic
allocation it launches with). Without Triton's metadata (a bare binary) the dynamic
part is unknown: ``dynamic_shared_bytes`` is None and shared_bytes holds the static part.
threads = num_warps x wave size from the metadata, else the binary's own block size
(EIATTR_REQNTID on NVIDIA, ``.max_flat_workgroup_size`` on AMD).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ArtifactError, FlashscopeError
from . import amd, nvidia
from .cache_dir import find
from .elf import open_elf
from .record import READER_VERSION, KernelRecord


def _record(d: dict, vendor: str, target: str, meta: "dict | None") -> KernelRecord:
    meta = meta or {}
    wave = d.get("wave_size") or (32 if vendor == "nvidia" else None)
    if not wave and isinstance(meta.get("target"), dict):
        wave = meta["target"].get("warp_size")
    num_warps = meta.get("num_warps")
    threads = num_warps * wave if num_warps and wave else (d.get("threads") or
                                                           d.get("max_threads"))
    if not num_warps and threads and wave:
        num_warps = threads // wave
    dyn = meta.get("shared")
    static = d.get("static_shared_bytes")
    rec = KernelRecord(
        kernel=d["kernel"], target=target, vendor=vendor,
        registers=d.get("registers"), agprs=d.get("agprs"), sgprs=d.get("sgprs"),
        spill_stores=d.get("spill_stores"), spill_loads=d.get("spill_loads"),
        vgpr_spills=d.get("vgpr_spills"), sgpr_spills=d.get("sgpr_spills"),
        local_bytes=d.get("local_bytes"), static_shared_bytes=static,
        dynamic_shared_bytes=dyn, reserved_shared_bytes=d.get("reserved_shared_bytes"),
        shared_bytes=(static or 0) + (dyn or 0) if static is not None or dyn is not None
        else None,
        threads=threads, num_warps=num_warps, wave_size=wave, barriers=d.get("barriers"),
        instructions=d.get("instructions"), wgmma_serialized=d.get("wgmma_serialized"),
        global_widths=d.get("global_widths"),
        mix=d.get("mix"), opcodes=d.get("opcodes"),
        features=list(d.get("features") or []), num_stages=meta.get("num_stages"))
    return rec


def read_binary(data: bytes, what: str, meta: "dict | None" = None,
                asm_text: "str | None" = None, sass: "str | None" = None) -> list:
    """Records for every kernel of a cubin or hsaco (``meta``: Triton's metadata JSON;
    ``asm_text``: amdgcn text for the AMD mix; ``sass``: the cubin's SASS when it was
    disassembled already, e.g. by :func:`nvidia.disassemble_many`)."""
    _, vendor = open_elf(data, what)
    if vendor == "nvidia":
        rows = nvidia.read_cubin(data, what, sass=sass)
    else:
        rows = amd.read_hsaco(data, what, text=asm_text)
    out = []
    for d in rows:
        target = d.get("arch") or "unknown"
        m = meta if meta and meta.get("name") in (None, d["kernel"]) else None
        out.append(_record(d, vendor, target, m))
    return out


def _record_path(art) -> "Path | None":
    return Path(art.path) / f"record-v{READER_VERSION}.json" if art.path else None


def cached_record(art) -> "KernelRecord | None":
    """The record stored next to a compiled artifact, or None (none, or unreadable)."""
    cached = _record_path(art)
    if cached is None or not cached.exists():
        return None
    try:
        return KernelRecord.from_dict(json.loads(cached.read_text()))
    except (OSError, ValueError, TypeError):
        return None


class Reader:
    """Records for artifacts that arrive one at a time (from compile workers, say).

    :meth:`add` reads a stored record or an AMD code object at once, and opens a cubin and
    sets its ``.text`` sections aside; :meth:`disassemble` sends the cubins set aside so far
    to nvdisasm in a background thread (one run per architecture: its ~0.25 s start-up,
    not the work, is what a run per cubin costs); :meth:`records` waits and returns one
    :class:`KernelRecord` or :class:`~flashscope.errors.FlashscopeError` per artifact, in
    the order added. Called while other cubins still compile, :meth:`disassemble` keeps
    nvdisasm off the path after the last compile.
    """

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self._arts, self._out = [], []
        self._waiting = []  # (slot, rows, sm, texts) not yet sent to nvdisasm
        self._jobs = []  # (future, [(slot, rows)])
        self._pool = ThreadPoolExecutor(1)

    def add(self, art) -> None:
        slot = len(self._arts)
        self._arts.append(art)
        rec = cached_record(art)
        try:
            if rec is None and art.vendor == "nvidia":
                rows, sm, texts = nvidia.cubin_parts(art.binary, _what(art))
                self._waiting.append((slot, rows, sm, texts))
            elif rec is None:
                rec = _finish(art, _rows(art), "amd")
        except FlashscopeError as e:
            rec = e
        self._out.append(rec)

    def disassemble(self) -> None:
        if self._waiting:
            batch, self._waiting = self._waiting, []
            fut = self._pool.submit(nvidia.disassemble_texts, [(sm, t) for _, _, sm, t in batch])
            self._jobs.append((fut, [(slot, rows) for slot, rows, _, _ in batch]))

    def records(self) -> list:
        self.disassemble()
        try:
            for fut, items in self._jobs:
                for (slot, rows), sass in zip(items, fut.result()):
                    art = self._arts[slot]
                    try:  # a cubin nvdisasm could not read in the batch: alone, by name
                        sass = sass if sass is not None else nvidia.disassemble(art.binary,
                                                                                _what(art))
                        self._out[slot] = _finish(art, nvidia.with_mix(rows, sass), "nvidia")
                    except FlashscopeError as e:
                        self._out[slot] = e
        finally:
            self._pool.shutdown()
        self._jobs = []
        return list(self._out)


def records_for(arts) -> list:
    """:func:`record_for` over many artifacts through one :class:`Reader` (one nvdisasm run
    per architecture); raises the first artifact's error, if any."""
    reader = Reader()
    for a in arts:
        reader.add(a)
    recs = reader.records()
    for r in recs:
        if isinstance(r, FlashscopeError):
            raise r
    return recs


def _what(art) -> str:
    return f"{art.kernel}@{art.target}"


def _rows(art, sass: "str | None" = None) -> list:
    """The reader's dicts for an artifact's binary (its vendor's reader; ``sass``: the
    cubin's SASS when disassembled already, the amdgcn text is the artifact's own)."""
    if art.vendor == "nvidia":
        return nvidia.read_cubin(art.binary, _what(art), sass=sass)
    return amd.read_hsaco(art.binary, _what(art), text=art.asm)


def _finish(art, rows: list, vendor: str, store: bool = True) -> KernelRecord:
    """The record of ``art``'s kernel from its reader rows, labelled with the config it was
    built from and (``store``) kept next to the artifact."""
    recs = [_record(d, vendor, d.get("arch") or "unknown",
                    art.metadata if art.metadata and art.metadata.get("name") in
                    (None, d["kernel"]) else None) for d in rows]
    rec = next((r for r in recs if r.kernel == art.name), recs[0])
    rec.target = art.target
    rec.config, rec.head_dim, rec.dtype, rec.causal = (art.config, art.head_dim, art.dtype,
                                                      art.causal)
    rec.constants = dict(art.constants)
    rec.source = art.path
    cached = _record_path(art) if store else None
    if cached is not None:
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(rec.as_dict(), sort_keys=True))
            os.replace(tmp, cached)
        except OSError:
            pass
    return rec


def record_for(art, use_cache: bool = True, sass: "str | None" = None) -> KernelRecord:
    """The record of a compiled :class:`~flashscope.compile.Artifact`, cached next to it."""
    if use_cache:
        rec = cached_record(art)
        if rec is not None:
            return rec
    return _finish(art, _rows(art, sass), art.vendor, store=use_cache)


def read_path(path) -> list:
    """Records for a .cubin, a .hsaco, or every kernel in a (Triton or flashscope) cache
    directory. Raises ArtifactError for anything unreadable."""
    out = []
    files = list(find(path))
    blobs = []
    for f in files:
        try:
            blobs.append(f.binary.read_bytes())
        except OSError as e:
            raise ArtifactError(f"{f.binary}: cannot read ({e.strerror})") from None
    nv = [i for i, f in enumerate(files) if f.binary.suffix == ".cubin"]
    sass = dict(zip(nv, nvidia.disassemble_many([blobs[i] for i in nv]) if len(nv) > 1
                    else [None] * len(nv)))
    for i, (f, data) in enumerate(zip(files, blobs)):
        asm_text = None
        if f.asm is not None and f.asm.suffix == ".amdgcn":
            try:
                asm_text = f.asm.read_text(errors="replace")
            except OSError:
                asm_text = None
        for rec in read_binary(data, str(f.binary), f.metadata, asm_text, sass=sass.get(i)):
            rec.source = str(f.binary)
            if f.artifact:
                a = f.artifact
                rec.config, rec.head_dim = a.get("config"), a.get("head_dim")
                rec.dtype, rec.causal = a.get("dtype"), a.get("causal")
                rec.constants, rec.target = a.get("constants"), a.get("target", rec.target)
            out.append(rec)
    return out


def attach_occupancy(rec: KernelRecord) -> KernelRecord:
    """Fill ``occupancy`` and ``limiter`` from ``flashscope.occupancy.occupancy_for_record``
    when that function exists and knows the target; else leave them None."""
    try:
        from ..occupancy import occupancy_for_record
    except ImportError:
        return rec
    try:
        d = occupancy_for_record(rec).as_dict()
    except FlashscopeError:
        return rec
    rec.occupancy = d.get("occupancy")
    lim = d.get("limiter")
    rec.limiter = list(lim) if lim is not None else None
    return rec
