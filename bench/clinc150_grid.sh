#!/usr/bin/env bash
# The CLINC150 benchmark table, in-process, as two streams of cells side by side (one thread each),
# then one table over every cell. Resumable: finished cells are skipped.
# Usage: bash bench/clinc150_grid.sh [OUT_DIR] [PRESET] [JOBS]
#   JOBS (default 2): cells at a time. 2 runs the two streams below; more (a GPU host, many cores) runs
#   the same cells through lorm-bench --jobs JOBS, each cell in its own process with one thread.
#   PRESET cpu-clinc150-quick (default): every method and variant x beta 1.0 / 0.5 / 0.2 (about a day of
#   cells on 2 cores: let it resume).
#   PRESET cpu-clinc150-full: the full training set: the full-data table's methods at each beta and lorm at
#   seeds 1 and 2 as well at beta 0.5, then the competitors ($competitors below) at beta 0.5 only (tens of
#   hours of cells on 2 cores: let it resume).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-runs/clinc150-quick}"
preset="${2:-cpu-clinc150-quick}"
jobs="${3:-2}"
export LORM_DATA_DIR="${LORM_DATA_DIR:-../shared/datasets}"
bench=(.venv/bin/lorm-bench --preset "$preset" --mode inprocess --seeds 0
       --method-config bench/clinc150_methods.json --out "$out")
competitors="ccvr,fedproto,pilora,ewc,ewc@reference,ewc@tuned,lwf,lwf@tuned,l2p,l2p@tuned,coda-p,coda-p@tuned,target"
if [ "$preset" = cpu-clinc150-full ]; then
    # joint@tuned: the full-data joint diverges at the preset's lr 1e-2 (one client, 938 steps a round)
    lora="lorm,lorm-b-only,lorm-avg-tasks,fedavg-lora,ncm,ridge,lorm-ridge,joint@tuned"
    # fedavg: the base that ewc, lwf, ccvr, fedproto and target add to
    dense="regmean,ties,ties@tuned,fedavg"
    # fisheravg: its per-sample Fisher 16 samples a backward pass (the same Fisher up to rounding,
    # 2.8x faster: docs/METHODS.md), as its full-data cells ran
    fisher=(--methods fisheravg --set fisher_batch=16)
    extra=true
    report="lorm,lorm-b-only,lorm-avg-tasks,fedavg-lora,fedavg,regmean,fisheravg,ties,ties@tuned,$competitors,joint@tuned,ncm,ridge,lorm-ridge"
else
    lora="lorm,fedavg-lora,lorm-b-only,lorm-avg-tasks,lorm-seq,ncm,ridge,joint,lorm-ridge-first,lorm-ridge,lorm-ncm"
    dense="regmean,ties,ties@tuned,fedavg,fisheravg,$competitors"
    fisher=()
    extra=false
    report="lorm,lorm-b-only,lorm-avg-tasks,lorm-seq,fedavg-lora,fedavg,regmean,fisheravg,ties,ties@tuned,$competitors,joint,ncm,ridge,lorm-ridge-first,lorm-ridge,lorm-ncm"
fi
mkdir -p "$out"
if [ "$jobs" -gt 2 ]; then
    # One table's cells, JOBS at a time (joint runs once: its other betas reuse it), then lorm's other seeds
    # and the competitors on the full data; --set threads=1: one core per cell.
    "${bench[@]}" --jobs "$jobs" --set threads=1 --methods "$lora,$dense" --betas 0.5,1.0,0.2 || true
    if [ ${#fisher[@]} -gt 0 ]; then
        "${bench[@]}" --jobs "$jobs" --set threads=1 "${fisher[@]}" --betas 0.5,1.0,0.2 || true
    fi
    if $extra; then
        .venv/bin/lorm-bench --preset "$preset" --mode inprocess --seeds 1,2 --methods lorm --betas 0.5 \
            --method-config bench/clinc150_methods.json --out "$out" --jobs "$jobs" --set threads=1 || true
        "${bench[@]}" --jobs "$jobs" --set threads=1 --methods "$competitors" --betas 0.5 || true
    fi
    exec "${bench[@]}" --methods "$report" --betas 1.0,0.5,0.2 --report-only
fi
# Every method at beta 0.5 first, then 1.0 and 0.2, so a cut-short run still fills whole columns.
# joint (one client, one task: beta splits nothing) runs once; its other betas reuse the finished cell.
( for b in 0.5 1.0 0.2; do "${bench[@]}" --methods "$lora" --betas "$b" || true; done
  if $extra; then  # lorm's other seeds, then the competitors (full data at beta 0.5 only)
      .venv/bin/lorm-bench --preset "$preset" --mode inprocess --seeds 1,2 --methods lorm --betas 0.5 \
          --method-config bench/clinc150_methods.json --out "$out" || true
      "${bench[@]}" --methods "$competitors" --betas 0.5 || true
  fi ) > "$out/stream-lora.log" 2>&1 &
( for b in 0.5 1.0 0.2; do "${bench[@]}" --methods "$dense" --betas "$b" || true; done
  if [ ${#fisher[@]} -gt 0 ]; then
      for b in 0.5 1.0 0.2; do "${bench[@]}" "${fisher[@]}" --betas "$b" || true; done
  fi ) > "$out/stream-dense.log" 2>&1 &
wait
"${bench[@]}" --methods "$report" --betas 1.0,0.5,0.2 --report-only
