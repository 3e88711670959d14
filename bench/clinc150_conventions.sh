#!/usr/bin/env bash
# The paper's code's conventions, each measured on its own: FAA at beta 0.5 on the quick CPU protocol
# (preset cpu-clinc150-quick, seed 0), in-process, two streams side by side (one thread each).
# Resumable. Usage: bash bench/clinc150_conventions.sh [OUT_DIR]; then read OUT_DIR/summary.txt.
#   order-domains       LoRM with the domain-grouped class order (the old default)
#   lorm                LoRM as the defaults are (alphabetical order, dropout on, padding out of the Grams)
#   gram-padding        LoRM with padding rows counted in the backbone Grams (the reference's T5 code)
#   no-dropout          LoRM without dropout in local training
#   seeds               LoRM at seeds 1 and 2 (the spread one setting's figure must beat)
#   fisher-<estimator>  FisherAvg with the sampled (default), reference and batch estimators
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-runs/clinc150-conventions}"
export LORM_DATA_DIR="${LORM_DATA_DIR:-../shared/datasets}"
bench=(.venv/bin/lorm-bench --preset cpu-clinc150-quick --mode inprocess --betas 0.5
       --method-config bench/clinc150_methods.json)
mkdir -p "$out"
(
    "${bench[@]}" --methods lorm --seeds 0 --out "$out/lorm" || true
    "${bench[@]}" --methods lorm --seeds 0 --set gram_padding=true --out "$out/gram-padding" || true
    "${bench[@]}" --methods lorm --seeds 0 --set train_dropout=false --out "$out/no-dropout" || true
    "${bench[@]}" --methods lorm --seeds 0 --set class_order=domains --out "$out/order-domains" || true
    "${bench[@]}" --methods lorm --seeds 1,2 --out "$out/seeds" || true
) > "$out/stream-lorm.log" 2>&1 &
(
    for estimator in sampled reference batch; do
        "${bench[@]}" --methods fisheravg --seeds 0 --set fisher=$estimator --out "$out/fisher-$estimator" || true
    done
) > "$out/stream-fisher.log" 2>&1 &
wait
for metrics in "$out"/*/cells/*/beta0.5/seed*/metrics.json; do
    .venv/bin/python - "$metrics" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
c = m["config"]
print(f"{sys.argv[1].split('/')[-6]:<18} {m['method']:<10} seed {m['seed']}  FAA {m['faa']:.2f}  "
      f"order {c['class_order']}, gram_padding {c['gram_padding']}, dropout {c['train_dropout']}, "
      f"fisher {c['fisher']}, {m['wall_seconds']:.0f} s")
PY
done | tee "$out/summary.txt"
