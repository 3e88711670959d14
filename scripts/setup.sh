#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment at .venv in the project root.
# Idempotent: re-running only reinstalls when pyproject.toml changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($py --version)"
    "$py" -m venv .venv
fi
stamp=".venv/.lorm-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
echo "[setup] installing dependencies (first time: a few minutes, torch is large)"
.venv/bin/python -m pip install --quiet --upgrade pip
# The exact torch/torchvision pair that works together here; timm imports torchvision.
.venv/bin/python -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
.venv/bin/python -m pip install --quiet -e ".[dev,minilm]"
echo "$want" > "$stamp"
echo "[setup] done"
