"""Real processes on loopback: a coordinator and clients started as the launcher starts them."""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    """A child process whose output lines are collected and can be waited for."""

    def __init__(self, name: str, cmd: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.name = name
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     cwd=ROOT)
        self.lines: list[str] = []
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in iter(self.proc.stdout.readline, ""):
            self.lines.append(line)
            self.queue.put(line)

    def wait_for(self, pattern: str, timeout: float = 120.0) -> str:
        """The first new output line matching ``pattern``; fails after ``timeout`` seconds."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.queue.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.queue.empty():
                    break
                continue
            if regex.search(line):
                return line
        raise AssertionError(f"{self.name}: no line matching {pattern!r} within {timeout} s; "
                             f"exit {self.proc.poll()}; last output:\n{''.join(self.lines[-30:])}")

    def wait(self, timeout: float = 180.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s:\n{''.join(self.lines[-30:])}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """Start and stop coordinator and client processes for one run directory."""

    def __init__(self, run_dir: Path, config_json: str) -> None:
        self.run_dir = run_dir
        self.config = run_dir / "config.json"
        self.config.write_text(config_json)
        self.port = free_port()
        self.procs: list[Proc] = []

    def server(self) -> Proc:
        p = Proc("server", [sys.executable, "-m", "server.main", "--config", str(self.config), "--state-dir",
                            str(self.run_dir / "state"), "--results-dir", str(self.run_dir / "results"),
                            "--port", str(self.port), "--linger", "5"])
        self.procs.append(p)
        return p

    def client(self, i: int) -> Proc:
        p = Proc(f"client-{i}", [sys.executable, "-m", "client.main", "--server", f"127.0.0.1:{self.port}",
                                 "--client-id", f"client-{i}", "--index", str(i), "--give-up", "120"])
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            p.kill()


@pytest.fixture
def cluster(tmp_path):
    made: list[Cluster] = []

    def make(config_json: str, name: str = "run") -> Cluster:
        (tmp_path / name).mkdir()
        c = Cluster(tmp_path / name, config_json)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
