#!/usr/bin/env bash
# The standard suite on one GPU, bf16, D = 64 and 128, causal and not, every available
# provider except SDPA's unfused math backend; each mode writes OUTDIR/<mode>/bench.{json,
# csv,png,md}. Usage: scripts/gpu/bench_suite.sh OUTDIR [MODES]   (MODES default "fwd bwd";
# run "fwd" and "bwd" as two calls when one call must stay under 10 minutes). Every case
# is timed in 3 interleaved rounds (--rounds 3: the GPU's clock drifts over a run).
set -euo pipefail
OUT=${1:?usage: bench_suite.sh OUTDIR [MODES]}
MODES=${2:-fwd bwd}
cd "$(dirname "$0")/../.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
$PY -m flashscope.cli bench --list-baselines --device cuda | tee "$OUT/providers.txt"
for MODE in $MODES; do
  $PY -m flashscope.cli bench --suite --device cuda --dtype bf16 --mode "$MODE" \
      --head-dims 64,128 --skip sdpa-math --warmup-ms 10 --rep-ms 40 --rounds 3 \
      --out "$OUT/$MODE" 2>&1 | tee "$OUT/$MODE.log"
done
