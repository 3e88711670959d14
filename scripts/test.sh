#!/usr/bin/env bash
# Set up the environment (if needed), then lint, check formatting, type-check, and run the default
# test suite (slow experiments skipped).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
# Byte-code caches for the project and the tests: without them every coordinator and client a test starts
# compiles the project's modules again, and each pytest worker rewrites every test module again.
unset PYTHONDONTWRITEBYTECODE
echo "[test] ruff check (lint), ruff format --check"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy (about 40 s of one core on a fresh clone) runs beside pytest, in the gaps where tests wait on
# deadlines and child processes; its report is shown when it fails (pytest's summary stays the last line).
echo "[test] mypy (beside pytest)"
mypy_log="$(mktemp)"
trap 'rm -f "$mypy_log"' EXIT
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
# -n auto: one worker per CPU, at most 4 (the integration tests start a coordinator and clients each, and
# wait on their deadlines, which overlaps across workers).
# --dist worksteal: a worker that has run out of tests takes half of another's queue. With the default (load),
# one of two workers held the integration tests to the end while the other sat idle for four minutes.
# --durations: every run names its slowest tests, so that CI's time budget is watched where it is spent.
# Extra arguments go to pytest (e.g. `-n 0` to run in one process, `-k NAME`).
status=0
.venv/bin/python -m pytest -m "not slow" -q -n auto --maxprocesses 4 --dist worksteal --durations=25 "$@" || status=$?
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
if [ "$mypy_status" -ne 0 ]; then
    echo "[test] mypy failed:"
    cat "$mypy_log"
    exit "$mypy_status"
fi
exit "$status"
