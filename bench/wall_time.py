"""Wall time of one small run, distributed (1 coordinator + 3 client processes) vs in-process.

The same RunConfig (tiny-bert on synthetic-text, 3 clients, 2 tasks, 3 rounds per task,
threads = 1 per process) runs

  distributed  ``engine.launch.launch``: a ``lorm-server`` process and 3 ``lorm-client``
               processes on 127.0.0.1; timed from the call to its return, so it includes
               every process's start-up (interpreter, imports, model build) and the
               coordinator's linger until all clients have learnt the run is over;
  in-process   ``engine.simulation.run_inprocess`` in a process whose imports are done;
               timed around the call (it includes building the model and data once).

Every measurement runs in a fresh subprocess, the two modes interleaved (so both see the
same background load on a shared machine), on both CPUs (the clients of the distributed run
then train in parallel, which the in-process engine never does) and with every process
pinned to CPU 0 (the same compute on both sides, so the difference is the system's
overhead). Figures per cell: the fastest and the median wall time; the distributed run
"without start-up", from the coordinator's "all clients joined" log line to its "done"
line; and CPU seconds summed over every process of the run. Every run must report the same
correct/total counts, hence the same FAA.

Separately: the start-up cost of one process, i.e. interpreter + ``import torch`` +
transformers' BERT, and the full import of ``client.main`` / ``server.main``.

Run: .venv/bin/python bench/wall_time.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.run.config import RunConfig  # noqa: E402

CONFIG = RunConfig(
    run_id="walltime",
    dataset="synthetic-text",
    backbone="tiny-bert",
    num_clients=3,
    num_tasks=2,
    rounds_per_task=3,
    local_epochs=3,
    rank=2,
    lr=3e-2,
    lr_lora=1e-3,
    threads=1,
    seed=5,
    device="cpu",
    extra={"synthetic_classes": 12, "synthetic_train": 400, "synthetic_test": 40},
)
GOAL = 1.15
RUN_TIMEOUT_S = 900


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def log_time(lines: list[str], marker: str) -> float:
    """The timestamp (seconds since the epoch) of the first coordinator log line containing ``marker``."""
    for line in lines:
        if marker in line:
            stamp = " ".join(line.split()[:2])  # logging's asctime: 2025-01-01 12:00:00,123
            return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise RuntimeError(f"no coordinator log line containing {marker!r}")


def one_distributed() -> dict:
    from engine.launch import launch

    with tempfile.TemporaryDirectory(prefix="lorm-wall-") as tmp:
        run_dir = Path(tmp)
        config_path = run_dir / "config.json"
        config_path.write_text(CONFIG.to_json())
        with open(run_dir / "log.txt", "w") as log, contextlib.redirect_stdout(log):
            start = time.perf_counter()
            rc = launch(
                config_path,
                CONFIG.num_clients,
                run_dir / "state",
                run_dir / "results",
                RUN_TIMEOUT_S,
                quiet_clients=True,
            )
            seconds = time.perf_counter() - start
        lines = (run_dir / "log.txt").read_text().splitlines()
        if rc != 0:
            raise RuntimeError(f"launch returned {rc}:\n" + "\n".join(lines[-40:]))
        metrics = json.loads((run_dir / "results" / "metrics.json").read_text())
    # From the moment every client has joined and described its model to the end of the run:
    # the distributed run without process start-up, comparable to run_inprocess.
    running = log_time(lines, "clients joined: task 0 starts")
    done = log_time(lines, "done: FAA")
    return {
        "seconds": seconds,
        "running": done - running,
        "cpu": cpu_seconds(resource.RUSAGE_CHILDREN),
        "faa": metrics["faa"],
        "correct": metrics["correct"],
        "total": metrics["total"],
    }


def one_inprocess() -> dict:
    from engine.simulation import run_inprocess

    cpu0, start = cpu_seconds(resource.RUSAGE_SELF), time.perf_counter()
    result = run_inprocess(CONFIG)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "running": seconds,
        "cpu": cpu_seconds(resource.RUSAGE_SELF) - cpu0,
        "faa": result.matrix.faa(),
        "correct": result.matrix.correct,
        "total": result.matrix.total,
    }


def measure(mode: str, cpus: str) -> dict:
    """One run of ``mode`` in a fresh subprocess restricted to ``cpus`` (e.g. "0" or "0,1")."""
    proc = subprocess.run(
        [sys.executable, __file__, "--one", mode, "--cpus", cpus],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + 60,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} on CPUs {cpus} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def startup_seconds(code: str, repeats: int = 3) -> float:
    """Median wall time of ``python -c code`` (interpreter start + imports), after one warm-up run."""
    cmd = [sys.executable, "-c", code]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=120)  # warm the page cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=120)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", choices=["distributed", "inprocess"])
    parser.add_argument("--cpus", default="")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode and CPU set")
    args = parser.parse_args()
    if args.one:
        if args.cpus:
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})  # inherited by launched processes
        print(json.dumps(one_distributed() if args.one == "distributed" else one_inprocess()))
        return 0

    cpus_all = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    print(f"config: {CONFIG.to_json()}")
    print(
        f"machine: {os.cpu_count()} CPUs, no GPU, shared with other work; load average at start "
        f"{os.getloadavg()[0]:.1f}; {args.repeats} runs per cell, modes interleaved\n"
    )
    header = (
        f"{'CPUs':6s} {'mode':12s} {'wall min s':>10s} {'wall med s':>10s} {'w/o start-up s':>14s} "
        f"{'CPU s':>7s} {'FAA':>8s}"
    )
    print(header)
    print("-" * len(header))
    ratios = []
    all_runs = []
    for cpus in (cpus_all, "0"):
        runs: dict[str, list[dict]] = {"inprocess": [], "distributed": []}
        for _ in range(args.repeats):  # interleaved, so both modes see the same background load
            for mode in runs:
                runs[mode].append(measure(mode, cpus))
        for mode, rs in runs.items():
            walls = [r["seconds"] for r in rs]
            print(
                f"{cpus:6s} {mode:12s} {min(walls):10.1f} {statistics.median(walls):10.1f} "
                f"{min(r['running'] for r in rs):14.1f} {statistics.median(r['cpu'] for r in rs):7.1f} "
                f"{rs[0]['faa']:8.4f}",
                flush=True,
            )
        best = {mode: min(r["seconds"] for r in rs) for mode, rs in runs.items()}
        running = {mode: min(r["running"] for r in rs) for mode, rs in runs.items()}
        ratios.append((cpus, best["distributed"] / best["inprocess"], running["distributed"] / running["inprocess"]))
        all_runs += runs["inprocess"] + runs["distributed"]
    same = all((r["correct"], r["total"]) == (all_runs[0]["correct"], all_runs[0]["total"]) for r in all_runs)
    print(f"\nevery run's correct/total counts identical (hence the same FAA): {same}")
    for cpus, wall_ratio, running_ratio in ratios:
        flag = "" if wall_ratio <= GOAL else f"  (goal <= {GOAL})"
        print(
            f"CPUs {cpus}: distributed / in-process wall (min) {wall_ratio:.3f}{flag}; "
            f"without start-up {running_ratio:.3f}"
        )
    print(f"load average at end {os.getloadavg()[0]:.1f}")

    print("\nper-process start-up (median of 3, after a warm-up):")
    for label, code in (
        ("python -c pass", "pass"),
        ("import torch", "import torch"),
        ("import torch + transformers BertModel", "import torch; from transformers import BertModel"),
        (
            "import client.main (lorm-client)",
            "import client.main, client.worker, client.backbones; from transformers import BertModel",
        ),
        ("import server.main (lorm-server)", "import server.main, server.strategies"),
    ):
        print(f"  {label:40s} {startup_seconds(code):6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
