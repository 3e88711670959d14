"""The import path of the project's child processes in tests: ``engine.launch``'s, for the same reason."""

from __future__ import annotations

from engine.launch import ROOT, project_pythonpath

__all__ = ["ROOT", "project_pythonpath"]
