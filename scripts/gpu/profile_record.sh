#!/usr/bin/env bash
# Record the evidence for `flashscope profile`, `roofline` and `breakdown` on a GPU (H100):
#   1. ncu counters (--clock-control none) for flashscope's forward (5 configs) and SDPA's
#      cuDNN, FlashAttention-2 and memory-efficient kernels at B=4, H=16, N=4096, D=128 bf16;
#      the raw ncu CSVs are kept (they become tests/data/profile/ncu_*.csv);
#   2. the roofline with ceilings measured now (bf16 GEMM 8192^3, D2D copy), checked
#      against those counters, and its PNG;
#   3. torch.profiler breakdowns of the lc0-encoder and decoder-long presets, each with
#      SDPA and with flashscope's attention (Chrome traces kept).
# Usage (from the repository root): bash scripts/gpu/profile_record.sh OUTDIR
# Runs in about 3-4 minutes; each step has its own time limit so the whole stays < 5.
set -u
OUT=${1:?usage: profile_record.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
FS="$PY -m flashscope.cli"
SHAPE=4,16,4096,128
CONFIGS="BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"
CONFIGS+=";BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=2"
CONFIGS+=";BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=3"
CONFIGS+=";BLOCK_M=128,BLOCK_N=32,num_warps=4,num_stages=3"
CONFIGS+=";BLOCK_M=64,BLOCK_N=128,num_warps=4,num_stages=2"

{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; ncu --version;
  $PY -c "import torch, triton; print(torch.__version__, triton.__version__)"; } \
  > "$OUT/env.txt" 2>&1

mkdir -p "$OUT/profile"
echo "[1/3] ncu counters" >&2
timeout 170 $FS profile --shape $SHAPE --providers flashscope,cudnn,flash,efficient \
  --configs "$CONFIGS" --out "$OUT/profile" --json > "$OUT/profile_stdout.json" \
  2> "$OUT/profile_stderr.txt" || echo "profile failed: see $OUT/profile_stderr.txt" >&2

echo "[2/3] roofline" >&2
timeout 40 $FS roofline --shape $SHAPE --measure --counters "$OUT/profile/profile.json" \
  --plot "$OUT/roofline.png" --json > "$OUT/roofline.json" 2> "$OUT/roofline_stderr.txt" \
  || echo "roofline failed: see $OUT/roofline_stderr.txt" >&2

echo "[3/3] breakdowns" >&2
for preset in lc0-encoder decoder-long; do
  timeout 50 $FS breakdown --preset $preset --device cuda --attention both \
    --out "$OUT/breakdown_$preset" --json > "$OUT/breakdown_$preset.json" \
    2> "$OUT/breakdown_${preset}_stderr.txt" \
    || echo "breakdown $preset failed: see $OUT/breakdown_${preset}_stderr.txt" >&2
done
ls -la "$OUT" "$OUT/profile" >&2
