#!/usr/bin/env bash
# The CLINC150 benchmark table at the quick CPU protocol (preset cpu-clinc150-quick), in-process,
# as two streams of cells side by side (one thread each), then one table over every cell.
# Resumable: finished cells are skipped. Usage: bash bench/clinc150_grid.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-runs/clinc150-quick}"
export LORM_DATA_DIR="${LORM_DATA_DIR:-../shared/datasets}"
bench=(.venv/bin/lorm-bench --preset cpu-clinc150-quick --mode inprocess --seeds 0
       --method-config bench/clinc150_methods.json --out "$out")
lora="lorm,fedavg-lora,lorm-b-only,lorm-avg-tasks,lorm-seq,ncm,ridge,joint,lorm-ridge-first,lorm-ridge,lorm-ncm"
dense="regmean,ties,fedavg,fisheravg"
mkdir -p "$out"
# Every method at beta 0.5 first, then 1.0 and 0.2, so a cut-short run still fills whole columns.
# joint (one client, one task: beta splits nothing) runs once; its other betas reuse the finished cell.
( for b in 0.5 1.0 0.2; do "${bench[@]}" --methods "$lora" --betas "$b" || true; done ) > "$out/stream-lora.log" 2>&1 &
( for b in 0.5 1.0 0.2; do "${bench[@]}" --methods "$dense" --betas "$b" || true; done ) > "$out/stream-dense.log" 2>&1 &
wait
"${bench[@]}" --methods "lorm,lorm-b-only,lorm-avg-tasks,lorm-seq,fedavg-lora,fedavg,regmean,fisheravg,ties,joint,ncm,ridge,lorm-ridge-first,lorm-ridge,lorm-ncm" \
    --betas 1.0,0.5,0.2 --report-only
