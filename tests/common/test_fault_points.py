"""Fault points: they kill the process at the named nth hit, and do nothing otherwise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from procenv import project_pythonpath

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
from common.infra.faults import after_items, fault_point
for i in range(3):
    print("before", i, flush=True)
    fault_point("merge.fold")
    fault_point("push.staged")
print("taken", list(after_items(range(4), "push.receiving", 2)), flush=True)
print("survived", flush=True)
"""


def run(fault: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LORM_FAULT"}
    if fault is not None:
        env["LORM_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={**env, "PYTHONPATH": project_pythonpath()},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_unset_does_nothing():
    out = run(None)
    assert out.returncode == 0 and "taken [0, 1, 2, 3]" in out.stdout and "survived" in out.stdout


def test_kills_at_the_nth_hit_of_its_point_only():
    out = run("merge.fold:2")
    assert out.returncode == -signal.SIGKILL
    assert out.stdout.split() == ["before", "0", "before", "1"]
    assert out.stderr == "LORM_FAULT: SIGKILL at merge.fold (hit 2)\n"


def test_stream_point_fires_after_count_items():
    out = run("push.receiving")
    assert out.returncode == -signal.SIGKILL and "taken" not in out.stdout and "before 2" in out.stdout


def test_malformed_setting_is_refused():
    for fault in ("merge.fodl", "merge.fold:0", "merge.fold:x", "merge.fold:1:pause"):
        out = run(fault)
        assert out.returncode == 1 and "LORM_FAULT should be" in out.stderr and repr(fault) in out.stderr, fault
