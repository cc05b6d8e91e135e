#!/usr/bin/env bash
# GPU config sweep of the forward on an H100: exhaustive vs evolve on the same space.
#
#   scripts/gpu/sweep_gpu.sh OUTDIR
#
# bf16, D = 64 and 128, causal and not, N = 4096, B = 4, H = 2048 / D; the built-in sm90
# space (BLOCK_M 64/128 x BLOCK_N 32/64/128 x 4/8 warps x 2/3/4 stages = 36 points per
# problem). Each config is validated on the timed shape (two fresh input sets and the last
# timed output); the winners written as tuned files are also validated on the odd shapes.
# Evolve gets 12 evaluations per problem (1/3), seeded with the defaults only (it never
# sees the exhaustive results). Writes:
#   OUTDIR/exhaustive/{results.jsonl,summary.json,pareto.png}
#   OUTDIR/tuned/sm90.json         (copy to src/flashscope/data/tuned/ to make it the default)
#   OUTDIR/evolve/{results.jsonl,summary.json,pareto.png}
#   OUTDIR/compare.json            (evolve vs exhaustive: measured, and replayed 20 times)
set -euo pipefail
OUT=${1:?usage: scripts/gpu/sweep_gpu.sh OUTDIR}
cd "$(dirname "$0")/../.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python}
mkdir -p "$OUT"
COMMON=(--gpu --targets sm90 --dtypes bf16 --causal both
        --shapes "4,32,4096,64;4,16,4096,128" --no-odd-shapes --no-progress)
start=$(date +%s)
"$PY" -m flashscope.cli sweep "${COMMON[@]}" --out "$OUT/exhaustive" --write-tuned "$OUT/tuned"
"$PY" -m flashscope.cli sweep "${COMMON[@]}" --out "$OUT/evolve" --search evolve --budget 12 \
    --seed 0
"$PY" -m flashscope.cli sweep --compare "$OUT/exhaustive/results.jsonl" \
    "$OUT/evolve/results.jsonl" --out "$OUT"
echo "sweep_gpu: done in $(( $(date +%s) - start )) s; results in $OUT"
