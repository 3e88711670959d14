"""Which code ran a stored cell, and the settings defaults that code had: the git commit a cell records
(:func:`code_version`), whether one commit's code holds another (:func:`_includes`), and every change of a
setting's default (:data:`DEFAULT_CHANGES`), by which :func:`defaults_then` reads a stored cell with the defaults
it ran with. ``lab/twins.py`` compares stored cells with planned ones on that reading."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# The commit from which lorm-bench records in each cell the code that ran it: a cell without ``code`` is older.
CODE_RECORDED = "80d857a6aebda70ee9b058e4f58a2762bd571c25"


def code_version(root: Path = ROOT) -> dict | None:
    """``{"commit": ..., "changed": bool}`` of the git checkout the code runs from (``changed``: its
    tracked files differ from the commit), or ``None`` outside a checkout or without git."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True)
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        changed = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "changed": changed}


@functools.cache
def _this_commit() -> str | None:
    return (code_version() or {}).get("commit")


@functools.cache
def _includes(commit: str, change: str) -> bool | None:
    """Whether the code of ``commit`` holds the commit ``change`` (git ancestry); None where git cannot tell
    (no git, no checkout, or a commit it does not know)."""
    try:
        done = subprocess.run(
            ["git", "merge-base", "--is-ancestor", change, commit], cwd=ROOT, capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(done.returncode)


@dataclass(frozen=True)
class DefaultChange:
    """A setting whose default changed in commit ``commit``: code before it ran with ``before`` where the run left
    the setting unset."""

    section: str
    key: str
    before: Any
    commit: str  # the full hash of the commit that changed the default


# Every change of a setting's default, oldest first. A run's stored configuration (a result cell's ``config``) holds
# only the settings it set, so a cell is compared with today's configurations (``lab.twins``: a changed grid, a
# twin to reuse) with the defaults of the code that ran it. Changing a default: add the change here;
# ``tests/common/test_settings_defaults.py`` holds every default and fails until the two agree.
DEFAULT_CHANGES: tuple[DefaultChange, ...] = (
    DefaultChange("robust", "kappa", 4.0, "c2b49e4bf5b1182f8d1a1eddb7820b7d91eb516a"),
    DefaultChange("secagg", "bound", 2.0**30, "d4f8b8b1a4cdd7fb11833db962ca23e03a90d4fb"),
    DefaultChange("pilora", "soft_temp", 0.2, "e1be4a2984f2b701bb8b356e1e17cb06953d9e4e"),
    DefaultChange("ridge", "lambda_rule", "members", "af9b9aabae4a802dde8c15b8b2360374ec486f1d"),
    DefaultChange("dp", "gram_share", 0.05, "987068da55843ed9f0ceec739ae79d12175c2d8d"),
    DefaultChange("dp", "lambda_scale", 3.0, "987068da55843ed9f0ceec739ae79d12175c2d8d"),
)


def defaults_then(metrics: dict) -> dict[tuple[str, str], Any]:
    """The settings defaults of the code that ran a stored cell (its metrics) where they differ from this code's
    (:data:`DEFAULT_CHANGES`), by the cell's ``code`` record: this checkout's commit or a later one,
    none; an earlier one, the default it had; a cell from before the record began (no ``code``), the earlier
    default of each change made since; where git cannot tell (a commit it does not know, a cell that ran outside a
    checkout while this code runs in one), a value no configuration holds, so that the cell is no twin and a grid
    that would run it again says so."""
    code = metrics.get("code", dataclasses.MISSING)
    then: dict[tuple[str, str], Any] = {}
    for change in DEFAULT_CHANGES:
        if code is dataclasses.MISSING:  # older than the record: it predates every change made after it began
            held = False if _includes(change.commit, CODE_RECORDED) else None
        elif (code or {}).get("commit") == _this_commit():  # this code (outside git: both unrecorded)
            held = True
        else:
            held = _includes(code["commit"], change.commit) if code else None
        if held is not True:
            unknown = f"unknown (the default changed at {change.commit[:7]})"
            then[(change.section, change.key)] = change.before if held is False else unknown
    return then
