"""Record LLVM's own occupancy answers for AMD targets, replayed by
tests/occupancy/test_llvm_replay.py.

Each case compiles a kernel whose VGPR (and SGPR) count is forced with inline-asm clobbers
of v[V-1] (s[S-1]) and whose LDS is a static array of L bytes, with
``amdgpu-flat-work-group-size`` = T,T, and reads llc's ``kernel-resource-usage`` remarks
(VGPRs, AGPRs, TotalSGPRs, LDS, Occupancy [waves/SIMD]) plus ``.vgpr_count`` from the
metadata.

Usage: python scripts/occupancy_llvm_readings.py [--llc llc-22] [OUT.json]
(default OUT: tests/data/occupancy/amd_llvm_readings.json; Debian 12: apt-get install llvm-22)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests/data/occupancy/amd_llvm_readings.json"

REMARK = re.compile(r"remark: .*?:\s+([A-Za-z][A-Za-z \[\]/]*?):\s+(\S+)\s*$")


def kernel_ir(vgprs: int, agprs: int, sgprs: int, lds: int, threads: int) -> str:
    clobbers = [f"~{{v{vgprs - 1}}}"]
    if agprs:
        clobbers.append(f"~{{a{agprs - 1}}}")
    if sgprs:
        clobbers.append(f"~{{s{sgprs - 1}}}")
    calls = "\n".join(f'  call void asm sideeffect "", "{c}"()' for c in clobbers)
    body = calls
    glob = ""
    if lds:
        glob = f"@lds = internal addrspace(3) global [{lds} x i8] poison, align 16\n"
        body += (f"\n  %p = getelementptr [{lds} x i8], ptr addrspace(3) @lds, i32 0, i32 1"
                 "\n  store volatile i8 1, ptr addrspace(3) %p")
    return (f"{glob}define amdgpu_kernel void @k() #0 {{\n{body}\n  ret void\n}}\n"
            f'attributes #0 = {{ "amdgpu-flat-work-group-size"="{threads},{threads}" }}\n')


def read(llc: str, case: dict) -> dict:
    args = [llc, "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={case['mcpu']}",
            "-pass-remarks-analysis=kernel-resource-usage", "-o", "-"]
    if case["wave_size"] == 64 and case["mcpu"].startswith("gfx1"):
        args.append("-mattr=+wavefrontsize64")
    ir = kernel_ir(case["vgprs_forced"], case["agprs_forced"], case["sgprs_forced"],
                   case["lds"], case["threads"])
    p = subprocess.run(args, input=ir, capture_output=True, text=True, check=True)
    rem = dict(m.groups() for m in map(REMARK.match, p.stderr.splitlines()) if m)
    vc = re.search(r"\.vgpr_count:\s+(\d+)", p.stdout)
    sc = re.search(r"\.sgpr_count:\s+(\d+)", p.stdout)
    return {**case, "llvm": {
        "vgprs": int(rem["VGPRs"]), "agprs": int(rem.get("AGPRs", 0)),
        "total_sgprs": int(rem["TotalSGPRs"]), "lds": int(rem["LDS Size [bytes/block]"]),
        "occupancy": int(rem["Occupancy [waves/SIMD]"]),
        "vgpr_count": int(vc.group(1)), "sgpr_count": int(sc.group(1))}}


def cases() -> list:
    out = []

    def add(mcpu, wave, v, threads, lds=0, a=0, s=0):
        out.append({"mcpu": mcpu, "wave_size": wave, "vgprs_forced": v, "agprs_forced": a,
                    "sgprs_forced": s, "lds": lds, "threads": threads})

    for mcpu in ("gfx90a", "gfx942", "gfx950"):
        for v in range(1, 257, 3):
            add(mcpu, 64, v, 64)
        for v, a in ((50, 20), (64, 64), (128, 128), (130, 126), (200, 56), (256, 256),
                     (9, 32), (40, 16), (97, 31)):
            add(mcpu, 64, v, 64, a=a)
        for lds in (1024, 4096, 8192, 16384, 21504, 32768, 40960, 65536):
            for threads in (64, 128, 256, 512, 1024):
                add(mcpu, 64, 8, threads, lds=lds)
        for s in (40, 74, 82, 90, 95, 96, 100):
            add(mcpu, 64, 8, 64, s=s)
    for lds in (98304, 131072, 163840):
        for threads in (64, 256, 1024):
            add("gfx950", 64, 8, threads, lds=lds)
    for mcpu in ("gfx1100", "gfx1201"):
        for wave in (32, 64):
            for v in range(1, 257, 3):
                add(mcpu, wave, v, wave)
            for lds in (1024, 8192, 16384, 32768, 40960, 65536):
                for threads in (32, 64, 256, 1024):
                    add(mcpu, wave, 8, threads, lds=lds)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(DEFAULT_OUT))
    ap.add_argument("--llc", default="llc-22")
    args = ap.parse_args(argv)
    version = subprocess.run([args.llc, "--version"], capture_output=True, text=True).stdout
    with ThreadPoolExecutor(4) as ex:
        readings = list(ex.map(lambda c: read(args.llc, c), cases()))
    doc = {"command": "python scripts/occupancy_llvm_readings.py --llc " + args.llc,
           "llc_version": re.search(r"LLVM version (\S+)", version).group(1),
           "readings": readings}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(readings)} readings -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
