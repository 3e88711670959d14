"""LoRM on Flower's deployment engine, as real processes on loopback, over TLS: a SuperLink and three SuperNodes,
each site with its own CSV files by ``--node-config``, and the project's app started by ``flwr run``. The run is an
open schedule of one task; once it is trained, the run idles and its ServerApp is killed; a second ``flwr run``
resumes it from its state directory, idle at task 1; the operator appends task 1 to the living run (``lorm-admin``
at the ServerApp's operator address), it is trained, and the operator finishes the run. The adapter, head and
accuracy counts are the in-process engine's over the same per-client files, bit for bit, and ``lorm-predict`` on the
export gives the run's counts on every site's test file. (The operator appending a task while another trains is
the coordinator's own, tested over gRPC; here each message is a process start, so the run is kept to two tasks.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from common.infra.tls import token_digest  # noqa: E402
from engine.simulation import run_inprocess  # noqa: E402
from server.admin import main as admin  # noqa: E402
from server.certs import create_dev_pki  # noqa: E402
from server.state_lock import LOCK_FILE  # noqa: E402

from own_data import TASKS, TEST_FILES, assert_the_engines_run, four_clients, owned_config  # noqa: E402
from procs import ROOT, ProjectProc, free_port  # noqa: E402

pytestmark = pytest.mark.long(150)

APP = ROOT / "flower" / "app"
BIN = Path(sys.executable).parent
TOKEN = "operator-flower-token"
SITES = 3


class Federation:
    """A SuperLink and one SuperNode per site on loopback, over TLS with a development CA, and ``flwr`` pointed at
    the SuperLink by a connection in its own ``FLWR_HOME``."""

    def __init__(self, root: Path, folder: Path) -> None:
        self.root, self.procs = root, []
        pki = create_dev_pki(root / "tls", [f"client-{i}" for i in range(SITES)])
        self.ca, self.cert, self.key = str(pki.ca), str(pki.server_cert), str(pki.server_key)
        self.port = free_port()
        home = root / "flwr-home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "sites"\n\n[superlink.sites]\naddress = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{self.ca}"\n'
        )
        # Flower's own: its home here, no update check or telemetry (no internet), no dependency installs
        self.env = {"FLWR_HOME": str(home), "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0"}
        self.env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"  # Flower starts its helpers by name
        self.env["LORM_DATA_DIR"] = ""  # every site's data is its own, by its node config
        link = [
            "--ssl-certfile",
            self.cert,
            "--ssl-keyfile",
            self.key,
            "--ssl-ca-certfile",
            self.ca,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--database",
            str(root / "superlink.db"),
            "--disable-runtime-dependency-installation",
        ]
        self.superlink = self.start("superlink", "flower-superlink", *link)
        self.superlink.wait_for("Uvicorn running on", timeout=60)
        for i in range(SITES):
            test = f' test-data="{folder / TEST_FILES[i]}"' if i in TEST_FILES else ""
            node = f'index={i} data="{folder / f"client{i}.csv"}"{test} privacy-ledger="{root / f"ledger-{i}.json"}"'
            self.start(
                f"supernode-{i}",
                "flower-supernode",
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--root-certificates",
                self.ca,
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--node-config",
                node,
            ).wait_for("SuperNode ID", timeout=60)

    def start(self, name: str, program: str, *args: str) -> ProjectProc:
        proc = ProjectProc(name, [str(BIN / program), *args], self.env)
        self.procs.append(proc)
        return proc

    def run(self, run_config: dict[str, object]) -> ProjectProc:
        """``flwr run`` of the project's app with ``run_config``, its ServerApp's log streamed."""
        pairs = " ".join(f"{key}={json.dumps(value)}" for key, value in run_config.items())
        return self.start("flwr-run", "flwr", "run", str(APP), "sites", "--run-config", pairs, "--stream")

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.kill()


@pytest.fixture
def federation(tmp_path):
    made: list[Federation] = []

    def make(folder: Path) -> Federation:
        made.append(Federation(tmp_path, folder))
        return made[-1]

    yield make
    for f in made:
        f.close()


def serverapp_pid(state: Path) -> int:
    """The ServerApp process's pid, as the state directory's lock names its holder."""
    return int((state / LOCK_FILE).read_text().split()[1])  # "pid N on HOST"


def killed(pid: int, timeout: float = 30.0) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return "zombie"


def flwr_status(f: Federation) -> list[str]:
    out = subprocess.run(
        [str(BIN / "flwr"), "ls", "sites", "--format", "json"],
        env={**os.environ, **f.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [run["status"] for run in json.loads(out)["runs"]]


def test_lorm_on_flowers_deployment_engine_grows_survives_a_killed_serverapp_and_is_the_engines_run(
    federation, tmp_path, capsys
):
    folder = four_clients(tmp_path / "clients")  # sites 0 to 2 of it; client 3's file is no site's
    tasks = TASKS[:2]
    data = {"owned": True, "classes": [name for task in tasks for name in task], "max_classes": 6}
    common = {"num_clients": SITES, "rounds_per_task": 1}
    engine_data = {**data, "clients_dir": str(folder)}
    engine = owned_config(num_tasks=2, task_sizes=[2, 2], settings={"data": engine_data}, **common)
    inprocess = tmp_path / "inprocess"
    result = run_inprocess(engine, results_dir=inprocess)  # the schedule known from the start

    coordinator = owned_config(num_tasks=1, settings={"data": {**data, "classes": tasks[0]}}, **common)
    (tmp_path / "config.json").write_text(coordinator.to_json())
    (tmp_path / "operator.sha256").write_text(token_digest(TOKEN))
    (tmp_path / "operator.token").write_text(TOKEN)
    f = federation(folder)
    state, port = tmp_path / "state", free_port()
    run_config = {
        "lorm-args": f"--config {tmp_path / 'config.json'} --task {','.join(tasks[0])} --open",
        "state-dir": str(state),
        "operator-address": f"127.0.0.1:{port}",
        "operator-digest-file": str(tmp_path / "operator.sha256"),
        "operator-tls-cert": f.cert,
        "operator-tls-key": f.key,
        "nodes-timeout": 60.0,
    }
    operator = [
        "--target",
        f"127.0.0.1:{port}",
        "--tls-ca",
        f.ca,
        "--operator-token-file",
        str(tmp_path / "operator.token"),
    ]

    first = f.run(run_config)
    first.wait_for("task 0 starts", timeout=180)  # every site joined over Flower: the run lives
    first.wait_for("task 0 was the schedule's last: the run is open", timeout=300)

    killed(serverapp_pid(state))  # between tasks: the run idles, task 0 committed on disk
    first.kill()
    second = f.run(run_config)
    second.wait_for("resumed run owned at idle task 1", timeout=120)
    assert admin(["add-task", "--classes", ",".join(tasks[1]), "--wait", "--timeout", "60", *operator]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == tasks  # the resumed ServerApp kept task 0
    assert admin(["finish", *operator]) == 0
    capsys.readouterr()
    assert second.wait(timeout=300) == 0, "".join(second.lines[-30:])
    assert "finished:completed" in flwr_status(f)  # Flower's view: the second run completed

    assert_the_engines_run(state / "results", inprocess, result.matrix, folder, capsys, tasks)
