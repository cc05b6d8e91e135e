"""Clock-stamp timeline of the persistent sm90 forward on one shape (GPU only).

Builds flashscope's default config for the shape (or ``--config``, ``+K=V`` on top of
it), launches its ``TRACE = --tiles`` build with a zeroed stamp buffer after a warm-up,
checks the output against cuDNN's, and prints each consumer's phases per work tile
(:mod:`flashscope.profile.timeline`), its fixed cost per work tile (the intercept of
work-tile time against key tiles), the programs' spans grouped by work tiles, and what
a head's last row block costs beside a whole one. The untraced and traced builds are timed in
alternation, so the stamps' own cost is on the record. ``--npz`` keeps the raw buffer.

Usage: PYTHONPATH=src python scripts/gpu/trace_fwd.py --shape 16,32,1024,64 --causal
       [--config "+BLOCK_M=192"] [--tiles 64] [--npz OUT.npz] [--kernel OLD.py]
"""

import argparse
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import _burst, check_output  # noqa: E402

from flashscope import api, kernels, launch  # noqa: E402
from flashscope.config import AttentionConfig  # noqa: E402
from flashscope.profile import timeline  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, help="B,H,N,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--config", default="+", help="config text, or +K=V,... on the default")
    ap.add_argument("--tiles", type=int, default=64, help="work tiles recorded per program")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--npz", default=None)
    ap.add_argument("--kernel", default=None,
                    help="another copy of attention_fwd_sm90.py to trace (as ab_file.py)")
    a = ap.parse_args()
    B, H, N, D = map(int, a.shape.split(","))
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    base = api._default_config(q, k, v, a.causal)
    cfg = (AttentionConfig.parse(a.config.lstrip("+"), base=base) if a.config.startswith("+")
           else AttentionConfig.parse(a.config))
    if not (cfg.GLUON and cfg.PERSISTENT):
        sys.exit(f"--config: tracing needs GLUON=1 and PERSISTENT=1, got {cfg.key}")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
    ref = ref.float()

    if a.kernel:
        from ab_file import _module

        fn = _module(a.kernel)._attn_fwd_sm90
    else:
        fn = kernels.load("attention_fwd_sm90")._attn_fwd_sm90
    opts = launch.launch_options(cfg, q.device)
    out = torch.empty_like(q)
    grid, args, consts = launch.forward_call(q, k, v, out, None, causal=a.causal,
                                             scale=D ** -0.5, cfg=cfg)
    buf = torch.zeros(grid[0] * 4 * a.tiles * timeline.SLOTS, dtype=torch.int64,
                      device="cuda")
    traced = dict(consts, TRACE=a.tiles)
    # SPLIT_KV: the cut blocks' pieces are merged after each launch (a no-op otherwise)
    plan = launch.gluon_plan(q, k, v, out, None, causal=a.causal, scale=D ** -0.5, cfg=cfg)
    part = args[6]

    def plain():
        fn[grid](*args, **consts, **opts)
        plan.merge(part, out, None)

    def stamped():
        fn[grid](*args[:-1], buf, **traced, **opts)
        plan.merge(part, out, None)

    for name, run in (("plain", plain), ("traced", stamped)):
        out.fill_(float("nan"))
        run()
        check_output(name, out, ref)
    times = {"plain": [], "traced": []}
    for _ in range(a.rounds):
        for name, run in (("plain", plain), ("traced", stamped)):
            times[name].append(_burst(run, 10))
    buf.zero_()
    stamped()
    torch.cuda.synchronize()
    trace = buf.view(grid[0], 4, a.tiles, timeline.SLOTS).cpu().numpy()
    if a.npz:
        np.savez_compressed(a.npz, trace=trace, shape=np.array([B, H, N, D]),
                            causal=a.causal, config=cfg.key)
    consumers = cfg.BLOCK_M // 64
    print(f"{torch.cuda.get_device_name()}, shape {a.shape}, causal={a.causal}, "
          f"{grid[0]} programs; config {cfg.key}")
    ms = {n: statistics.median(t) for n, t in times.items()}
    print(f"time: {ms['plain']:.4f} ms untraced, {ms['traced']:.4f} ms traced "
          f"({ms['traced'] / ms['plain']:.3f})")
    print(timeline.format_phases(timeline.consumer_phases(trace, consumers)))
    for c in range(consumers):
        try:
            slope, icpt = timeline.fixed_cost(trace, c)
            print(f"consumer {c}: {slope:.0f} cycles per key tile + {icpt:.0f} per work "
                  f"tile ({icpt / slope:.2f} key tiles)")
        except ValueError as e:
            print(e)
        print("  by key tiles:", {n: f"{w}x{d:.0f}" for n, (w, d) in
                                  timeline.by_key_tiles(trace, c).items()})
    n_m = -(-N // cfg.BLOCK_M)
    try:
        print(timeline.format_spans(timeline.program_spans(trace, consumers, n_m)))
        whole, last = timeline.block_cycles(trace, consumers, n_m)
        print(f"work tile: {whole:.0f} cycles, a head's last row block {last:.0f} "
              f"({last / whole:.3f} of it)")
    except ValueError as e:
        print(f"spans: {e} (--tiles below the longest program's work tiles?)")


if __name__ == "__main__":
    main()
