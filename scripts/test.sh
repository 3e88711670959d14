#!/usr/bin/env bash
# Set up the environment (if needed) and run the default test suite (slow experiments skipped).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest -m "not slow" -q "$@"
