"""Running a grid's cells (``lab/cells.py``): one after another in this process (:func:`run_grid`: a finished cell
skipped, a twin's run reused, a failure recorded and the grid going on), or several at a time in child processes
(:func:`run_children`, ``lorm-bench --jobs``). ``lab/benchmark.py`` plans the grid and is the command line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from lab.cells import Cell, resumable, run_cell
from lab.rows import _duration, _pct, cell_seconds
from lab.twins import _config_changes, _twin_key, finished_runs, stored_twin_key
from server.export import write_metrics


def run_children(
    cells: list[Cell],
    out: Path,
    mode: str,
    jobs: int,
    child_argv: Callable[[Cell], list[str]],
    say: Callable[[str], None] = print,
    poll_s: float = 0.5,
) -> list[str]:
    """``--jobs``: every unfinished cell without a finished (or already started) twin, up to ``jobs`` at a
    time, each in its own ``lorm-bench`` child process given ``child_argv(cell)``, its output in the cell's
    ``bench.log``; returns the names of the cells whose child failed, and of their unfinished twins. The
    twins are left to :func:`run_grid`, which reuses them."""

    finished = {stored_twin_key(m) for _, m in finished_runs(out) if m.get("mode") == mode}
    started: dict[str, str] = {}  # a configuration -> the name of the cell started for it
    todo: list[Cell] = []
    twins: dict[str, list[str]] = {}  # a started cell's name -> its unfinished twins' names
    for cell in cells:
        want = _twin_key(json.loads(cell.config.to_json()))
        if (cell.dir(out) / "metrics.json").exists() or want in finished:
            continue
        if want in started:
            twins[started[want]].append(cell.name)
        else:
            started[want] = cell.name
            todo.append(cell)
            twins[cell.name] = []
    say(f"lorm-bench: {len(todo)} cells to run, up to {jobs} at a time, each in its own process")
    running: dict[subprocess.Popen, tuple[Cell, Any]] = {}
    failed: list[str] = []
    stop = _terminate_as_exit()
    try:
        while todo or running:
            while todo and len(running) < jobs:
                cell = todo.pop(0)
                cell.dir(out).mkdir(parents=True, exist_ok=True)
                log = open(cell.dir(out) / "bench.log", "a")
                cmd = [sys.executable, "-m", "lab.benchmark", *child_argv(cell)]
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                running[proc] = (cell, log)
                say(f"{cell.name}: started (process {proc.pid}; {len(running)} running, {len(todo)} waiting)")
            time.sleep(poll_s)
            for proc in [p for p in running if p.poll() is not None]:
                cell, log = running.pop(proc)
                log.close()
                path = cell.dir(out) / "metrics.json"
                if proc.returncode == 0 and path.exists():
                    metrics = json.loads(path.read_text())
                    say(
                        f"{cell.name}: FAA {_pct(metrics['faa'])}, {metrics['bytes_per_client'] / 1e6:.3f} MB sent "
                        f"per client, {_duration(cell_seconds(metrics))}"
                    )
                else:
                    failed += [cell.name, *twins[cell.name]]
                    why = cell.dir(out) / ("error.txt" if (cell.dir(out) / "error.txt").exists() else "bench.log")
                    say(f"{cell.name}: FAILED (exit {proc.returncode}); see {why}")
    finally:  # interrupted (Ctrl-C, SIGTERM): no child outlives the grid (each goes on from its last step next time)
        for proc, (_, log) in running.items():
            proc.kill()
            proc.wait()
            log.close()
        stop()
    return failed


def _terminate_as_exit() -> Callable[[], None]:
    """Until the returned function is called, SIGTERM raises ``SystemExit`` (so ``finally`` blocks run and
    the children are stopped) instead of ending the process on the spot; a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def exit_on(signum: int, frame: FrameType | None) -> NoReturn:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


def run_grid(
    cells: list[Cell], out: Path, mode: str, timeout_s: float, extra: dict, say: Callable[[str], None] = print
) -> list[str]:
    """Run every unfinished cell in order; returns the names of the cells that failed."""
    failed: list[str] = []
    done = finished_runs(out)
    keys: dict[str, str] = {}  # a finished cell's name -> its twin key, read once

    def key_of(name: str, metrics: dict) -> str:
        if name not in keys:
            keys[name] = stored_twin_key(metrics)
        return keys[name]

    ran_seconds: list[float] = []
    for i, cell in enumerate(cells, 1):
        tag = f"[{i}/{len(cells)}] {cell.method} beta={cell.beta} seed={cell.seed}"
        path = cell.dir(out) / "metrics.json"
        if path.exists():
            metrics = json.loads(path.read_text())
            changed = _config_changes(metrics, cell.config)
            note = (
                f"; WARNING: it ran with other values of {changed} than this grid would use "
                f"(delete its metrics.json to rerun it)"
                if changed
                else ""
            )
            say(f"{tag}: finished before, skipped (FAA {_pct(metrics.get('faa'))}){note}")
            continue
        want = _twin_key(json.loads(cell.config.to_json()))
        twin = next(((name, m) for name, m in done if key_of(name, m) == want and m.get("mode") == mode), None)
        if twin is not None:
            metrics = {**twin[1], "method": cell.method, "beta": cell.beta, "seed": cell.seed, "reused_from": twin[0]}
            if twin[1]["config"].get("beta") != cell.config.beta:
                metrics["reused_why"] = "split-invariant"  # another beta's run: the same figures at every beta
            write_metrics(cell.dir(out), metrics)
            say(f"{tag}: same run as {twin[0]}, reused (FAA {_pct(metrics.get('faa'))})")
            continue
        eta = ""
        if ran_seconds:
            left = sum(1 for c in cells[i - 1 :] if not (c.dir(out) / "metrics.json").exists())
            eta = f", about {_duration(left * sum(ran_seconds) / len(ran_seconds))} left for {left} cells"
        going_on = resumable(cell, cell.dir(out), mode)
        say(f"{tag}: {'going on from its last committed step' if going_on else 'running'} ({mode}){eta}")
        try:
            metrics = run_cell(cell, out, mode, timeout_s, extra)
        except Exception as err:
            cell.dir(out).mkdir(parents=True, exist_ok=True)
            (cell.dir(out) / "error.txt").write_text(traceback.format_exc())
            failed.append(cell.name)
            say(
                f"{tag}: FAILED ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                f"see {cell.dir(out) / 'error.txt'}"
            )
            continue
        ran_seconds.append(cell_seconds(metrics))
        done.append((cell.name, metrics))
        say(
            f"{tag}: FAA {_pct(metrics['faa'])} (sample-weighted {_pct(metrics['faa_weighted'])}), "
            f"forgetting {_pct(metrics['forgetting'])}, {metrics['bytes_per_client'] / 1e6:.3f} MB sent per client, "
            f"{_duration(cell_seconds(metrics))}"
        )
    return failed
