"""The import path of the project's child processes in tests."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def project_pythonpath() -> str:
    """The project's root first, then the parent's own ``PYTHONPATH``, if any: a child must import
    this checkout's modules, and the packages of an environment that installs them there too (as
    ``server.launch`` passes it on to its children)."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(ROOT), inherited]) if inherited else str(ROOT)
