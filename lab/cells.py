"""One cell of a benchmark grid and how it runs: in process or distributed (resumable, timed, its memory
measured), leaving its ``metrics.json``. ``lab/runner.py`` runs a grid's cells, one after another or several at
a time in child processes; ``lab/benchmark.py`` plans the grid and is the command line, and describes the folder
layout of a cell."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn, TextIO

from client.worker import resolve_device
from common.run.config import RunConfig
from engine.launch import launch
from engine.simulation import run_inprocess, saved_config
from server.export import write_metrics


@dataclass(frozen=True)
class Cell:
    """One cell of a grid: a method (``NAME`` or ``NAME@VARIANT``) at one beta and seed, and the run
    configuration planned for it; its folder is ``<out>/cells/<method>/beta<b>/seed<s>``."""

    method: str
    beta: float
    seed: int
    config: RunConfig

    @property
    def name(self) -> str:
        return f"{self.method}/beta{self.beta}/seed{self.seed}"

    def dir(self, out: Path) -> Path:
        return out / "cells" / self.method / f"beta{self.beta}" / f"seed{self.seed}"


# ---------------------------------------------------------------------- running one cell


class CellTimeout(Exception):
    """A cell ran past ``--timeout``."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`CellTimeout` in the main thread after ``seconds`` (0: never)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum: int, frame: FrameType | None) -> NoReturn:
        raise CellTimeout(f"the run did not finish within {seconds:.0f} s (--timeout)")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _LogSink:
    """A text sink for a cell's log that drops writes once closed: ``launch``'s output pump
    threads may still be draining a pipe when the run has returned."""

    def __init__(self, path: Path) -> None:
        # line-buffered: a running cell shows its progress
        self._file: TextIO | None = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            if self._file is not None:
                self._file.write(text)
        return len(text)

    def line(self, text: str) -> None:
        self.write(text + "\n")

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def reset_peak_rss() -> bool:
    """Start this process's peak resident memory afresh (Linux: ``VmHWM``, reset by writing 5 to
    ``/proc/self/clear_refs``); False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory since the last :func:`reset_peak_rss` (``VmHWM``), or None."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def run_inprocess_cell(config: RunConfig, cell_dir: Path, timeout_s: float) -> dict:
    """The run's summary; its results directory is ``cell_dir/run/results``, its state (committed after
    every step, so that a cell cut short goes on from there) ``cell_dir/run/state`` until it is done. With
    ``peak_rss_bytes``: the most memory the run held at once, coordinator and clients together in this process
    (measured, not sampled; a resumed cell's last part; None where the system cannot tell), and ``device``:
    where its clients trained (``config.device`` resolved, e.g. ``auto`` -> ``cuda`` on a GPU host)."""
    measured = reset_peak_rss()
    sink = _LogSink(cell_dir / "log.txt")
    state = cell_dir / "run" / "state"
    try:
        with _alarm(timeout_s):
            result = run_inprocess(
                config,
                log=sink.line,
                results_dir=cell_dir / "run" / "results",
                state_dir=state,
            )
    finally:
        sink.close()
    shutil.rmtree(state, ignore_errors=True)  # done: the results hold the model; the state is its copy
    device = str(resolve_device(config.device))
    return result.summary() | {"peak_rss_bytes": peak_rss_bytes() if measured else None, "device": device}


def run_distributed_cell(config: RunConfig, cell_dir: Path, timeout_s: float) -> dict:
    """A coordinator and ``num_clients`` client processes (``lorm-launch``); the coordinator's summary."""
    run_dir = cell_dir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)  # a cell cut short: the coordinator resumes from run/state
    config_path = run_dir / "config.json"
    config_path.write_text(config.to_json())
    sink = _LogSink(cell_dir / "log.txt")
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            rc = launch(
                config_path,
                config.num_clients,
                run_dir / "state",
                run_dir / "results",
                timeout_s if timeout_s > 0 else 10 * 365 * 86400.0,
            )
    finally:
        sink.close()
    if rc != 0:
        tail = "".join((cell_dir / "log.txt").read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"lorm-launch exited with {rc}; last lines of {cell_dir / 'log.txt'}:\n{tail}")
    return json.loads((run_dir / "results" / "metrics.json").read_text())


RUNNERS: dict[str, Callable[[RunConfig, Path, float], dict]] = {
    "inprocess": run_inprocess_cell,
    "distributed": run_distributed_cell,
}


def resumable(cell: Cell, cell_dir: Path, mode: str) -> bool:
    """Whether ``cell`` was cut short with the configuration it has now, so it can go on: its state
    (``run/state``, the in-process engine's or, distributed, the coordinator's) holds that run."""
    try:
        saved = saved_config(cell_dir / "run" / "state")
    except (OSError, ValueError, KeyError):  # a state that cannot be read is started over
        return False
    return saved == cell.config


def run_cell(cell: Cell, out: Path, mode: str, timeout_s: float, extra: dict) -> dict:
    """Run ``cell`` (on from its last committed step if it was cut short, else from scratch) and leave its
    ``metrics.json``; raises if the run fails."""
    cell_dir = cell.dir(out)
    if not resumable(cell, cell_dir, mode):
        shutil.rmtree(cell_dir / "run", ignore_errors=True)
        (cell_dir / "log.txt").unlink(missing_ok=True)
    cell_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    summary = RUNNERS[mode](cell.config, cell_dir, timeout_s)
    wall = time.perf_counter() - start
    metrics = {
        **summary,
        "method": cell.method,
        "beta": cell.beta,
        "seed": cell.seed,
        "mode": mode,
        "wall_seconds": wall,
        "bytes_per_client": total_bytes(summary["history"]),
        **extra,
    }
    write_metrics(cell_dir, metrics)
    (cell_dir / "error.txt").unlink(missing_ok=True)
    return metrics


def total_bytes(history: list[dict]) -> float:
    """Tensor payload bytes one client sent over the whole run (the sum of every step's mean)."""
    return float(sum(entry.get("bytes_per_client") or 0 for entry in history))
