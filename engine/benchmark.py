"""``lorm-bench``: a grid of runs (method x beta x seed) and the paper's kind of table.

Every cell runs into ``<out>/cells/<method>/beta<b>/seed<s>/``::

    metrics.json  the run's summary (accuracy matrix, FAA, forgetting, history, config) plus
                  method, beta, seed, mode, wall_seconds (of this invocation; the tables take a resumed
                  in-process cell's summed ``seconds``), bytes_per_client, command, machine, and
                  code (the commit of the code that ran it, and whether its tree had changes); in
                  process also peak_rss_bytes and device (where the clients trained: cpu, cuda)
    log.txt       the run's output;  error.txt  why the last attempt failed (if it did)
    run/          the run's own results directory (adapter, head, plot, TensorBoard), and in
                  distributed mode its config.json and the coordinator's state; in-process,
                  ``run/state`` while the cell runs (the run committed after every step)

A cell whose ``metrics.json`` exists is done: a second invocation skips it (resume). A cell cut
short (killed, failed, timed out) goes on from its last committed step when the grid runs it
again, if its configuration is unchanged (else it starts over): in process from the engine's
state, distributed from the coordinator's (with fresh client processes); the result is the
uninterrupted run's. A failed cell leaves ``error.txt`` and the grid goes on. Cells run one
after another, or with ``--jobs N`` up to N at a time, each in its own ``lorm-bench`` child process
(its output in the cell's ``bench.log``; a GPU host or many cores: give each cell one thread), the
same cells and results as one after another.

After the grid (or with ``--report-only``) ``<out>/results.md`` and ``results.csv`` hold one
row per (dataset, method, beta) over every finished cell, beside the paper's FAA where the paper
reports one; ``faa.png`` and ``accuracy_<beta>.png`` plot them.

``joint`` is the upper bound: the ``lorm`` strategy with one client that holds all the data and
one task with all the classes. Its cells of different betas are the same run (one client has
no split), so the first finished one is reused for the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from client.worker import resolve_device
from common.config import RunConfig, add_config_arguments, config_from_args, key_path, merged
from server.export import write_metrics
from server.launch import launch
from engine.simulation import run_inprocess, saved_config
from engine.benchmark_report import JOINT, _duration, _pct, cell_seconds, write_report
from server.strategies import STRATEGIES

# Keys the grid itself sets in every cell; a method configuration may not.
GRID_KEYS = ("strategy", "beta", "seed", "run_id")


def known_methods() -> list[str]:
    return sorted(STRATEGIES) + [JOINT]


def strategy_of(label: str) -> str:
    """The method a grid label names: ``NAME``, or ``NAME@VARIANT`` (the same method with the overrides the
    method config gives under the whole label, e.g. ``lorm-vera@appendix``); ``ValueError`` if unknown."""
    name, _, variant = label.partition("@")
    if name not in known_methods() or ("@" in label and not variant):
        raise ValueError(f"unknown method {label!r}; known: {known_methods()} (a variant: NAME@VARIANT)")
    return name


@dataclass(frozen=True)
class Cell:
    method: str
    beta: float
    seed: int
    config: RunConfig

    @property
    def name(self) -> str:
        return f"{self.method}/beta{self.beta}/seed{self.seed}"

    def dir(self, out: Path) -> Path:
        return out / "cells" / self.method / f"beta{self.beta}" / f"seed{self.seed}"


# ---------------------------------------------------------------------- planning the grid


def load_method_config(path: str | None) -> dict[str, dict[str, Any]]:
    """``{method: {key: value, "beta=<b>": {key: value}}}`` from a JSON file, checked."""
    if not path:
        return {}
    with open(path) as f:
        values = json.load(f)
    if not isinstance(values, dict):
        raise ValueError(
            f"--method-config {path}: expected a JSON object {{method: {{key: value}}}}, got {type(values).__name__}"
        )
    for method, overrides in values.items():
        try:
            strategy_of(method)
        except ValueError as err:
            raise ValueError(f"--method-config {path}: {err}") from None
        if not isinstance(overrides, dict):
            raise ValueError(f"--method-config {path}: {method}: expected an object, got {overrides!r}")
        for key, value in overrides.items():
            if key.startswith("beta="):
                _beta_of(key, path)
                if not isinstance(value, dict):
                    raise ValueError(f"--method-config {path}: {method}.{key}: expected an object, got {value!r}")
            keys = value if key.startswith("beta=") else {key: value}
            fixed = sorted(set(keys) & set(GRID_KEYS))
            if fixed:
                raise ValueError(f"--method-config {path}: {method}: {fixed} are set by the grid, not per method")
    return values


def _beta_of(key: str, path: str) -> float:
    try:
        return float(key.partition("=")[2])
    except ValueError:
        raise ValueError(f"--method-config {path}: expected 'beta=<number>', got {key!r}") from None


def cell_config(
    base: RunConfig, method: str, beta: float, seed: int, method_config: dict[str, dict[str, Any]]
) -> RunConfig:
    """Base < the method's overrides < its overrides for ``beta`` < the grid's (strategy, beta, seed)."""
    values = json.loads(base.to_json())
    overrides = method_config.get(method, {})
    # Objects (settings sections, legacy extra) merge key by key at any depth, never replace.
    values = merged(values, {k: v for k, v in overrides.items() if not k.startswith("beta=")})
    for key, per_beta in overrides.items():
        if key.startswith("beta=") and math.isclose(_beta_of(key, "method config"), beta):
            values = merged(values, per_beta)
    run_id = f"{base.run_id}-{method.replace('@', '-')}-b{beta}-s{seed}"
    values.update(strategy=strategy_of(method), beta=beta, seed=seed, run_id=run_id)
    if strategy_of(method) == JOINT:
        # One client holds everything, one task has every class; beta then splits nothing, so
        # it is pinned and the joint cells of all betas share one configuration (a variant,
        # joint@VARIANT, is the same upper bound with its own overrides, e.g. a learning rate).
        values.update(strategy="lorm", num_clients=1, num_tasks=1, task_sizes=[], beta=1.0)
    return RunConfig.from_dict(values)


def plan_grid(
    base: RunConfig, methods: list[str], betas: list[float], seeds: list[int], method_config: dict[str, dict[str, Any]]
) -> list[Cell]:
    return [Cell(m, b, s, cell_config(base, m, b, s, method_config)) for m in methods for b in betas for s in seeds]


def overridden_sets(base: RunConfig, cells: list[Cell], sets: list[str]) -> list[str]:
    """One line per cell where the method config sets a ``--set`` key to another value (it takes
    precedence: ``--set`` is the grid's base, the method config each method's own), so that a
    command-line value the grid does not use is never silent."""
    values = json.loads(base.to_json())
    per_cell = [(cell, json.loads(cell.config.to_json())) for cell in cells if strategy_of(cell.method) != JOINT]
    lines = []
    for key in dict.fromkeys(item.partition("=")[0] for item in sets):
        path = key_path(key)
        if path[0] in GRID_KEYS:
            continue
        wanted = _at(values, path)
        for cell, cell_values in per_cell:
            got = _at(cell_values, path)
            if got != wanted:
                lines.append(
                    f"--set {key}={json.dumps(wanted)} is overridden by --method-config for {cell.method} at "
                    f"beta {cell.beta:g}, seed {cell.seed}: {key}={json.dumps(got)}"
                )
    return lines


def _at(values: Any, path: list[str]) -> Any:
    for part in path:
        values = values.get(part) if isinstance(values, dict) else None
    return values


# ---------------------------------------------------------------------- running one cell


class CellTimeout(Exception):
    pass


@contextlib.contextmanager
def _alarm(seconds: float):
    """Raise :class:`CellTimeout` in the main thread after ``seconds`` (0: never)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum, frame):
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
        self._file = open(path, "a", buffering=1)  # line-buffered: a running cell shows its progress
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            if self._file is not None:
                self._file.write(text)
        return len(text)

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
                log=lambda line: sink.write(line + "\n"),
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


def _comparable(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "run_id"}


def _config_changes(stored: dict, planned: RunConfig) -> list[str]:
    want = _comparable(json.loads(planned.to_json()))
    have = _comparable(stored)
    return sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))


def finished_runs(out: Path) -> list[tuple[str, dict]]:
    """(name, metrics) of every cell in the folder that ran (not one reused from a twin), to reuse for an
    identical configuration (e.g. joint at every beta): this grid's, and any from an earlier call with
    other methods or betas."""
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
    seen = [_comparable(m["config"]) for _, m in finished_runs(out) if m.get("mode") == mode]
    todo: list[Cell] = []
    twins: dict[str, list[str]] = {}  # a started cell's name -> its unfinished twins' names
    for cell in cells:
        want = _comparable(json.loads(cell.config.to_json()))
        if (cell.dir(out) / "metrics.json").exists():
            continue
        if want not in seen:
            seen.append(want)
            todo.append(cell)
            twins[cell.name] = []
        else:
            first = next((c for c in todo if _comparable(json.loads(c.config.to_json())) == want), None)
            if first is not None:
                twins[first.name].append(cell.name)
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

    def exit_on(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on)
    return lambda: signal.signal(signal.SIGTERM, previous)


def run_grid(
    cells: list[Cell], out: Path, mode: str, timeout_s: float, extra: dict, say: Callable[[str], None] = print
) -> list[str]:
    """Run every unfinished cell in order; returns the names of the cells that failed."""
    failed: list[str] = []
    done = finished_runs(out)
    ran_seconds: list[float] = []
    for i, cell in enumerate(cells, 1):
        tag = f"[{i}/{len(cells)}] {cell.method} beta={cell.beta} seed={cell.seed}"
        path = cell.dir(out) / "metrics.json"
        if path.exists():
            metrics = json.loads(path.read_text())
            changed = _config_changes(metrics.get("config", {}), cell.config)
            note = (
                f"; WARNING: it ran with other values of {changed} than this grid would use "
                f"(delete its metrics.json to rerun it)"
                if changed
                else ""
            )
            say(f"{tag}: finished before, skipped (FAA {_pct(metrics.get('faa'))}){note}")
            continue
        want = _comparable(json.loads(cell.config.to_json()))
        twin = next(((name, m) for name, m in done if _comparable(m["config"]) == want and m.get("mode") == mode), None)
        if twin is not None:
            metrics = {**twin[1], "method": cell.method, "beta": cell.beta, "seed": cell.seed, "reused_from": twin[0]}
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


# ---------------------------------------------------------------------- command line


ROOT = Path(__file__).resolve().parents[1]


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


def machine_info() -> dict:
    """Cores, CPU model, GPU (or none), Python and torch versions of this machine."""
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "system": f"{platform.system()} {platform.machine()}",
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _csv(text: str, cast: Callable[[str], Any], what: str) -> list:
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            value = cast(item)
        except ValueError:
            raise ValueError(f"{what}: expected a list of {cast.__name__}, got {item!r}") from None
        if value not in values:
            values.append(value)
    if not values:
        raise ValueError(f"{what}: expected at least one value, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorm-bench",
        description="Run a grid of methods x betas x seeds and "
        "write the paper's kind of table (results.md, results.csv, plots).",
    )
    add_config_arguments(parser)
    # Lists: comma-separated, space-separated, or both (--betas 1.0,0.5 0.2).
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["lorm"],
        help=f"methods, comma- or space-separated (NAME or NAME@VARIANT, its overrides in --method-config): "
        f"{', '.join(known_methods())}",
    )
    parser.add_argument(
        "--betas", nargs="+", default=[], help="Dirichlet betas, comma- or space-separated (default: the config's beta)"
    )
    parser.add_argument(
        "--seeds", nargs="+", default=[], help="seeds, comma- or space-separated (default: the config's seed)"
    )
    parser.add_argument(
        "--mode",
        choices=sorted(RUNNERS),
        default="inprocess",
        help="inprocess: the in-process engine; distributed: coordinator + client processes",
    )
    parser.add_argument("--out", required=True, help="the grid's folder (cells/, results.md, results.csv, plots)")
    parser.add_argument("--method-config", default="", help='JSON {method: {key: value, "beta=<b>": {key: value}}}')
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds one cell may take (0: no limit)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the tables and plots from the cells")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="cells at a time, each in its own process (default 1: one after another, in this process); "
        "set threads=1 per cell (--set threads=1) so that N cells use N cores",
    )
    parser.add_argument(
        "--no-report", action="store_true", help="leave the tables and plots alone (what --jobs gives its children)"
    )
    return parser


def child_argv(args: argparse.Namespace, cell: Cell) -> list[str]:
    """The command line of a ``--jobs`` child: this grid's configuration, for ``cell`` alone, no report."""
    argv = ["--preset", args.preset] if args.preset else []
    argv += ["--config", args.config] if args.config else []
    for item in args.set:
        argv += ["--set", item]
    argv += ["--method-config", args.method_config] if args.method_config else []
    argv += ["--mode", args.mode, "--timeout", str(args.timeout), "--out", args.out, "--no-report"]
    return argv + ["--methods", cell.method, "--betas", str(cell.beta), "--seeds", str(cell.seed)]


def _command_line(argv: list[str] | None) -> str:
    if argv is None:
        argv = sys.argv[1:]
        prog = Path(sys.argv[0]).name
        prog = "python -m engine.benchmark" if prog in ("benchmark.py", "__main__.py") else prog
    else:
        prog = "python -m engine.benchmark"
    return " ".join([prog, shlex.join(argv)]).strip()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = _command_line(argv)
    out = Path(args.out)
    machine = machine_info()
    if args.report_only:
        if not (out / "cells").is_dir():
            parser.error(f"--report-only: no cells under {out / 'cells'}; run the grid first")
        write_report(out, command, machine)
        print(f"wrote {out / 'results.md'}, {out / 'results.csv'}", flush=True)
        return 0
    try:
        methods = _csv(",".join(args.methods), str, "--methods")
        for m in methods:
            strategy_of(m)
        base = config_from_args(args)
        betas = _csv(",".join(args.betas), float, "--betas") if args.betas else [base.beta]
        seeds = _csv(",".join(args.seeds), int, "--seeds") if args.seeds else [base.seed]
        cells = plan_grid(base, methods, betas, seeds, load_method_config(args.method_config))
        if args.jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    except (ValueError, OSError) as err:
        parser.error(str(err))
    for line in overridden_sets(base, cells, args.set):
        print(f"lorm-bench: {line}", file=sys.stderr, flush=True)
    print(
        f"lorm-bench: {len(cells)} cells ({len(methods)} methods x {len(betas)} betas x {len(seeds)} seeds), "
        f"{args.mode}, dataset {base.dataset}, into {out}",
        flush=True,
    )
    start = time.perf_counter()

    def say(line: str) -> None:
        print(line, flush=True)

    failed: list[str] = []
    if args.jobs > 1:
        failed = run_children(cells, out, args.mode, args.jobs, lambda cell: child_argv(args, cell), say=say)
        cells = [cell for cell in cells if cell.name not in failed]  # not again in this process
    failed += run_grid(
        cells, out, args.mode, args.timeout, {"command": command, "machine": machine, "code": code_version()}, say=say
    )
    if args.no_report:
        return 1 if failed else 0
    write_report(out, command, machine)
    print(
        f"lorm-bench: grid done in {_duration(time.perf_counter() - start)}; wrote {out / 'results.md'}, "
        f"{out / 'results.csv'}, {out / 'faa.png'}",
        flush=True,
    )
    if failed:
        print(f"lorm-bench: {len(failed)} cell(s) failed: {', '.join(failed)}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
