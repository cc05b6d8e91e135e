"""``flashscope profile --lines``: Nsight Compute's per-instruction counters of one launch of
flashscope's forward, or of a backward kernel (``--kernel``; warp stalls by reason,
instructions executed), summed per source line beside the registers, spills and
instruction mix of :mod:`flashscope.isa.lines`.

Recording (GPU): the launch runs under ``ncu --section SourceCounters --section
WarpStateStats`` with ``TRITON_CACHE_DIR`` pointed at a fresh folder, so the cubin and PTX
of the launched kernel are there afterwards, and the report's source page is exported
with ``ncu -i REPORT --page source --csv --print-source sass``. By hand, the same::

    TRITON_CACHE_DIR=OUT/triton-cache ncu --clock-control none \\
        --section SourceCounters --section WarpStateStats -k regex:_attn_fwd \\
        --launch-skip 1 --launch-count 1 -o OUT/lines \\
        python -m flashscope.profile.child flashscope 4,16,4096,128 bf16 0 "BLOCK_M=..."
    ncu -i OUT/lines.ncu-rep --page source --csv --print-source sass > OUT/source.csv

Replay (anywhere): the exported page with the binary it was recorded from (``--binary``:
the Triton cache folder, a .cubin or a flashscope cache entry), or with the config built
offline for ``--target``; the page's SASS must be the binary's, instruction by
instruction (:func:`flashscope.profile.source_page.join`).
"""

from __future__ import annotations

import os
import subprocess
import sys

from ..errors import FlashscopeError
from . import source_page

SECTIONS = ("SourceCounters", "WarpStateStats")


#: the families whose kernels run in the backward (the child then runs one)
BACKWARD_FAMILIES = ("triton-bwd", "sm90-bwd")


def recorded_kernel(kernel: str = "fwd") -> tuple:
    """(ncu's kernel-name regex, the backward family the child runs or "") of ``kernel``,
    a name of ``flashscope inspect --kernel``: ``fwd`` the forward the launch picks, a
    forward family's kernel that one, a backward kernel its family's backward. The
    decoding kernels do not run in ``flashscope.attention``: refused."""
    from ..compile import FORWARD_ALIASES, kernel_spec

    if kernel in FORWARD_ALIASES:
        return "_attn_fwd", ""
    spec = kernel_spec(kernel)
    if spec.family in BACKWARD_FAMILIES:
        return f"^{spec.function}$", spec.family
    if spec.family.endswith("-fwd"):
        return f"^{spec.function}$", ""
    raise FlashscopeError(f"--kernel {kernel}: profile --lines records flashscope.attention's "
                          "forward or backward kernels; this one runs in decoding")


def record_command(shape, dtype: str, causal: bool, config: str, report: str,
                   ncu: str = "ncu", kernel: str = "fwd") -> list:
    """The ncu command that records one flashscope launch's source counters: of the
    forward, or of ``kernel`` (:func:`recorded_kernel`)."""
    regex, family = recorded_kernel(kernel)
    cmd = [ncu, "--clock-control", "none"]
    for s in SECTIONS:
        cmd += ["--section", s]
    cmd += ["-k", f"regex:{regex}", "--launch-skip", "1", "--launch-count", "1", "-f",
            "-o", report, sys.executable, "-m", "flashscope.profile.child", "flashscope",
            ",".join(map(str, shape)), dtype, "1" if causal else "0"]
    if family:
        return cmd + [config, family]
    return cmd + ([config] if config else [])


def record(shape, dtype: str, causal: bool, config: str, out_dir: str,
           ncu: str = "ncu", timeout: float = 900.0, kernel: str = "fwd") -> tuple:
    """Profile one launch on this machine's GPU (of ``kernel``, :func:`record_command`);
    returns (source page path, the Triton cache folder holding the launched kernel's
    binary)."""
    from .runner import find_ncu

    exe = find_ncu(ncu)
    os.makedirs(out_dir, exist_ok=True)
    cache = os.path.join(out_dir, "triton-cache")
    report = os.path.join(out_dir, "lines")
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    proc = subprocess.run(record_command(shape, dtype, causal, config, report, exe, kernel),
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0 or not os.path.exists(report + ".ncu-rep"):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FlashscopeError(f"ncu did not record a launch of --kernel {kernel} (does it "
                              f"run at this shape? exit {proc.returncode}: "
                              f"{' | '.join(tail)})")
    page = os.path.join(out_dir, "source.csv")
    exported = subprocess.run([exe, "-i", report + ".ncu-rep", "--page", "source", "--csv",
                               "--print-source", "sass"], capture_output=True, text=True,
                              timeout=timeout)
    if exported.returncode != 0:
        raise FlashscopeError(f"ncu could not export the source page (exit "
                              f"{exported.returncode}: {exported.stderr.strip()[-300:]})")
    with open(page, "w") as f:
        f.write(exported.stdout)
    return page, cache


def _binary(path: str, kernel: str) -> tuple:
    """(cubin bytes, PTX text or None, label) of ``kernel`` at ``path`` (a cubin, a
    flashscope cache entry or a Triton cache folder)."""
    from ..isa.cache_dir import find

    found = [f for f in find(path) if f.binary.suffix == ".cubin" or f.binary.suffix == ""]
    if kernel:
        named = [f for f in found if f.binary.stem == kernel or (f.metadata or {}).get(
            "name") == kernel]
        found = named or found
    if len(found) != 1:
        raise FlashscopeError(f"--binary {path}: {len(found)} cubins for kernel {kernel!r}; "
                              "give the one the page was recorded from")
    f = found[0]
    try:
        data = f.binary.read_bytes()
        ptx = f.asm.read_text(errors="replace") if f.asm is not None else None
    except OSError as e:
        raise FlashscopeError(f"{f.binary}: cannot read ({e.strerror})") from None
    return data, ptx, str(f.binary)


def profile_lines(page_path: str, *, binary: str = "", artifact=None,
                  kernel_name: str = "") -> tuple:
    """(KernelLines with per-line ``counters``, the page) from a recorded source page and
    the binary it belongs to (``binary`` path or a compiled ``artifact``)."""
    from ..isa import nvidia
    from ..isa.lines import nvidia_lines

    page = source_page.pick(source_page.load(page_path), kernel_name)
    if artifact is not None:
        data, ptx, what = artifact.binary, artifact.asm, f"{artifact.kernel}@{artifact.target}"
    else:
        data, ptx, what = _binary(binary, page.kernel)
    if not page.kernel:  # a page without its "Kernel Name" line: the cubin's only kernel
        names = [r["kernel"] for r in nvidia.cubin_parts(data, what)[0]]
        page.kernel = names[0] if len(names) == 1 else ""
    views = nvidia_lines(data, what, ptx, counters=lambda k, ins: source_page.join(page, ins)
                         if k == page.kernel else None, packages=artifact is not None)
    view = next((v for v in views if v.kernel == page.kernel), None)
    if view is None:
        raise FlashscopeError(f"{what}: no kernel {page.kernel!r} (the page's kernel); it has "
                              f"{', '.join(v.kernel for v in views)}")
    return view, page
