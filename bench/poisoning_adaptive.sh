#!/usr/bin/env bash
# The adaptive attacks (engine/attacks.py: inflate-samples, scale-under-bound, slow-drift,
# collude-2 with clients 3 and 4, collude-3 with clients 3, 4 and 5), robust guard off and on, on the
# quick CPU protocol (preset cpu-clinc150-quick, lorm, beta 0.5, seed 0), in-process, with none off/on
# as the same host's reference: 12 cells, JOBS at a time (default 2), one thread each. Resumable.
# Usage: [JOBS=12] bash bench/poisoning_adaptive.sh [OUT_DIR]; the table is OUT_DIR/adaptive.md.
# docs/results/poisoning/adaptive.md's cells ran with JOBS=12 on an H100 host (CUDA, 16 cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-runs/poisoning}"
jobs="${JOBS:-2}"
export LORM_DATA_DIR="${LORM_DATA_DIR:-../shared/datasets}" OMP_NUM_THREADS=1
poison=(.venv/bin/python -m engine.poisoning --preset cpu-clinc150-quick --beta 0.5 --attacker 3 --out "$out")
mkdir -p "$out/logs"
cells=()
for attack in none inflate-samples scale-under-bound slow-drift collude-2 collude-3; do
  for guard in off on; do cells+=("$attack $guard"); done
done
running=0
for cell in "${cells[@]}"; do
  read -r attack guard <<< "$cell"
  "${poison[@]}" --attacks "$attack" --guards "$guard" --table "logs/$attack-$guard.md" \
    > "$out/logs/$attack-$guard.log" 2>&1 &
  running=$((running + 1))
  if (( running >= jobs )); then wait -n; running=$((running - 1)); fi
done
wait
"${poison[@]}" --attacks none,adaptive --report-only --table adaptive.md
