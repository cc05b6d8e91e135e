"""Ground truth for `flashscope inspect` on an H100: launch the real forward kernel for a
set of configs and compare the offline numbers with what the launch reports.

Modes:
  launch (default): for each config, run flashscope.attention with config=...; read n_regs,
      n_spills and metadata.shared from the kernel Triton launched, the driver's own view of
      that function (cuFuncGetAttribute: NUM_REGS, SHARED_SIZE_BYTES = static shared,
      LOCAL_SIZE_BYTES) and the device's per-block shared reserve (cuDeviceGetAttribute
      RESERVED_SHARED_MEMORY_PER_BLOCK), and the offline record (compiled without a GPU for
      sm90); write OUTDIR/inspect_groundtruth.json with both and the comparison.
  ncu: launch each config exactly once in a fixed order and write OUTDIR/ncu_order.json
      (configs + offline values); run it under Nsight Compute:

  ncu --clock-control none --print-units base --csv --log-file OUTDIR/ncu.csv \\
      --metrics launch__registers_per_thread,launch__shared_mem_per_block_static,\\
launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_driver,\\
launch__block_size -k regex:_attn_fwd \\
      python scripts/gpu/inspect_groundtruth.py OUTDIR --mode ncu

  then `python scripts/gpu/inspect_groundtruth.py OUTDIR --mode compare` writes
  OUTDIR/ncu_compare.json (flashscope.isa.groundtruth.compare_ncu).

The problem is the one offline builds bind (flashscope.compile.DEFAULT_PROBLEM: B=2, H=16,
N=1024, contiguous bf16), so both compile the same specialization.
Usage: PYTHONPATH=src python scripts/gpu/inspect_groundtruth.py OUTDIR [--mode M]
"""

import argparse
import ctypes
import json
import os
from pathlib import Path

import torch
import triton

import flashscope
from flashscope import TritonFwdConfig, kernels
from flashscope.compile import DEFAULT_PROBLEM
from flashscope.isa import inspect_config, nvidia
from flashscope.isa.groundtruth import (PROBE_STATIC_BYTES, compare_launch, compare_ncu,
                                        probe_cubin)

CONFIGS = (  # (head_dim, causal, config text of the portable kernel, triton-fwd)
    (64, False, "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"),
    (128, False, "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"),
    (128, True, "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=3"),
    (128, False, "BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=2"),
    (128, False, "BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=2,maxnreg=96"),
    (256, False, "BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2"),
    (64, True, "BLOCK_M=64,BLOCK_N=32,num_warps=4,num_stages=1,Q_IN_REGS=false"),
    (128, False, "BLOCK_M=128,BLOCK_N=128,num_warps=4,num_stages=2"),
)

OFFLINE_FIELDS = ("registers", "static_shared_bytes", "dynamic_shared_bytes",
                  "reserved_shared_bytes", "local_bytes", "spill_stores", "spill_loads",
                  "threads", "features")

#: CUfunction_attribute / CUdevice_attribute values (cuda.h).
CU_FUNC_ATTRIBUTE = {"func_shared_size_bytes": 1, "func_local_size_bytes": 3,
                     "func_num_regs": 4}
CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK = 111


def offline(cfg, head_dim, causal):
    r = inspect_config(cfg, "sm90", head_dim=head_dim, causal=causal, occupancy=False)
    return {k: getattr(r, k) for k in OFFLINE_FIELDS}


def launch(cfg, head_dim, causal):
    """Run the forward once with a fresh in-memory JIT cache; return the launched kernel."""
    fn = kernels.load("attention_fwd", interpret=False)._attn_fwd
    fn.device_caches.clear()
    B, H, Hkv, Nq, Nk = DEFAULT_PROBLEM
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, Nq, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, Nk, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, Nk, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    flashscope.attention(q, k, v, is_causal=causal, config=cfg)
    torch.cuda.synchronize()
    (kernel,) = fn.device_caches[torch.cuda.current_device()][0].values()
    return kernel


def driver_view(kernel):
    """The driver's attributes of the launched CUfunction, and the device's reserve."""
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuFuncGetAttribute.argtypes = (ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                        ctypes.c_void_p)
    kernel._init_handles()
    out = {}
    for key, attr in CU_FUNC_ATTRIBUTE.items():
        v = ctypes.c_int()
        rc = cuda.cuFuncGetAttribute(ctypes.byref(v), attr, ctypes.c_void_p(kernel.function))
        out[key] = v.value if rc == 0 else None
    dev = ctypes.c_int()
    v = ctypes.c_int()
    rc = cuda.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device())
    rc = rc or cuda.cuDeviceGetAttribute(ctypes.byref(v),
                                         CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
                                         dev)
    out["device_reserved_shared_per_block"] = v.value if rc == 0 else None
    return out


def static_probe():
    """Load the 256-byte static-shared probe (sm_90a) and ask the driver its static size:
    256 if the driver counts static shared without the 1 KB system window (as the reader
    now does), 1280 if with it."""
    cubin = probe_cubin("sm_90a")
    (rec,) = nvidia.read_cubin(cubin, "probe", sass="")
    cuda = ctypes.CDLL("libcuda.so.1")
    mod, fn, v = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
    rc = cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(cubin))
    rc = rc or cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"probe")
    rc = rc or cuda.cuFuncGetAttribute(ctypes.byref(v), CU_FUNC_ATTRIBUTE[
        "func_shared_size_bytes"], fn)
    return {"declared_static_bytes": PROBE_STATIC_BYTES,
            "elf_section_bytes": nvidia.resource_usage(cubin)["probe"]["SHARED"],
            "offline_static_shared_bytes": rec["static_shared_bytes"],
            "offline_reserved_shared_bytes": rec["reserved_shared_bytes"],
            "driver_shared_size_bytes": v.value if rc == 0 else None, "cuda_rc": rc}


def report(rows):
    """'N/M equal (K not recorded)', then every row that differs."""
    bad = [r for r in rows if r["equal"] is False]
    checked = [r for r in rows if r["equal"] is not None]
    print(f"{len(checked) - len(bad)}/{len(checked)} equal "
          f"({len(rows) - len(checked)} not recorded)", *bad, sep="\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--mode", choices=("launch", "ncu", "compare"), default="launch")
    a = ap.parse_args(argv)
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FLASHSCOPE_CACHE", str(out / "flashscope-cache"))
    if a.mode == "compare":
        order = json.loads((out / "ncu_order.json").read_text())
        rows = compare_ncu(order, (out / "ncu.csv").read_text(errors="replace"))
        (out / "ncu_compare.json").write_text(json.dumps({"rows": rows}, indent=1))
        report(rows)
        return 0
    rows = []
    for head_dim, causal, text in CONFIGS:
        cfg = TritonFwdConfig.parse(text)
        row = {"config": cfg.key, "head_dim": head_dim, "causal": causal,
               "offline": offline(cfg, head_dim, causal)}
        kernel = launch(cfg, head_dim, causal)
        if a.mode == "launch":
            row["launched"] = {"n_regs": kernel.n_regs, "n_spills": kernel.n_spills,
                               "shared": kernel.metadata.shared,
                               "num_warps": kernel.metadata.num_warps,
                               **driver_view(kernel)}
        rows.append(row)
    if a.mode == "ncu":
        (out / "ncu_order.json").write_text(json.dumps({"rows": rows}, indent=1))
        return 0
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "rows": rows, "static_probe": static_probe()}
    doc["compare"] = compare_launch(doc)
    (out / "inspect_groundtruth.json").write_text(json.dumps(doc, indent=1))
    report(doc["compare"])
    print("static probe:", doc["static_probe"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
