#!/usr/bin/env bash
# Learning rates chosen without the test set: one method's cells at each (head lr, backbone lr) pair,
# evaluated on held-out training samples (data.validation: every 5th training sample of each class
# is evaluated instead of the test split), then the pairs by validation FAA, best first.
# Resumable: finished cells are skipped.
# Usage: bash bench/tune_lr.sh OUT METHOD "LR:LR_LORA ..." [BETA] [PRESET]
#   e.g. bash bench/tune_lr.sh runs/tune lwf "1e-2:1e-5 1e-2:1e-4 1e-2:1e-3" 0.5 cpu-clinc150-quick
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="$1"; method="$2"; pairs="$3"; beta="${4:-0.5}"; preset="${5:-cpu-clinc150-quick}"
export LORM_DATA_DIR="${LORM_DATA_DIR:-../shared/datasets}"
for pair in $pairs; do
    lr="${pair%%:*}"; lr_lora="${pair##*:}"
    dir="$out/$method-lr$lr-$lr_lora"
    mkdir -p "$dir"
    printf '{"%s": {"lr": %s, "lr_lora": %s}}\n' "$method" "$lr" "$lr_lora" > "$dir/method.json"
    .venv/bin/lorm-bench --preset "$preset" --mode inprocess --set data.validation=5 --methods "$method" \
        --betas "$beta" --method-config "$dir/method.json" --out "$dir" || true
done
.venv/bin/python - "$out" "$method" <<'EOF'
import json, sys
from pathlib import Path
out, method = Path(sys.argv[1]), sys.argv[2]
rows = []
for m in sorted(out.glob(f"{method}-lr*/cells/{method}/beta*/seed*/metrics.json")):
    metrics = json.loads(m.read_text())
    config = metrics["config"]
    assert config["settings"]["data"]["validation"] == 5, m  # evaluated on held-out training samples
    rows.append((metrics["faa"], config["lr"], config["lr_lora"], metrics["forgetting"]))
print(f"{method}: validation FAA (held-out training samples), best first")
for faa, lr, lr_lora, forgetting in sorted(rows, reverse=True):
    print(f"  lr {lr:g}, lr_lora {lr_lora:g}: FAA {faa:.2f}, forgetting {forgetting:.2f}")
EOF
