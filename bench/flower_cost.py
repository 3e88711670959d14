"""The same LoRM run over this project's gRPC coordinator and over Flower's deployment engine, side by side: wall
time and bytes per client, every party a process of its own on loopback (plaintext).

    python bench/flower_cost.py --preset tiny

- gRPC: ``lorm-server`` and one ``lorm-client`` per client. Bytes: the coordinator's own counters of serialized
  messages received and sent (``lorm_received_bytes``, ``lorm_sent_bytes`` at ``--metrics-port``), read when
  the run is done.
- Flower: a ``flower-superlink``, one ``flower-supernode`` per client (``--node-config index=i``) and
  ``flwr run flower/app``. Bytes: the ServerApp relay's protobuf payloads (plans sent, answers received), and
  Flower's own count of the run's network traffic (``flwr ls``: inbound and outbound bytes of the SuperLink,
  its message envelopes and the run's bundle included).

Wall time runs from the first process started to the run's results on disk; each side's processes start fresh
(their interpreters import torch), so start-up is in it. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common.methods.checks import validate
from common.run.arguments import add_config_arguments
from common.run.schedule import add_schedule_arguments, config_with_schedule

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Children whose output goes to files in ``logs``; all killed on leaving."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs, self.env = logs, env
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *cmd: str) -> subprocess.Popen:
        out = (self.logs / f"{name}.log").open("w")
        proc = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def wait_for(self, name: str, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log(name))
            if found:
                return found
            time.sleep(0.2)
        raise SystemExit(f"{name}: no {pattern!r} within {timeout:g} s:\n{self.log(name)[-3000:]}")

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def grpc_run(config: Path, clients: int, scratch: Path) -> dict[str, Any]:
    port, metrics = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with Processes(scratch, env) as p:
        server = [sys.executable, "-m", "server.main", "--config", str(config), "--insecure", "--port", str(port)]
        run = ["--state-dir", str(scratch / "state"), "--results-dir", str(scratch / "results")]
        p.start("server", *server, *run, "--metrics-port", str(metrics), "--linger", "60")
        p.wait_for("server", "serving on", 120)
        for i in range(clients):
            client = ["--server", f"127.0.0.1:{port}", "--insecure", "--index", str(i), "--client-id", f"client-{i}"]
            p.start(f"client-{i}", sys.executable, "-m", "client.main", *client, "--give-up", "120")
        p.wait_for("server", r"run \S+ done: FAA", 1800)
        wall = time.perf_counter() - start
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
    received = sum(float(v) for v in re.findall(r"^lorm_received_bytes_total\{[^}]*\} (\S+)$", text, re.M))
    sent = sum(float(v) for v in re.findall(r"^lorm_sent_bytes_total\{[^}]*\} (\S+)$", text, re.M))
    metrics_file = json.loads((scratch / "results" / "metrics.json").read_text())
    return {
        "wall_s": round(wall, 1),
        "faa": round(metrics_file["faa"], 2),
        "bytes_per_client": {"received": round(received / clients), "sent": round(sent / clients)},
    }


def flower_run(config: Path, clients: int, scratch: Path) -> dict[str, Any]:
    port = free_port()
    home = scratch / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink.bench]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    results = scratch / "results"
    start = time.perf_counter()
    with Processes(scratch, env) as p:
        link = ["--insecure", "--port", str(port), "--database", str(scratch / "superlink.db")]
        p.start("superlink", str(BIN / "flower-superlink"), *link, "--disable-runtime-dependency-installation")
        p.wait_for("superlink", "Uvicorn running on", 120)
        for i in range(clients):
            node = ["--insecure", "--superlink", f"127.0.0.1:{port}", "--port", str(free_port())]
            p.start(f"supernode-{i}", str(BIN / "flower-supernode"), *node, "--node-config", f"index={i}")
        run_config = f"lorm-args={json.dumps(f'--config {config}')} results-dir={json.dumps(str(results))}"
        p.start(
            "flwr-run",
            str(BIN / "flwr"),
            "run",
            str(ROOT / "flower" / "app"),
            "bench",
            "--stream",
            "--run-config",
            run_config,
        )
        carried = p.wait_for("flwr-run", r"(\d+) bytes of plans sent, (\d+) bytes of answers received", 3600)
        while not (results / "metrics.json").exists():
            time.sleep(0.2)
        wall = time.perf_counter() - start
        listed = subprocess.run(
            [str(BIN / "flwr"), "ls", "bench", "--format", "json"], env=env, capture_output=True, text=True, timeout=60
        )
    (run,) = json.loads(listed.stdout)["runs"]
    traffic = run["network-traffic"]
    metrics_file = json.loads((results / "metrics.json").read_text())
    return {
        "wall_s": round(wall, 1),
        "faa": round(metrics_file["faa"], 2),
        "relay_bytes_per_client": {
            "plans_sent": round(int(carried.group(1)) / clients),
            "answers_received": round(int(carried.group(2)) / clients),
        },
        "flower_traffic_bytes_per_client": {
            "inbound": round(traffic["inbound-bytes"] / clients),
            "outbound": round(traffic["outbound-bytes"] / clients),
        },
        "clientapp_seconds": round(run["compute-time"]["clientapp-seconds"], 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    add_schedule_arguments(parser)
    argv_run = sys.argv[1:] if argv is None else argv
    config = validate(config_with_schedule(parser.parse_args(argv_run)))
    with tempfile.TemporaryDirectory(prefix="lorm-flower-cost-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(config.to_json())
        sides = {}
        for name, side in (("grpc", grpc_run), ("flower_deployment", flower_run)):
            (Path(tmp) / name).mkdir()
            sides[name] = side(path, config.num_clients, Path(tmp) / name)
    print(json.dumps({"args": shlex.join(argv_run), "clients": config.num_clients, **sides}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
