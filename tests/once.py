"""An expensive fixture computed once per test session, whichever pytest-xdist worker asks for it first.

A module-scoped fixture is computed by every worker that runs one of the module's tests; with ``--dist worksteal``
that is often both workers of a 2-core machine, each starting the same child process. Here the first worker
computes while the others wait on a file lock, then read what it wrote.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

DONE = ".complete"


def computed_once(factory: pytest.TempPathFactory, name: str, compute: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``compute(folder)`` has filled, in this session's shared temporary root.

    Under xdist each worker's base temporary folder is a child of the session's root; without xdist the base
    folder is the root. A computation that raised leaves no mark, so the next worker tries again (and fails in
    its own test)."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / f"once-{name}"
    with FileLock(str(folder) + ".lock"):
        if not (folder / DONE).exists():
            folder.mkdir(exist_ok=True)
            compute(folder)
            (folder / DONE).touch()
    return folder
