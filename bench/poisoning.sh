#!/usr/bin/env bash
# FAA with one hostile client of ten (client 3), robust guard off and on, on the quick CPU protocol
# (preset cpu-clinc150-quick, lorm, beta 0.5, seed 0), in-process, two streams side by side (one
# thread each). Resumable. Usage: bash bench/poisoning.sh [OUT_DIR]; the table is OUT_DIR/results.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-runs/poisoning}"
export LORM_DATA_DIR="${LORM_DATA_DIR:-../shared/datasets}"
poison=(.venv/bin/python -m engine.poisoning --preset cpu-clinc150-quick --beta 0.5 --out "$out")
mkdir -p "$out"
"${poison[@]}" --attacks none,scale-factors,scale-grams > "$out/stream-a.log" 2>&1 &
"${poison[@]}" --attacks flip-sign,flip-labels > "$out/stream-b.log" 2>&1 &
wait
"${poison[@]}" --report-only
