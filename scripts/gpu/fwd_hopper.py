"""Forward on the standard suite with the Hopper variants (TMA, warp specialization) next
to the pointer-load default, cuDNN (SDPA) and FlashAttention-4 when importable, all timed
in one run. Each flashscope output is checked against cuDNN's (relative error, no NaN).
Writes OUTDIR/fwd_hopper.json and prints a table.

A variant CONFIG is ``K=V,...`` text; ``+K=V,...`` applies the keys to flashscope's
default config for each shape instead. ``HEAVY_FIRST=0/1`` in a variant overrides the
launcher's causal block order (heaviest row blocks first) for that variant only; such
variants run on causal shapes only.

With ``--adopt``, the fastest validated config of each shape (the default included;
HEAVY_FIRST variants excluded, they are not configs) goes into the tuned data file for
the GPU's target, through the sweep's writer (``flashscope.sweep.tuned.write_tuned``), and
a copy is written to OUTDIR.

Usage: PYTHONPATH=src python scripts/gpu/fwd_hopper.py OUTDIR [--ns 1024,4096,16384]
       [--dims 64,128] [--variants NAME=CONFIG;...] [--adopt]
"""

import argparse
import json
import sys
import time

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscope
from flashscope import AttentionConfig, api, launch
from flashscope.roofline import attention_flops

_HEAVY = {"value": None}  # HEAVY_FIRST override of the variant being run
_forward_call = launch.forward_call


def _forward_call_override(*args, **kw):
    grid, fargs, consts = _forward_call(*args, **kw)
    if _HEAVY["value"] is not None:
        consts["HEAVY_FIRST"] = _HEAVY["value"]
    return grid, fargs, consts


launch.forward_call = _forward_call_override


def variant(text, q, k, v, causal):
    """(config, HEAVY_FIRST override or None) of one variant for these tensors."""
    parts = [p for p in text.split(",") if p.strip()]
    heavy = [p for p in parts if p.split("=")[0].strip().lstrip("+") == "HEAVY_FIRST"]
    rest = ",".join(p for p in parts if p not in heavy).lstrip("+")
    hv = bool(int(heavy[-1].split("=")[1])) if heavy else None
    if text.startswith("+"):
        return AttentionConfig.parse(rest, base=api._default_config(q, k, v, causal)), hv
    return AttentionConfig.parse(rest), hv


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--ns", default="1024,4096,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--variants", default=None)
    ap.add_argument("--adopt", action="store_true")
    a = ap.parse_args()
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
                    res = {"cudnn": bench(cudnn)}
                if f4 is not None:
                    qf, kf, vf = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    res["fa4"] = bench(lambda: f4(qf, kf, vf, causal=causal))
                cands = {"fs-default": "+"}
                cands.update((n, c) for n, c in variants.items()
                             if causal or "HEAVY_FIRST" not in c)
                errs, used = {}, {}
                for name, text in cands.items():
                    print(f"> D={D} N={N} causal={causal} {name}", file=sys.stderr, flush=True)
                    try:
                        cfg, _HEAVY["value"] = variant(text, q, k, v, causal)
                        used[name] = cfg.as_dict()
                        o = flashscope.attention(q, k, v, is_causal=causal, config=cfg)
                        torch.cuda.synchronize()
                        err = ((o.float() - ref).norm() / ref.norm()).item()
                        if not (err < 1e-2) or torch.isnan(o).any():
                            errs[name] = f"validation: rel err {err:.2e}"
                            continue
                        res[name] = bench(lambda: flashscope.attention(
                            q, k, v, is_causal=causal, config=cfg))
                    except Exception as e:  # noqa: BLE001
                        errs[name] = f"{type(e).__name__}: {str(e)[:160]}"
                    finally:
                        _HEAVY["value"] = None
                best_peer = max(tflops(B, H, N, D, causal, res[p])
                                for p in ("cudnn", "fa4") if p in res)
                row = {"D": D, "N": N, "causal": causal, "B": B, "H": H,
                       "tflops": {p: round(tflops(B, H, N, D, causal, ms), 1)
                                  for p, ms in res.items()},
                       "ms": {p: round(ms, 4) for p, ms in res.items()}, "errors": errs,
                       "default": api._default_config(q, k, v, causal).key,
                       "configs": used,
                       "heavy_first_variants": [n for n, c in cands.items()
                                                if "HEAVY_FIRST" in c]}
                fs = {p: t for p, t in row["tflops"].items() if p not in ("cudnn", "fa4")}
                bp = max(fs, key=fs.get)
                row["best_fs"], row["best_fs_vs_peer"] = bp, round(fs[bp] / best_peer, 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "cudnn": torch.backends.cudnn.version(),
            "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0, 1)}
    json.dump({"meta": meta, "variants": variants, "rows": rows},
              open(f"{a.outdir}/fwd_hopper.json", "w"), indent=1)
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
            if name in ("cudnn", "fa4") or name in r["heavy_first_variants"]:
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
