#!/usr/bin/env bash
# Set up the environment (if needed), then lint, check formatting, type-check, and run the default
# test suite (slow experiments skipped).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
echo "[test] ruff check (lint), ruff format --check, mypy"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# --durations: every run names its slowest tests, so that CI's time budget is watched where it is spent
exec .venv/bin/python -m pytest -m "not slow" -q --durations=25 "$@"
