"""Clock-stamp timeline of the sm_90 forward on one shape (GPU only).

Takes the problem's default config (``--config +``), that default with knobs changed
(``+K=V,...``) or ``sm90-fwd:K=V,...``; builds its ``TRACE = --tiles`` variant
(:func:`flashscope.families.sm90_fwd.plan` with ``trace``), launches it after a warm-up
into a zeroed stamp buffer, checks the output against cuDNN's, and prints each consumer's
phases per work tile (:mod:`flashscope.profile.timeline`), its fixed cost per work tile
(the intercept of work-tile time against key tiles), the programs' spans, and what a
head's last row block costs beside a whole one. The untraced and traced builds are timed
in interleaved, L2-flushed bursts (:mod:`flashscope.tune.timer`), so the stamps' own cost
is on the record. ``--npz`` keeps the raw buffer, which the timeline functions read
anywhere. No command records stamps: the TRACE build exists for this.

Usage: PYTHONPATH=src python scripts/gpu/trace_fwd.py --shape 16,32,1024,64 --causal \\
       [--config "+BLOCK_M=192"] [--tiles 64] [--npz OUT.npz]
"""

import argparse
import statistics

import numpy as np
import torch

from flashscope import kernels, launch
from flashscope.bench.validate import ERROR_BOUND
from flashscope.families import sm90_fwd
from flashscope.masks import Mask
from flashscope.profile import timeline
from flashscope.testing.reference import rel_error
from flashscope.tune.cells import problem, shape_cell
from flashscope.tune.timer import CudaBursts, interleaved
from flashscope.tune.variants import resolve


def report(trace, cfg, n_q: int) -> None:
    consumers = cfg.consumers
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
    n_m = -(-n_q // cfg.BLOCK_M)
    try:
        print(timeline.format_spans(timeline.program_spans(trace, consumers, n_m)))
        whole, last = timeline.block_cycles(trace, consumers, n_m)
        print(f"work tile: {whole:.0f} cycles, a head's last row block {last:.0f} "
              f"({last / whole:.3f} of it)")
    except ValueError as e:
        print(f"spans: {e} (--tiles below the longest program's work tiles?)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help="B,H,N,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--config", default="+", help="+ (the default), +K=V,... on it, or "
                                                  "sm90-fwd:K=V,...")
    ap.add_argument("--tiles", type=int, default=64, help="work tiles recorded per program")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved timing rounds")
    ap.add_argument("--npz", default=None, help="write the raw stamp buffer here")
    a = ap.parse_args(argv)
    cell = shape_cell(a.shape, a.causal)
    B, H, N, D = cell.case.B, cell.case.H, cell.case.Nq, cell.case.D
    dev = torch.device("cuda")
    cfg = resolve("trace", a.config, problem(cell, launch.device_target(dev))).config
    if cfg is None or cfg.KERNEL != sm90_fwd.KERNEL:
        raise SystemExit(f"--config {a.config!r}: tracing needs an sm90-fwd config")
    q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    mask, scale = Mask(causal=a.causal), launch.default_scale(D)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
    out = torch.empty_like(q)
    plan = sm90_fwd.plan(q, k, v, out, None, causal=a.causal, scale=scale, cfg=cfg,
                         trace=a.tiles)
    kernel = getattr(kernels.load(sm90_fwd.MODULE), sm90_fwd.FUNCTION)
    buf = torch.zeros(plan.grid[0] * 4 * a.tiles * timeline.SLOTS, dtype=torch.int64,
                      device=dev)

    def plain():
        return launch.forward(q, k, v, mask=mask, scale=scale, cfg=cfg, return_lse=False,
                              out=out)[0]

    def stamped():
        part = plan.workspace(q)
        launch.launch_compiled(kernel, plan.grid, plan.args(q, k, v, out, None, part, buf),
                               plan.consts, launch.launch_options(cfg, dev),
                               cache=plan.compiled)
        plan.merge(part, out, None)
        return out

    for name, run in (("untraced", plain), ("traced", stamped)):
        out.fill_(float("nan"))
        err = rel_error(run(), ref)
        if not err <= ERROR_BOUND[torch.bfloat16]:
            raise SystemExit(f"{name}: relative error {err:.2e} against cuDNN")
    times, _ = interleaved({"untraced": plain, "traced": stamped}, a.rounds, 10,
                           CudaBursts(dev))
    buf.zero_()
    stamped()
    torch.cuda.synchronize()
    trace = buf.view(plan.grid[0], 4, a.tiles, timeline.SLOTS).cpu().numpy()
    if a.npz:
        np.savez_compressed(a.npz, trace=trace, shape=np.array([B, H, N, D]),
                            causal=a.causal, config=cfg.label)
    print(f"{torch.cuda.get_device_name()}, shape {a.shape}, causal={a.causal}, "
          f"{plan.grid[0]} programs; {cfg.label}")
    ms = {n: statistics.median(t) for n, t in times.items()}
    print(f"time: {ms['untraced']:.4f} ms untraced, {ms['traced']:.4f} ms traced "
          f"({ms['traced'] / ms['untraced']:.3f})")
    report(trace, cfg, N)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
