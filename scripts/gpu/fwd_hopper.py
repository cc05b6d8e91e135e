"""Forward on the standard suite with the Hopper variants (TMA, warp specialization) next
to the pointer-load default, cuDNN (SDPA) and FlashAttention-4 when importable, all timed
in one run. Each flashscope output is checked against cuDNN's (relative error, no NaN).
Writes OUTDIR/fwd_hopper.json and prints a table.

A variant CONFIG is ``K=V,...`` text; ``+K=V,...`` applies the keys to flashscope's
default config for each shape instead. ``@NAME=V`` overrides the kernel constant NAME
(an integer) that the launcher would pass, for that variant only: an experiment that is
not a config knob. ``HEAVY_FIRST=0/1`` (the causal block order, heaviest row blocks
first) is one; variants that set it run on causal shapes only.

With ``--adopt``, the fastest validated config of each shape (the default included;
variants with overrides excluded, they are not configs) goes into the tuned data file for
the GPU's target, through the sweep's writer (``flashscope.sweep.tuned.write_tuned``), and
a copy is written to OUTDIR.

``--rounds R`` times every provider of a shape R times and keeps each one's median; the
order reverses every other round. A single pass favours whoever runs first after the
idle compile of a new shape (run 23 read one config at 524 and 479 in one pass), so an
even R gives every provider the same mean position. The JSON is rewritten
after every shape, so a run cut short keeps the shapes it finished.

Usage: PYTHONPATH=src python scripts/gpu/fwd_hopper.py OUTDIR [--ns 1024,4096,16384]
       [--dims 64,128] [--variants NAME=CONFIG;...] [--rounds R] [--adopt]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscope
from flashscope import AttentionConfig, api, launch
from flashscope.roofline import attention_flops

_OVERRIDE = {}  # kernel-constant overrides of the variant being run
_forward_call = launch.forward_call


def _forward_call_override(*args, **kw):
    grid, fargs, consts = _forward_call(*args, **kw)
    unknown = set(_OVERRIDE) - set(consts)
    if unknown:
        raise KeyError(f"no kernel constant {sorted(unknown)} in this launch")
    consts.update(_OVERRIDE)
    return grid, fargs, consts


launch.forward_call = _forward_call_override


def _is_override(part):
    key = part.split("=")[0].strip().lstrip("+")
    return key.startswith("@") or key == "HEAVY_FIRST"


def variant(text, q, k, v, causal):
    """(config, {kernel constant: value}) of one variant for these tensors."""
    parts = [p for p in text.split(",") if p.strip()]
    over = {p.split("=")[0].strip().lstrip("+@"): int(p.split("=")[1])
            for p in parts if _is_override(p)}
    rest = ",".join(p for p in parts if not _is_override(p)).lstrip("+")
    if text.startswith("+"):
        return AttentionConfig.parse(rest, base=api._default_config(q, k, v, causal)), over
    return AttentionConfig.parse(rest), over


VARIANTS = {
    "tma-m128n64w8s3": "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3,TMA=1",
    "tma-m128n128w8s2": "BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=2,TMA=1",
    "ws-m128n64w4s3": "BLOCK_M=128,BLOCK_N=64,num_warps=4,num_stages=3,TMA=1,WARP_SPEC=1",
    "ws-m128n64w4s2": "BLOCK_M=128,BLOCK_N=64,num_warps=4,num_stages=2,TMA=1,WARP_SPEC=1",
    "ws-m128n128w4s2": "BLOCK_M=128,BLOCK_N=128,num_warps=4,num_stages=2,TMA=1,WARP_SPEC=1",
    "ws-m128n128w4s3": "BLOCK_M=128,BLOCK_N=128,num_warps=4,num_stages=3,TMA=1,WARP_SPEC=1",
}


def tflops(B, H, N, D, causal, ms):
    return attention_flops(B, H, N, N, D, causal) / (ms * 1e-3) / 1e12


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def fa4():
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func
    except Exception as e:  # noqa: BLE001
        print("FA4 not available:", type(e).__name__, str(e)[:120], file=sys.stderr)
        return None


def _run(q, k, v, causal, cfg, over):
    _OVERRIDE.update(over)
    try:
        return flashscope.attention(q, k, v, is_causal=causal, config=cfg)
    finally:
        _OVERRIDE.clear()


def _meta(t0, rounds):
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "cudnn": torch.backends.cudnn.version(),
            "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0, 1),
            "rounds": rounds}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--ns", default="1024,4096,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--variants", default=None)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--adopt", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    variants = VARIANTS if not a.variants else dict(
        x.split("=", 1) for x in a.variants.split(";"))
    f4 = fa4()
    rows = []
    t0 = time.time()
    for D in (int(x) for x in a.dims.split(",")):
        for causal in (False, True):
            for N in (int(x) for x in a.ns.split(",")):
                B, H = 16384 // N, 2048 // D
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    def cudnn():
                        return torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, is_causal=causal)
                    ref = cudnn().float()
                fns = {"cudnn": cudnn}
                if f4 is not None:
                    qf, kf, vf = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    fns["fa4"] = lambda: f4(qf, kf, vf, causal=causal)
                cands = {"fs-default": "+"}
                cands.update((n, c) for n, c in variants.items()
                             if causal or "HEAVY_FIRST" not in c)
                errs, used = {}, {}
                for name, text in cands.items():
                    print(f"> D={D} N={N} causal={causal} {name}", file=sys.stderr, flush=True)
                    try:
                        cfg, over = variant(text, q, k, v, causal)
                        used[name] = cfg.as_dict()
                        o = _run(q, k, v, causal, cfg, over)
                        torch.cuda.synchronize()
                        err = ((o.float() - ref).norm() / ref.norm()).item()
                        if not (err < 1e-2) or torch.isnan(o).any():
                            errs[name] = f"validation: rel err {err:.2e}"
                            continue
                        fns[name] = (lambda cfg=cfg, over=over: _run(
                            q, k, v, causal, cfg, over))
                    except Exception as e:  # noqa: BLE001
                        errs[name] = f"{type(e).__name__}: {str(e)[:160]}"
                times = {name: [] for name in fns}
                for rnd in range(a.rounds):
                    order = list(fns.items())
                    for name, fn in (order if rnd % 2 == 0 else order[::-1]):
                        if name == "cudnn":
                            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                                times[name].append(bench(fn))
                        else:
                            times[name].append(bench(fn))
                res = {name: statistics.median(t) for name, t in times.items()}
                best_peer = max(tflops(B, H, N, D, causal, res[p])
                                for p in ("cudnn", "fa4") if p in res)
                row = {"D": D, "N": N, "causal": causal, "B": B, "H": H,
                       "tflops": {p: round(tflops(B, H, N, D, causal, ms), 1)
                                  for p, ms in res.items()},
                       "ms": {p: round(ms, 4) for p, ms in res.items()}, "errors": errs,
                       "default": api._default_config(q, k, v, causal).key,
                       "configs": used,
                       "override_variants": [n for n, c in cands.items()
                                             if any(map(_is_override, c.split(",")))]}
                fs = {p: t for p, t in row["tflops"].items() if p not in ("cudnn", "fa4")}
                bp = max(fs, key=fs.get)
                row["best_fs"], row["best_fs_vs_peer"] = bp, round(fs[bp] / best_peer, 3)
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("D", "N", "causal", "tflops", "errors",
                                                      "best_fs", "best_fs_vs_peer")}),
                      flush=True)
                meta = _meta(t0, a.rounds)
                with open(f"{a.outdir}/fwd_hopper.json", "w") as f:
                    json.dump({"meta": meta, "variants": variants, "rows": rows}, f, indent=1)
    if a.adopt:
        adopt(rows, meta, a.outdir)
    names = ["cudnn", "fa4", "fs-default", *variants]
    print(" ".join(f"{n[:16]:>16}" for n in ["D/N/causal", *names]))
    for r in rows:
        cells = [f"{r['D']}/{r['N']}/{int(r['causal'])}"]
        cells += [str(r["tflops"].get(n, "-")) for n in names]
        print(" ".join(f"{c:>16}" for c in cells), r["best_fs"], r["best_fs_vs_peer"])
    print(meta)


def adopt(rows, meta, outdir):
    """Write the fastest validated config per shape into the tuned file (see the module
    docstring) and copy the file to ``outdir``."""
    import shutil

    from flashscope.sweep.tuned import write_tuned

    target = api.device_target(torch.device("cuda"))
    records = []
    for r in rows:
        for name, ms in r["ms"].items():
            if name in ("cudnn", "fa4") or name in r["override_variants"]:
                continue
            cfg = AttentionConfig.from_dict(r["configs"][name])
            records.append({
                "kind": "gpu", "status": "ok", "ms": ms, "tflops": r["tflops"][name],
                "target": target, "dtype": "bfloat16", "head_dim": r["D"],
                "causal": r["causal"], "shape": f"{r['B']},{r['H']},{r['N']},{r['D']}",
                "config": cfg.as_dict(), "config_key": cfg.key, "search": "candidates"})
    src = (f"scripts/gpu/fwd_hopper.py --adopt ({len(records)} timings), "
           f"{meta['device']}, {meta['date']}")
    for path in write_tuned(records, source=src):
        shutil.copy(path, outdir)
        print("adopted:", path, file=sys.stderr)


if __name__ == "__main__":
    main()
