"""The import path of the project's child processes in tests: ``server.launch``'s, for the same reason."""

from __future__ import annotations

from server.launch import ROOT, project_pythonpath

__all__ = ["ROOT", "project_pythonpath"]
