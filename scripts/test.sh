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
# -n auto: one worker per CPU, at most 4 (the integration tests start a coordinator and clients each;
# they spend most of their time importing torch in fresh processes, which overlaps across workers).
# --durations: every run names its slowest tests, so that CI's time budget is watched where it is spent.
# Extra arguments go to pytest (e.g. `-n 0` to run in one process, `-k NAME`).
exec .venv/bin/python -m pytest -m "not slow" -q -n auto --maxprocesses 4 --durations=25 "$@"
