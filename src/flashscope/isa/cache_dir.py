"""Finding kernels on disk: a Triton cache directory, a flashscope cache entry, or a
single binary with or without Triton's metadata JSON next to it.

A Triton cache (``$TRITON_CACHE_DIR``, default ``~/.triton/cache``) holds one directory per
compiled kernel: ``<name>.json`` (metadata: name, num_warps, num_stages, shared = dynamic
shared bytes, target), the binary ``<name>.cubin`` or ``<name>.hsaco`` and the assembly
(``<name>.ptx`` / ``<name>.amdgcn``). Triton (3.6, 3.8) does not write the constexpr values there,
so ``constants`` is None for those kernels; flashscope's own cache entries keep them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ArtifactError

BINARY_EXTS = (".cubin", ".hsaco")
ASM_EXTS = {".cubin": ".ptx", ".hsaco": ".amdgcn"}


@dataclass
class FoundKernel:
    """A binary on disk and what sits next to it."""

    binary: Path
    metadata: Optional[dict] = None  # Triton's <name>.json, when present and readable
    asm: Optional[Path] = None  # the amdgcn text (AMD mix) / PTX, when present
    artifact: Optional[dict] = None  # flashscope's artifact.json, when present


def _inside(path: Path, root: Optional[Path]) -> bool:
    """Whether ``path``, links resolved, lies under ``root`` (None: no bound)."""
    if root is None:
        return True
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a link loop
        return False


def _json(path: Path, root: Optional[Path] = None) -> Optional[dict]:
    if not _inside(path, root):
        return None
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    return d if isinstance(d, dict) else None


def _found(binary: Path, root: Optional[Path] = None) -> FoundKernel:
    d = binary.parent
    meta = _json(binary.with_suffix(".json"), root)
    art = _json(d / "artifact.json", root)
    if art is not None and art.get("binary_file") != binary.name:
        art = None
    if art is not None and meta is None:
        meta = art.get("metadata")
        meta = meta if isinstance(meta, dict) else None
    asm = binary.with_suffix(ASM_EXTS[binary.suffix])
    return FoundKernel(binary, meta, asm if asm.exists() and _inside(asm, root) else None,
                       art)


def find(path) -> list:
    """Kernels at ``path``: a .cubin/.hsaco file, or a directory searched recursively.

    In a directory, links are followed only while they stay inside it: a binary, metadata
    file or folder that a symbolic link places outside the directory is not read (a cache
    folder handed over by someone else cannot point flashscope at other files).
    Raises ArtifactError for a missing path, a file of another kind, or a directory
    without any kernel binary."""
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"{path}: no such file or directory")
    if p.is_file():
        if p.suffix not in BINARY_EXTS:
            # Accept an extensionless/odd name as long as its content says ELF; the
            # readers decide the kind.
            return [FoundKernel(p)]
        return [_found(p)]
    root = p.resolve()
    binaries = sorted(q for q in p.rglob("*") if q.suffix in BINARY_EXTS
                      and _inside(q, root) and q.is_file())
    if not binaries:
        raise ArtifactError(f"{path}: no kernels here (expected a Triton cache directory "
                            "with .cubin or .hsaco files, e.g. $TRITON_CACHE_DIR; links "
                            "leading outside it are not followed)")
    return [_found(b, root) for b in binaries]
