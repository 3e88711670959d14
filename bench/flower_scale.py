"""One run on the in-process engine (``lorm-sim``) and on Flower's simulation engine, side by side: wall time, the
peak memory of each engine's whole process tree, the bytes per client, and whether the two agree.

    python bench/flower_scale.py --preset cpu-clinc150-full --set method=ridge --set num_clients=1000 --cpus 2
    python bench/flower_scale.py --preset cpu-clinc150-quick --set num_clients=100 --cpus 2

Each engine runs in a child process of its own, one after the other, and a sampler here sums the resident memory
of that child and all its descendants (Ray's raylet, GCS and workers for Flower) every 0.2 s; the peak is the
largest sum. Bytes per client: what the coordinator's history counts as each client's upload (the tensors of its
updates, the same on both engines), and on Flower the protobuf bytes of every plan sent and every answer received,
over the run's clients. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = 4096


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every descendant, from /proc (0 for what ended meanwhile)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        p = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(p)  # field 4 of stat: the parent's pid
        rss[p] = int(fields[21]) * PAGE  # field 24: resident pages
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack.extend(children.get(p, []))
    return total


def measured(engine: str, argv: list[str], cpus: int) -> dict[str, Any]:
    """``engine``'s run of ``argv`` in a child process: its JSON figures, wall time and tree's peak memory."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        cmd = [sys.executable, __file__, "--engine", engine, "--out", out.name, "--cpus", str(cpus), *argv]
        start = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=ROOT)
        peak, done = 0, threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.2):
                peak = max(peak, tree_rss(child.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = child.wait()
        done.set()
        sampler.join()
        if code != 0:
            raise SystemExit(f"the {engine} run exited {code}")
        figures = json.loads(Path(out.name).read_text())
    return {**figures, "wall_s": round(time.perf_counter() - start, 1), "peak_memory_gb": round(peak / 1e9, 2)}


def run_one(engine: str, argv: list[str], cpus: int) -> dict[str, Any]:
    """The run itself, in this (child) process."""
    from common.methods.checks import validate
    from common.run.arguments import add_config_arguments
    from common.run.schedule import add_schedule_arguments, config_with_schedule

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    add_schedule_arguments(parser)
    config = validate(config_with_schedule(parser.parse_args(argv)))
    start = time.perf_counter()
    figures: dict[str, Any] = {}
    if engine == "in-process":
        from engine.simulation import run_inprocess

        result = run_inprocess(config)
        history, matrix = result.history, result.matrix
    else:
        from flower.simulation import simulate

        relay = simulate(config, cpus=cpus)
        history, matrix = relay.coord.run.history, relay.coord.run.matrix
        figures["flower_bytes_per_client"] = {
            "plans_sent": round(relay.bytes_sent / config.num_clients),
            "answers_received": round(relay.bytes_received / config.num_clients),
        }
    return {
        **figures,
        "run_s": round(time.perf_counter() - start, 1),
        "upload_bytes_per_client": round(sum(h.get("bytes_per_client", 0) for h in history)),
        "faa": round(matrix.summary()["faa"], 2),
        "correct": matrix.correct,
        "total": matrix.total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("in-process", "flower"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", type=int, default=1, help="Flower: ClientApps at a time (Ray's CPUs)")
    args, run_argv = parser.parse_known_args(argv)
    if args.engine:  # the child: one engine's run
        Path(args.out).write_text(json.dumps(run_one(args.engine, run_argv, args.cpus)))
        return 0
    native = measured("in-process", run_argv, args.cpus)
    flower = measured("flower", run_argv, args.cpus)
    same = native["correct"] == flower["correct"] and native["total"] == flower["total"]
    for figures in (native, flower):
        del figures["correct"], figures["total"]
    print(
        json.dumps({"args": run_argv, "cpus": args.cpus, "counts_equal": same, "in_process": native, "flower": flower})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
