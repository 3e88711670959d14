"""Child processes for the integration tests: output collected line by line, waited for by pattern."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from procenv import project_pythonpath

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    """A child process whose output lines (stdout and stderr) are collected and can be waited for."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in iter(self.proc.stdout.readline, ""):
            self.lines.append(line)
            self._queue.put(line)

    def wait_for(self, pattern: str, timeout: float = 120.0) -> str:
        """The first new output line matching ``pattern``; fails after ``timeout`` seconds."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self._queue.empty():
                    break
                continue
            if regex.search(line):
                return line
        raise AssertionError(
            f"{self.name}: no line matching {pattern!r} within {timeout} s; exit "
            f"{self.proc.poll()}; last output:\n{''.join(self.lines[-30:])}"
        )

    def wait(self, timeout: float = 180.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s:\n{''.join(self.lines[-30:])}") from None

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP), from /proc."""
        try:
            return Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        except (FileNotFoundError, IndexError):
            return False

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


class ProjectProc(Proc):
    """A child process of the project, run from its root with its modules importable."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        super().__init__(
            name, cmd, {**os.environ, "PYTHONPATH": project_pythonpath(), "PYTHONUNBUFFERED": "1", **(env or {})}, ROOT
        )
