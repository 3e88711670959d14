"""Child processes for the integration tests: output collected line by line, waited for by pattern.

The project's programs (``python -m client.main``, ``python -m server.main``, a test's script) start as
processes forked from a server that has imported torch and transformers (:class:`Forked`): each is still a
process of its own (its pid, memory, sockets, signals and exit code), but skips the five seconds of CPU a
fresh interpreter spends importing them, most of what an integration test costs. The program's own modules
are imported in the child, after it has taken its environment, and its random seeds are drawn afresh; what
it shares with its siblings is the server's string-hash seed. ``LORM_TEST_EXEC=1`` starts every one by exec
instead, as a user would.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util  # its exit handler (which waits for every child) registered before ours, so it runs after
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import forked

from procenv import project_pythonpath

ROOT = Path(__file__).resolve().parents[2]
# What the fork server imports once (third-party only: the program's modules read their environment on import)
PRELOAD = ["numpy", "torch", "transformers.models.bert.modeling_bert", "safetensors.torch"]


def free_port() -> int:
    """A loopback port nothing listens on now (a coordinator binds it later; one that finds it taken refuses)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Forked:
    """``python args`` (``-m MODULE ...`` or ``SCRIPT ...``) in a process forked from the fork server, with the
    part of ``subprocess.Popen`` that :class:`Proc` and the tests use: ``pid``, ``stdout`` (stderr merged into
    it, as text), ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode`` (``-N``: killed by signal N)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        ours, theirs = socket.socketpair()
        self.args = args
        self._process = context.Process(target=forked.run, args=(theirs, args, env, str(cwd)))
        self._process.start()
        _STARTED.append(self)
        theirs.close()
        self.pid = self._process.pid
        self.stdout = ours.makefile("r", encoding="utf-8", errors="replace")
        ours.close()  # the file keeps the socket open
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_STARTED: list[Forked] = []


@atexit.register
def _kill_leftovers() -> None:
    """Kill what a test left running (stopped or not) when the test process ends: multiprocessing's exit
    handler would wait for it for ever."""
    for process in _STARTED:
        process.kill()


def forkable(cmd: list[str]) -> bool:
    """Whether ``cmd`` runs a Python program of this interpreter that :class:`Forked` can run."""
    python = len(cmd) > 1 and cmd[0] == sys.executable and (cmd[1] == "-m" or cmd[1].endswith(".py"))
    return python and os.environ.get("LORM_TEST_EXEC") != "1"


class Proc:
    """A child process whose output lines (stdout and stderr) are collected and can be waited for."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.proc: subprocess.Popen | Forked = (
            Forked(cmd[1:], env, cwd)
            if forkable(cmd)
            else subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()

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
        """The exit code, once the process has exited and its output is all in :attr:`lines` (or after 10 s more,
        should a child of its own still hold the output open)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s:\n{''.join(self.lines[-30:])}") from None
        self._pumping.join(timeout=10)
        return code

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
