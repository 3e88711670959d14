"""The import path of the project's child processes in tests: ``server.launch``'s, for the same reason."""

from __future__ import annotations

from pathlib import Path

from server.launch import project_pythonpath

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["ROOT", "project_pythonpath"]
