"""The test children's import path: the project first, the parent's own PYTHONPATH kept after it."""

from __future__ import annotations

import os
import subprocess
import sys

from procenv import ROOT, project_pythonpath


def test_a_child_imports_the_project_and_what_the_parents_pythonpath_holds(tmp_path, monkeypatch):
    (tmp_path / "installed_beside.py").write_text("WHERE = 'parent path'\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert project_pythonpath().split(os.pathsep)[0] == str(ROOT)
    script = "import common.run.config, installed_beside; print(installed_beside.WHERE)"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": project_pythonpath()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "parent path", done.stderr
    monkeypatch.delenv("PYTHONPATH")
    assert project_pythonpath() == str(ROOT)
