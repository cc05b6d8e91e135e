"""Do the warpgroup ``bar.sync`` Triton puts around mbarrier operations cost the Gluon
forward anything? Compile it with them taken out of the PTX and time both.

Triton 3.6's barrier analysis puts ``bar.sync N, 128`` before every mbarrier wait that
follows an arrive and before every single-thread arrive (two per key tile in each
consumer). MODE ``base`` compiles as usual; ``nowait`` drops the ``bar.sync`` lines that
precede an ``mbarrier.try_wait``; ``noboth`` also drops those before a consumer's plain
``mbarrier.arrive`` (the V-slot release). The edit goes through Triton's
``knobs.runtime.add_stages_inspection_hook`` (the PTX stage of ``_attn_fwd_sm90`` only),
so run each mode in its own process with its own TRITON_CACHE_DIR: Triton's cache key
does not see the hook. Every timed output is compared with cuDNN's (max relative error
printed). An experiment, not a product path: ``noboth`` relies on a wgmma wait in one
warp meaning the whole warpgroup's product has read its operands.

Usage (on an H100), alternating modes:
  for m in base nowait noboth base nowait noboth; do
    TRITON_CACHE_DIR=/tmp/tc_$m PYTHONPATH=src python scripts/gpu/bar_sync_probe.py $m
  done
"""

import json
import re
import sys

import torch
import triton

MODE = sys.argv[1] if len(sys.argv) > 1 else "base"
G = "GLUON=1,TMA=1,Q_IN_REGS=0,num_warps=4,BLOCK_N=128,num_stages=3"
CASES = (("d128nc16k", (1, 16, 16384, 128), False, G + ",BLOCK_M=128,PERSISTENT=1,OVERLAP=1,"
          "PINGPONG=1"),
         ("d128nc4k", (4, 16, 4096, 128), False, G + ",BLOCK_M=128,PERSISTENT=1,OVERLAP=1"),
         ("d64nc16k", (1, 32, 16384, 64), False, G + ",BLOCK_M=192,PERSISTENT=1"),
         ("d64c4k", (4, 32, 4096, 64), True, G + ",BLOCK_M=128,PERSISTENT=1,OVERLAP=1"))
_BAR = re.compile(r"\s*bar\.sync\s+\d+,\s*128;")
_ARRIVE = re.compile(r"mbarrier\.arrive\.shared::cta\.b64 _, \[%r\d+\];")


def strip(ptx: str) -> tuple:
    """(PTX without the selected bar.sync lines, how many went)."""
    lines, out, removed = ptx.split("\n"), [], 0
    for i, line in enumerate(lines):
        if _BAR.match(line):
            ahead = "\n".join(lines[i + 1:i + 8])
            if "mbarrier.try_wait" in ahead or (
                    MODE == "noboth" and _ARRIVE.search(ahead) and "expect_tx" not in ahead):
                removed += 1
                continue
        out.append(line)
    return "\n".join(out), removed


def hook(backend, stages, options, language, capability):
    make_ptx = stages["ptx"]

    def ptx(src, metadata):
        text = make_ptx(src, metadata)
        if "attn_fwd_sm90" in metadata.get("name", ""):
            text, n = strip(text)
            print(f"[{MODE}] removed {n} bar.sync from {metadata['name']}", file=sys.stderr)
        return text
    stages["ptx"] = ptx


def main():
    if MODE not in ("base", "nowait", "noboth"):
        sys.exit(f"MODE {MODE!r}: expected base, nowait or noboth")
    if MODE != "base":
        triton.knobs.runtime.add_stages_inspection_hook = hook
    import flashscope
    from torch.nn.attention import SDPBackend, sdpa_kernel

    res = {"mode": MODE}
    for name, (B, H, N, D), causal, spec in CASES:
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        cfg = flashscope.AttentionConfig.parse(spec)

        def run():
            return flashscope.attention(q, k, v, is_causal=causal, config=cfg)
        out = run()
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        ms = triton.testing.do_bench(run, warmup=50, rep=300, return_mode="median")
        res[name] = (round(4 * B * H * N * N * D / (2 if causal else 1) / ms / 1e9, 1), err)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
