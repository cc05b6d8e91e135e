"""What the warpgroup ``bar.sync`` lines Triton puts around mbarrier operations cost the
sm90 kernel, timed with :mod:`ab_kernels` (GPU only; runs 161-165 of the performance
record).

For each FLAGS in ``--drop`` this writes a copy of this tree's ``attention_fwd_sm90.py``
whose kernel is named ``_attn_fwd_sm90_nb<FLAGS>`` and installs a PTX hook
(``triton.knobs.runtime.add_stages_inspection_hook``) that drops, in kernels so named, the
``bar.sync N, 128`` lines before: ``w`` an ``mbarrier.try_wait``; ``a`` a plain
``mbarrier.arrive`` (not an ``expect_tx``); ``s`` an ``st.shared`` (OVERLAP's pin). In the
D = 64 non-causal 16k entry of run 161 that was 1, 2 and 1 of each consumer's 4 per key
tile. ``p`` (three consumers, the producer in the default partition) runs the producer in
its warp 0 only, as FlashAttention-4's does: warps 1-3 branch to the partition's final
join at once and the producer's ``bar.sync N, 128`` lines go (warp 0's thread 0 arrives
with the byte count and its elected lane, the same thread, issues the copy). Then it
times ``E`` (the entry) against ``NB<FLAGS>`` on one shape through ``ab_kernels``, each
output checked against cuDNN's. An experiment, not a product path: without the barrier
before a one-thread arrive, the release of a V slot relies on a wgmma wait in one warp
meaning the whole warpgroup's product has read it. Triton's cache key does not see the
hook: use a TRITON_CACHE_DIR of its own.

Usage: TRITON_CACHE_DIR=/tmp/tc_bars PYTHONPATH=src python scripts/gpu/ab_bars.py
       --drop w,a,s,was,p [--config CONFIG] --shape 1,44,576,131072,64 --rounds 120 [...]
(every option but ``--drop`` and ``--config`` goes to ``ab_kernels.py`` as it is).
"""

import argparse
import os
import re
import sys
import tempfile

import triton

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL = os.path.join(HERE, "..", "..", "src", "flashscope", "kernels", "attention_fwd_sm90.py")
_BAR = re.compile(r"\s*bar\.sync\s+\d+,\s*128;")
_ARRIVE = re.compile(r"mbarrier\.arrive\.shared::cta\.b64 _, \[%r\d+\];")
_SKIP = ("//", ".loc", "{", "}", ".reg")


def strip(ptx: str, flags: str) -> tuple:
    """(ptx without the bar.sync lines that ``flags`` name, how many went)."""
    lines, out, removed = ptx.split("\n"), [], 0
    for i, line in enumerate(lines):
        if _BAR.match(line):
            nxt = [x.strip() for x in lines[i + 1:i + 10]
                   if x.strip() and not x.strip().startswith(_SKIP)][:4]
            ahead = "\n".join(nxt)
            if (("w" in flags and "mbarrier.try_wait" in ahead)
                    or ("a" in flags and _ARRIVE.search(ahead) and "expect_tx" not in ahead)
                    or ("s" in flags and nxt and nxt[0].startswith("st.shared"))):
                removed += 1
                continue
        out.append(line)
    return "\n".join(out), removed


_DISPATCH = re.compile(r"\s*setp\.lt\.u32\s+%p\d+, %r\d+, 4;")
_LABEL = re.compile(r"(\$L__BB\d+_\d+):")


def producer_in_one_warp(ptx: str) -> tuple:
    """(ptx whose default-partition producer runs in warp 0 only, bar.sync lines dropped).

    The kernel starts with ``setp.lt.u32 %p, warp, 4`` and a branch to the default
    partition, else ``bra.uni`` to the workers' code, which follows the producer's. The
    producer begins after the default partition's ``barrier.sync 1; setmaxnreg.dec;
    barrier.sync 1``; its final join is the block holding the last ``barrier.sync 1;
    setmaxnreg.inc``. Warps 1-3 (``tid & 96`` != 0) branch there at once."""
    lines = ptx.split("\n")
    missing = ValueError("no default-partition producer (three consumers) in this PTX")
    try:
        i = next(k for k, x in enumerate(lines) if _DISPATCH.match(x))
        rest = next(m.group(1) for x in lines[i:i + 20]
                    for m in [re.match(r"\s*bra\.uni\s+(\$L__BB\d+_\d+);", x)] if m)
        start = next(k for k in range(i + 1, len(lines) - 1) if "setmaxnreg.dec" in lines[k]
                     and "barrier.sync" in lines[k - 1] and "barrier.sync" in lines[k + 1]) + 1
        end = next(k for k in range(start, len(lines)) if lines[k].startswith(rest + ":"))
        join = max(k for k in range(1, len(lines)) if "setmaxnreg.inc" in lines[k]
                   and "barrier.sync" in lines[k - 1])
        label = next(_LABEL.match(lines[k]).group(1) for k in range(join, 0, -1)
                     if _LABEL.match(lines[k]))
    except StopIteration:
        raise missing from None
    body = "\n".join(lines[start:end])
    if "cp.async.bulk.tensor" not in body or "wgmma" in body:  # a consumer is the default
        raise missing
    dropped = 0
    for k in range(start + 1, end):
        if _BAR.match(lines[k]):
            lines[k], dropped = "\t// bar.sync dropped (producer in warp 0)", dropped + 1
    lines[start] += ("\n\t{ .reg .b32 %pw_t; .reg .pred %pw_p; mov.u32 %pw_t, %tid.x; "
                     "and.b32 %pw_t, %pw_t, 96; setp.ne.u32 %pw_p, %pw_t, 0; "
                     f"@%pw_p bra.uni {label}; }}")
    return "\n".join(lines), dropped


def hook(backend, stages, options, language, capability):
    make_ptx = stages["ptx"]

    def ptx(src, metadata):
        text = make_ptx(src, metadata)
        m = re.search(r"_nb([wasp]+)$", metadata.get("name", ""))
        if m and set(m.group(1)) & set("was"):
            text, n = strip(text, m.group(1))
            print(f"{metadata['name']}: {n} bar.sync dropped", file=sys.stderr)
        if m and "p" in m.group(1):
            text, n = producer_in_one_warp(text)
            print(f"{metadata['name']}: producer in warp 0, {n} of its bar.sync dropped",
                  file=sys.stderr)
        return text
    stages["ptx"] = ptx


def copies(drops, where) -> list:
    """ab_kernels variant heads NB<FLAGS>=<copy> (the CONFIG follows), one renamed kernel
    copy each."""
    src = open(KERNEL).read()
    out = []
    for flags in drops:
        if not flags or set(flags) - set("wasp"):
            sys.exit(f"--drop: {flags!r}: expected letters of w, a, s, p")
        text = src.replace("def _attn_fwd_sm90(", f"def _attn_fwd_sm90_nb{flags}(")
        path = os.path.join(where, f"nb{flags}.py")
        with open(path, "w") as f:
            f.write(text + f"\n_attn_fwd_sm90 = _attn_fwd_sm90_nb{flags}\n")
        out.append(f"NB{flags.upper()}={path}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drop", default="w,a,s,was", help="comma-separated flag sets of "
                    "w, a, s, p (module docstring)")
    ap.add_argument("--config", default="",
                    help="CONFIG as ab_kernels.py takes it (default: its entry)")
    a, rest = ap.parse_known_args()
    triton.knobs.runtime.add_stages_inspection_hook = hook
    sys.path.insert(0, HERE)
    import ab_kernels

    where = tempfile.mkdtemp(prefix="ab_bars_")
    names = ["E=-"] + copies(a.drop.split(","), where)
    ab_kernels.main(rest + [f"{v}:{a.config}" for v in names])


if __name__ == "__main__":
    main()
