#!/usr/bin/env bash
# Hyperparameters chosen without the test set: one method's cells at each candidate, evaluated on
# held-out training samples (data.validation: every 5th training sample of each class is evaluated
# instead of the test split), then the candidates by validation FAA, best first.
# A candidate is LR:LR_LORA (head lr, backbone lr), optionally followed by the method's settings or run
# configuration keys, :section.key=value[,key=value...] (values are JSON: numbers, true/false, or bare
# words; a key without a dot is a run configuration field, e.g. gamma_head=0.5).
# Resumable: finished cells are skipped.
# Usage: bash bench/tune_lr.sh OUT METHOD "CANDIDATE ..." [BETA] [PRESET] [SEED]
#   e.g. bash bench/tune_lr.sh runs/tune lwf "1e-2:1e-5 1e-2:1e-4 1e-2:1e-3" 0.5 cpu-clinc150-quick
#        bash bench/tune_lr.sh runs/tune l2p "1e-2:3e-2 1e-2:3e-2:l2p.features=pooled,l2p.init=0.1"
#        bash bench/tune_lr.sh runs/tune lorm "1e-2:0:gamma_head=0.1 1e-2:0:gamma_head=0.5" 0.2
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="$1"; method="$2"; candidates="$3"; beta="${4:-0.5}"; preset="${5:-cpu-clinc150-quick}"; seed="${6:-42}"
export LORM_DATA_DIR="${LORM_DATA_DIR:-../shared/datasets}"
for candidate in $candidates; do
    # The candidate's folder and method.json (the settings parsed and checked by the same helper).
    dir="$(.venv/bin/python - "$out" "$method" "$candidate" <<'EOF'
import json, re, sys
from pathlib import Path
out, method, candidate = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
lr, lr_lora, *rest = candidate.split(":", 2)
entry = {"lr": float(lr), "lr_lora": float(lr_lora)}
settings: dict = {}
for item in (rest[0].split(",") if rest else []):
    key, sep, value = item.partition("=")
    section, dot, name = key.partition(".")
    if not (sep and section and (name or not dot)):
        sys.exit(f"tune_lr.sh: {item!r} in {candidate!r} is not key=value or section.key=value")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value  # a bare word, e.g. pooled
    if dot:
        settings.setdefault(section, {})[name] = parsed
    else:  # a run configuration field (lorm-bench rejects an unknown one)
        entry[key] = parsed
if settings:
    entry["settings"] = settings
folder = out / re.sub(r"[^A-Za-z0-9.=+-]+", "-", f"{method}-lr{lr}-{lr_lora}" + (f"-{rest[0]}" if rest else ""))
folder.mkdir(parents=True, exist_ok=True)
(folder / "method.json").write_text(json.dumps({method: entry}) + "\n")
print(folder)
EOF
)"
    .venv/bin/lorm-bench --preset "$preset" --mode inprocess --set data.validation=5 --methods "$method" \
        --betas "$beta" --seeds "$seed" --method-config "$dir/method.json" --out "$dir" || true
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
    entry = json.loads((m.parents[4] / "method.json").read_text())[method]
    fields = [f"{k} {v}" for k, v in entry.items() if k not in ("lr", "lr_lora", "settings")]
    tuned = ", ".join(fields + [f"{s}.{k} {v}" for s, kv in entry.get("settings", {}).items() for k, v in kv.items()])
    rows.append((metrics["faa"], config["lr"], config["lr_lora"], tuned, metrics["forgetting"], metrics["beta"]))
print(f"{method}: validation FAA (held-out training samples), best first")
for faa, lr, lr_lora, tuned, forgetting, beta in sorted(rows, key=lambda r: -r[0]):
    more = f", {tuned}" if tuned else ""
    print(f"  beta {beta:g}, lr {lr:g}, lr_lora {lr_lora:g}{more}: FAA {faa:.2f}, forgetting {forgetting:.2f}")
EOF
