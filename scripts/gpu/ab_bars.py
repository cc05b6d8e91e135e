"""What the warpgroup ``bar.sync`` lines Triton puts around mbarrier operations cost the
sm90 consumer loop, timed with :mod:`ab_kernels` (GPU only; runs 161-163 of the
performance record).

For each FLAGS in ``--drop`` this writes a copy of this tree's ``attention_fwd_sm90.py``
whose kernel is named ``_attn_fwd_sm90_nb<FLAGS>`` and installs a PTX hook
(``triton.knobs.runtime.add_stages_inspection_hook``) that drops, in kernels so named, the
``bar.sync N, 128`` lines before: ``w`` an ``mbarrier.try_wait``; ``a`` a plain
``mbarrier.arrive`` (not an ``expect_tx``); ``s`` an ``st.shared`` (OVERLAP's pin). In the
D = 64 non-causal 16k entry that is 1, 2 and 1 of each consumer's 4 per key tile. Then it
times ``E`` (the entry) against ``NB<FLAGS>`` on one shape through ``ab_kernels``, each
output checked against cuDNN's. An experiment, not a product path: without the barrier
before a one-thread arrive, the release of a V slot relies on a wgmma wait in one warp
meaning the whole warpgroup's product has read it. Triton's cache key does not see the
hook: use a TRITON_CACHE_DIR of its own.

Usage: TRITON_CACHE_DIR=/tmp/tc_bars PYTHONPATH=src python scripts/gpu/ab_bars.py
       --drop w,a,s,was [--config CONFIG] --shape 1,44,576,131072,64 --rounds 120 [...]
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


def hook(backend, stages, options, language, capability):
    make_ptx = stages["ptx"]

    def ptx(src, metadata):
        text = make_ptx(src, metadata)
        m = re.search(r"_nb([was]+)$", metadata.get("name", ""))
        if m:
            text, n = strip(text, m.group(1))
            print(f"{metadata['name']}: {n} bar.sync dropped", file=sys.stderr)
        return text
    stages["ptx"] = ptx


def copies(drops, where) -> list:
    """ab_kernels variant heads NB<FLAGS>=<copy> (the CONFIG follows), one renamed kernel
    copy each."""
    src = open(KERNEL).read()
    out = []
    for flags in drops:
        if not flags or set(flags) - set("was"):
            sys.exit(f"--drop: {flags!r}: expected letters of w, a, s")
        text = src.replace("def _attn_fwd_sm90(", f"def _attn_fwd_sm90_nb{flags}(")
        path = os.path.join(where, f"nb{flags}.py")
        with open(path, "w") as f:
            f.write(text + f"\n_attn_fwd_sm90 = _attn_fwd_sm90_nb{flags}\n")
        out.append(f"NB{flags.upper()}={path}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drop", default="w,a,s,was", help="comma-separated flag sets")
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
