"""Running a grid's cells: one cell in process or distributed (resumable, timed, its memory measured),
the grid one cell after another (:func:`run_grid`), or several at a time in child processes
(:func:`run_children`, ``lorm-bench --jobs``). ``engine/benchmark.py`` plans the grid and is the
command line; the folder layout of a cell is described there."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TextIO

from client.worker import resolve_device
from common.methods import registry, sections, split_invariant
from common.run.config import RunConfig, current_keys
from common.run.settings import (
    DEFAULT_CHANGES,
    DataSettings,
    DpSettings,
    ModelSettings,
    RobustSettings,
    SecAggSettings,
)
from engine.benchmark_report import _duration, _pct, cell_seconds
from engine.launch import launch
from engine.simulation import run_inprocess, saved_config
from server.export import write_metrics

ROOT = Path(__file__).resolve().parents[1]


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


# Every RunConfig field's default value, as a configuration's JSON holds it.
FIELD_DEFAULTS = {
    f.name: json.loads(json.dumps(f.default if f.default_factory is dataclasses.MISSING else f.default_factory()))
    for f in dataclasses.fields(RunConfig)
}
# The commit from which lorm-bench records in each cell the code that ran it: a cell without ``code`` is older.
CODE_RECORDED = "80d857a6aebda70ee9b058e4f58a2762bd571c25"


def code_version(root: Path = ROOT) -> dict | None:
    """``{"commit": ..., "changed": bool}`` of the git checkout the code runs from (``changed``: its
    tracked files differ from the commit), or ``None`` outside a checkout or without git."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True)
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        changed = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "changed": changed}


@functools.cache
def _this_commit() -> str | None:
    return (code_version() or {}).get("commit")


@functools.cache
def _includes(commit: str, change: str) -> bool | None:
    """Whether the code of ``commit`` holds the commit ``change`` (git ancestry); None where git cannot tell
    (no git, no checkout, or a commit it does not know)."""
    try:
        done = subprocess.run(
            ["git", "merge-base", "--is-ancestor", change, commit], cwd=ROOT, capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(done.returncode)


@functools.cache
def _setting_defaults() -> dict[str, dict[str, Any]]:
    """Every settings section's defaults in this code, as a configuration's JSON holds them."""
    return {name: json.loads(json.dumps(dataclasses.asdict(cls()))) for name, cls in sections().items()}


def _fields(config: dict) -> dict:
    """A stored configuration's fields by today's RunConfig: one it predates at its default (a field is added with
    the behaviour that was there before it), ``method`` under its earlier name too; without the run's name."""
    return {k: v for k, v in ({**FIELD_DEFAULTS, **current_keys(config)}).items() if k != "run_id"}


def _read_sections(values: dict) -> list[str]:
    """The settings sections a run of ``values`` (:func:`_fields`) reads: the data's and the model's; its method's own;
    the guard's, secure aggregation's and DP's where the run turns them on (a section this code cannot parse counts)."""
    set_values = values.get("settings") or {}
    read = [DataSettings.section, ModelSettings.section]
    own = registry().get(values.get("method", ""))
    if own is not None and own.settings is not None:
        read.append(own.settings.section)
    for optional in (RobustSettings, SecAggSettings, DpSettings):
        try:
            on = optional.parse(set_values.get(optional.section, {})).enabled
        except (ValueError, TypeError):
            on = True
        if on:
            read.append(optional.section)
    return read


def defaults_then(metrics: dict) -> dict[tuple[str, str], Any]:
    """The settings defaults of the code that ran a stored cell (its metrics) where they differ from this code's
    (``common.run.settings.DEFAULT_CHANGES``), by the cell's ``code`` record: this checkout's commit or a later one,
    none; an earlier one, the default it had; a cell from before the record began (no ``code``), the earlier
    default of each change made since; where git cannot tell (a commit it does not know, a cell that ran outside a
    checkout while this code runs in one), a value no configuration holds, so that the cell is no twin and a grid
    that would run it again says so."""
    code = metrics.get("code", dataclasses.MISSING)
    then: dict[tuple[str, str], Any] = {}
    for change in DEFAULT_CHANGES:
        if code is dataclasses.MISSING:  # older than the record: it predates every change made after it began
            held = False if _includes(change.commit, CODE_RECORDED) else None
        elif (code or {}).get("commit") == _this_commit():  # this code (outside git: both unrecorded)
            held = True
        else:
            held = _includes(code["commit"], change.commit) if code else None
        if held is not True:
            unknown = f"unknown (the default changed at {change.commit[:7]})"
            then[(change.section, change.key)] = change.before if held is False else unknown
    return then


def _comparable(config: dict, then: dict[tuple[str, str], Any] | None = None) -> dict:
    """A cell's configuration as cells are compared (a changed grid, a twin): :func:`_fields`, and each settings
    section the run reads (:func:`_read_sections`) whole, a setting the configuration leaves unset at the default
    of the code that ran it (``then``: :func:`defaults_then` of a stored cell; none for a configuration this code
    runs), without the settings that have no effect beside the others (``Settings.inert``, e.g. ``ridge.lambda_rule``
    of one head). A section the run does not read is left out: a default changed there changed nothing for it."""
    values = _fields(config)
    set_values = values.get("settings") or {}
    settings: dict[str, Any] = {}
    for name in _read_sections(values):
        section = {**_setting_defaults()[name], **{k: v for (s, k), v in (then or {}).items() if s == name}}
        mine = set_values.get(name, {})
        if not isinstance(mine, dict):  # not an object of settings: compared as it is
            settings[name] = mine
            continue
        section |= mine
        with contextlib.suppress(ValueError, TypeError):  # a value this code refuses (or an unknown one): all kept
            for key in sections()[name].parse(section).inert():
                section.pop(key, None)
        settings[name] = section
    for name in set(set_values) - set(sections()):  # a section this code does not know: compared as it is
        settings[name] = set_values[name]
    return values | {"settings": settings}


def stored_split_invariant(config: dict) -> bool:
    """``common.methods.split_invariant`` of a stored configuration (a cell's ``config``): false for a method this
    checkout no longer has."""
    values = _fields(config)
    return values.get("method") in registry() and split_invariant(RunConfig.from_dict(values))


def _twin_key(config: dict, then: dict[tuple[str, str], Any] | None = None) -> str:
    """A configuration as lorm-bench finds a twin to reuse, one comparable string: :func:`_comparable`, without
    ``beta`` where the figures are the same at every beta (:func:`stored_split_invariant`: a frozen head's sums
    are the same under any split of its samples)."""
    return _key(_comparable(config, then), config)


def _key(values: dict, config: dict) -> str:
    """:func:`_twin_key` of ``config`` from its :func:`_comparable` ``values``."""
    if stored_split_invariant(config):
        values = {k: v for k, v in values.items() if k != "beta"}
    return json.dumps(values, sort_keys=True)


def stored_twin_key(metrics: dict) -> str:
    """:func:`_twin_key` of a stored cell (its metrics), read with the defaults of the code that ran it."""
    return _twin_key(metrics.get("config", {}), defaults_then(metrics))


def _config_changes(stored: dict, planned: RunConfig) -> list[str]:
    """The fields (``settings.SECTION.KEY`` for a setting) in which a stored cell's configuration (its metrics)
    differs from the one planned for it; none where the cell is the planned one's twin (another beta's run)."""
    planned_config, stored_config = json.loads(planned.to_json()), stored.get("config", {})
    want, have = _comparable(planned_config), _comparable(stored_config, defaults_then(stored))
    if _key(have, stored_config) == _key(want, planned_config):  # a twin's copy: its run's beta, the same figures
        return []
    changed = sorted(k for k in set(want) | set(have) if k != "settings" and want.get(k) != have.get(k))
    for section in sorted(set(want["settings"]) | set(have["settings"])):
        mine, theirs = want["settings"].get(section, {}), have["settings"].get(section, {})
        if not (isinstance(mine, dict) and isinstance(theirs, dict)):
            changed += [f"settings.{section}"] if mine != theirs else []
            continue
        changed += [f"settings.{section}.{k}" for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    return changed


def finished_runs(out: Path) -> list[tuple[str, dict]]:
    """(name, metrics) of every cell in the folder that ran (not one reused from a twin), to reuse for a twin
    (:func:`_twin_key`: an identical configuration, as joint's at every beta, or a frozen head's at another beta):
    this grid's, and any from an earlier call with other methods or betas."""
    done = [
        (str(path.parent.relative_to(out / "cells")), json.loads(path.read_text()))
        for path in sorted((out / "cells").glob("*/*/*/metrics.json"))
    ]
    return [(name, m) for name, m in done if "config" in m and "reused_from" not in m]


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
                cmd = [sys.executable, "-m", "engine.benchmark", *child_argv(cell)]
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
