"""Ask the CUDA driver for occupancy on the local GPU and record it for the CPU replay test.

For each register cap R (Triton ``maxnreg``) a register-hungry Triton kernel is compiled;
its real register count comes from ``cuFuncGetAttribute(NUM_REGS)``. For every block size
(num_warps 1..32 -> 32..1024 threads) and dynamic shared-memory size, it calls
``cuOccupancyMaxActiveBlocksPerMultiprocessor`` (after setting
MAX_DYNAMIC_SHARED_SIZE_BYTES), through ctypes on libcuda. Writes OUTDIR/
nvidia_runtime.json (inputs, answer, device, versions) and prints the count of
disagreements with flashscope's calculator. Runs in about a minute on an H100.

Usage: PYTHONPATH=src python scripts/gpu/occupancy_validate.py OUTDIR
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from flashscope.occupancy import occupancy

CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


@triton.jit
def _hungry(x_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    """Keeps an N-column tile per thread live across a loop: registers grow with N."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, N), dtype=tl.float32)
    cols = tl.arange(0, N)
    for i in range(4):
        v = tl.load(x_ptr + offs[:, None] * N + cols[None, :] + i)
        acc = acc * v + tl.sin(acc + v)
    tl.store(out_ptr + offs[:, None] * N + cols[None, :], acc)


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed with CUresult {rc}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    out = Path(ap.parse_args(argv).outdir)
    out.mkdir(parents=True, exist_ok=True)
    cuda = ctypes.CDLL("libcuda.so.1")
    torch.zeros(1, device="cuda")  # creates the primary context
    props = torch.cuda.get_device_properties(0)
    cc = props.major * 10 + props.minor
    target = f"sm{cc}"
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    t0 = time.time()
    readings = []
    for maxnreg in (24, 32, 40, 48, 56, 64, 72, 80, 96, 104, 128, 168, 200, 232, 255):
        for num_warps in (1, 2, 3, 4, 6, 8, 12, 16, 32):
            if num_warps == 3 or num_warps == 6 or num_warps == 12:
                continue  # Triton wants a power of two
            k = _hungry.warmup(x, y, N=16, BLOCK=32 * num_warps, num_warps=num_warps,
                               maxnreg=maxnreg, grid=(1,))
            # Load the cubin directly: Triton's own loader refuses kernels whose register
            # count cannot fit the block, and those are exactly the cases where the driver
            # must answer 0.
            mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
            _check(cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(k.asm["cubin"])),
                   "cuModuleLoadData")
            _check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod,
                                            k.metadata.name.encode()), "cuModuleGetFunction")
            regs, static = ctypes.c_int(), ctypes.c_int()
            _check(cuda.cuFuncGetAttribute(ctypes.byref(regs), CU_FUNC_ATTRIBUTE_NUM_REGS, fn),
                   "cuFuncGetAttribute")
            _check(cuda.cuFuncGetAttribute(ctypes.byref(static),
                                           CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                   "cuFuncGetAttribute")
            threads = 32 * num_warps
            for dyn in (0, 1000, 8192, 20000, 48 * 1024, 52224, 70000, 100 * 1024,
                        150000, 200000, 227 * 1024 - static.value):
                _check(cuda.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                               ctypes.c_int(dyn)), "cuFuncSetAttribute")
                blocks = ctypes.c_int()
                _check(cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    ctypes.byref(blocks), fn, ctypes.c_int(threads), ctypes.c_size_t(dyn)),
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor")
                readings.append({"maxnreg": maxnreg, "regs": regs.value, "threads": threads,
                                 "dynamic_smem": dyn, "static_smem": static.value,
                                 "active_blocks": blocks.value,
                                 "source": "cuOccupancyMaxActiveBlocksPerMultiprocessor"})
    bad = [r for r in readings if occupancy(target, threads=r["threads"], regs=r["regs"],
                                            smem=r["dynamic_smem"] + r["static_smem"]
                                            ).active_blocks != r["active_blocks"]]
    drv = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(drv))
    doc = {"command": "PYTHONPATH=src python scripts/gpu/occupancy_validate.py OUTDIR",
           "device": props.name, "target": target, "driver": drv.value,
           "torch": torch.__version__, "triton": triton.__version__,
           "seconds": round(time.time() - t0, 1), "readings": readings}
    (out / "nvidia_runtime.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(readings)} readings on {props.name}; {len(bad)} disagree with flashscope")
    for r in bad[:10]:
        print("  disagree:", r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
