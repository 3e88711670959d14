"""Coordinator and clients as separate hosts: each in its own network namespace with its own
address, started with the commands and environment of deploy/compose.yaml (the images' entry
points, the same flags, TLS files and names; paths mapped to a temporary directory).

The run is ``--preset tiny`` cut to 1 task of 2 rounds (appended ``--set`` overrides) so that
it fits the default test run. Both runs must equal the in-process engine bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from client.runtime import build_runtime
from client.spec import describe
from common.run.arguments import config_from_args
from engine.simulation import run_inprocess
from server.certs import create_dev_pki
from server.export import export_adapter
from server.main import build_parser

import netns
from procenv import project_pythonpath

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent  # the console scripts the images' entry points name
SETTINGS = {"LORM_PRESET": "tiny"}  # compose variables this test sets; the others keep their defaults
SMALLER = ["--set", "num_tasks=1", "--set", "rounds_per_task=2"]
NUM_CLIENTS = 3

UNAVAILABLE = netns.unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"separate hosts: {UNAVAILABLE}")


def interpolate(text: str) -> str:
    return re.sub(r"\$\{([A-Z0-9_]+):-([^}]*)\}", lambda m: SETTINGS.get(m.group(1), m.group(2)), text)


def entrypoint(dockerfile: str) -> str:
    (script,) = json.loads(re.search(r"^ENTRYPOINT\s+(.+)$", (DEPLOY / dockerfile).read_text(), re.M).group(1))
    return script


class ComposeService:
    """What one compose service runs, with its container paths mapped into ``root``."""

    def __init__(self, spec: dict, name: str, root: Path) -> None:
        service = spec["services"][name]
        self.name = name
        self.script = entrypoint(Path(service["build"]["dockerfile"]).name)
        paths = {}  # container path -> host path
        for s in service.get("secrets", []):
            paths[f"/run/secrets/{s['target']}"] = root / spec["secrets"][s["source"]]["file"]
        for mount in service.get("volumes", []):
            source, target = mount.split(":")[:2]
            paths[target] = root / Path(source).name
        self.paths = paths
        self.argv = [self.map(a) for a in service["command"]]
        self.env = {k: self.map(str(v)) for k, v in service.get("environment", {}).items()}
        self.health = [self.map(a) for a in service["healthcheck"]["test"][1:]] if "healthcheck" in service else None

    def map(self, value: str) -> str:
        for inside, outside in self.paths.items():
            if value == inside or value.startswith(inside + "/"):
                outside.parent.mkdir(parents=True, exist_ok=True)
                return str(outside) + value[len(inside) :]
        return value

    def command(self, *extra: str) -> list[str]:
        return [str(BIN / self.script), *self.argv, *extra]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The compose services, their files (development certificates as build-and-run.sh makes them)."""
    root = tmp_path_factory.mktemp("compose")
    spec = yaml.safe_load(interpolate((DEPLOY / "compose.yaml").read_text()))
    clients = [f"client-{i}" for i in range(NUM_CLIENTS)]
    assert [n for n in spec["services"] if n != "coordinator"] == clients
    create_dev_pki(root / "certs", clients + ["health"], hosts=("coordinator", "localhost", "127.0.0.1"))
    # As build-and-run.sh's lorm-spec: the run's model, which the coordinator holds every Describe to.
    argv = ComposeService(spec, "coordinator", root).argv + SMALLER
    (root / "model-spec.json").write_text(describe(config_from_args(build_parser().parse_args(argv))).to_json() + "\n")
    return spec, root


@pytest.fixture(scope="module")
def reference(deployment, tmp_path_factory):
    """The in-process run of the coordinator's configuration, exported as the coordinator exports."""
    spec, root = deployment
    argv = ComposeService(spec, "coordinator", root).argv + SMALLER
    config = config_from_args(build_parser().parse_args(argv))
    assert config.num_clients == NUM_CLIENTS and config.backbone == "tiny-bert"
    result = run_inprocess(config)
    out = tmp_path_factory.mktemp("inprocess")
    export_adapter(out / "adapter", result.adapter, build_runtime(config).spec, rank_per_task=config.rank)
    return result, load_file(str(out / "adapter" / "adapter_model.safetensors"))


def env_for(service: ComposeService) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": project_pythonpath(), **service.env}


def start(lab: netns.Lab, spec: dict, root: Path, client_env: dict[int, dict[str, str]] | None = None):
    """The coordinator's host, then (once its health check passes) one host per client."""
    coordinator = ComposeService(spec, "coordinator", root)
    server_host = lab.host("coordinator")
    server = server_host.spawn("coordinator", coordinator.command(*SMALLER), env_for(coordinator), root)
    server.wait_for("serving on", timeout=240)
    # As `depends_on: service_healthy`: the compose health check, run where compose runs it.
    deadline = time.monotonic() + 120
    while True:
        probe = server_host.spawn(
            "health", [str(BIN / coordinator.health[0]), *coordinator.health[1:]], env_for(coordinator), root
        )
        if probe.wait(timeout=60) == 0:
            break
        assert time.monotonic() < deadline, f"health check never passed:\n{''.join(probe.lines)}"
        time.sleep(1)
    clients, hosts = [], []
    for i in range(NUM_CLIENTS):
        service = ComposeService(spec, f"client-{i}", root)
        host = lab.host(service.name, hosts={"coordinator": server_host.address})
        env = {**env_for(service), **(client_env or {}).get(i, {})}
        clients.append(host.spawn(service.name, service.command(), env, root))
        hosts.append(host)
    return server, clients, hosts


def assert_same_as_reference(root: Path, reference) -> None:
    result, adapter = reference
    metrics = json.loads((root / "results" / "metrics.json").read_text())
    assert metrics["correct"] == result.matrix.correct and metrics["total"] == result.matrix.total
    got = load_file(str(root / "results" / "adapter" / "adapter_model.safetensors"))
    assert got.keys() == adapter.keys()
    for key in adapter:
        assert torch.equal(got[key], adapter[key]), key


def fresh(root: Path) -> None:
    for name in ("state", "results"):
        shutil.rmtree(root / name, ignore_errors=True)


@pytest.mark.long(22)
def test_coordinator_and_three_clients_on_separate_hosts(deployment, reference):
    spec, root = deployment
    fresh(root)
    with netns.Lab() as lab:
        server, clients, hosts = start(lab, spec, root)
        assert len({h.address for h in hosts} | {lab.hosts[0].address}) == NUM_CLIENTS + 1
        assert server.wait(timeout=600) == 0
        assert all(c.wait(timeout=120) == 0 for c in clients)
    log = "".join(server.lines)
    assert "connections: TLS, clients authenticated by client certificates" in log
    for i in range(NUM_CLIENTS):
        assert f"client client-{i} joined as index {i}" in log
    assert_same_as_reference(root, reference)


# A second full run on four hosts (minutes on a loaded 2-core machine): `pytest -m slow` runs it.
@pytest.mark.slow
def test_link_cut_mid_push_recovers_and_changes_nothing(deployment, reference):
    """Client 1 stops just before its second push (task 0, round 1); its cable is pulled, it
    resumes and pushes into the dead link, and the cable comes back after a few seconds."""
    spec, root = deployment
    fresh(root)
    with netns.Lab() as lab:
        server, clients, hosts = start(lab, spec, root, {1: {"LORM_FAULT": "client.push:2:stop"}})
        cut = clients[1]
        cut.wait_for("LORM_FAULT: SIGSTOP at client.push", timeout=600)
        deadline = time.monotonic() + 30
        while not cut.stopped():
            assert time.monotonic() < deadline, "client-1 did not stop at its second push"
            time.sleep(0.05)
        lab.cut(hosts[1])
        cut.resume()
        time.sleep(6)  # the push is under way into the dead link
        assert cut.proc.poll() is None, "".join(cut.lines[-20:])
        assert not any("task 0 round 1 train" in line for line in cut.lines), "the push got through a cut link"
        lab.restore(hosts[1])
        cut.wait_for(r"task 0 round 1 train", timeout=300)  # pushed once the link is back
        assert server.wait(timeout=600) == 0
        assert all(c.wait(timeout=120) == 0 for c in clients)
    for other in (clients[0], clients[2]):  # the other clients never saw a failure
        assert not any("retrying" in line for line in other.lines), "".join(other.lines)
    assert_same_as_reference(root, reference)
