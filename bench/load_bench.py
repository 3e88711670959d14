"""N concurrent synthetic clients pushing LoRM updates through one coordinator process on loopback.

For each N: a real ``lorm-server`` process (``python -m server.main``, plaintext on
127.0.0.1, port 0, a fresh state directory) runs one task of LoRM for N clients. This
process is the load: N threads, each a ``client.transport.CoordinatorClient`` with its own
gRPC channel, join and describe (ViT-B/16 or a tiny model, ``bench/synthetic.py``), pull
the plan of round 0 (B), build their update (seeded by the client index), wait at a
barrier, then all push at once. The figures cover the pushes and the merge that the last
one triggers:

  bytes      tensor bytes of all N updates (``ClientUpdate.nbytes``; the wire adds ~0.1 %)
  wall       barrier -> the merged round is committed (the state directory, polled)
  rate       updates/s and MB/s (10^6 bytes) over that wall time
  RSS        the coordinator's resident memory from /proc: before the pushes (base) and its
             high-water mark VmHWM (peak), which covers start-up, joins, pushes and merge

Every update is accounted for: each push is acknowledged as new (not a duplicate), the
committed history says the step merged N clients, and the committed strategy tensors equal,
bit for bit, an in-process fold of the same N updates in client-index order.

Run: .venv/bin/python bench/load_bench.py [--clients 50,200] [--model vit|tiny] [--rank 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.synthetic import TINY, VIT_B16, make_update  # noqa: E402
from client.transport import Backoff, CoordinatorClient  # noqa: E402
from common.infra.tls import Security  # noqa: E402
from common.run.config import RunConfig  # noqa: E402
from common.wire.messages import (  # noqa: E402
    ModelSpec,
    Phase,
    Wait,  # noqa: E402
)
from server.store import Store  # noqa: E402
from server.strategies import make_strategy  # noqa: E402

MODELS = {"vit": VIT_B16, "tiny": TINY}
START_TIMEOUT_S = 120.0  # the coordinator must serve within this
PHASE_TIMEOUT_S = 600.0  # joins, pushes or the merge must finish within this
# torch threads of the coordinator and of the in-process fold: a reduction over more threads
# sums in another order, so bit-equality needs the same count on both sides.
THREADS = 1
POLL_S = 0.05


def config(n: int, rank: int) -> RunConfig:
    return RunConfig(run_id="load", num_clients=n, num_tasks=1, rounds_per_task=2, rank=rank, seed=3)


def proc_memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of process ``pid`` in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


class CoordinatorProcess:
    """``lorm-server`` for one run, in its own process and state directory."""

    def __init__(self, cfg: RunConfig, root: Path) -> None:
        (root / "config.json").write_text(cfg.to_json())
        self.state = root / "state"
        port_file = root / "port"
        self.log = open(root / "server.log", "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "server.main",
                "--config",
                str(root / "config.json"),
                "--state-dir",
                str(self.state),
                "--port",
                "0",
                "--port-file",
                str(port_file),
                "--insecure",
                "--linger",
                "0",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(THREADS)},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"coordinator did not start (exit {self.proc.poll()}): {(root / 'server.log').read_text()[-2000:]}"
                )
            time.sleep(POLL_S)
        self.target = f"127.0.0.1:{port_file.read_text()}"

    def memory(self) -> dict[str, int]:
        return proc_memory(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # state is on disk; it exits 130
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_clients(target: str, n: int, spec: ModelSpec, rank: int, on_barrier: Callable[[], None]) -> list:
    """N threads, one channel each: join, describe, pull the plan and build the update; then all push at once."""
    security = Security(insecure=True)
    barrier = threading.Barrier(n + 1, timeout=PHASE_TIMEOUT_S)
    updates: list = [None] * n
    acks: list = [None] * n
    errors: list[BaseException] = []

    def one(i: int) -> None:
        client = CoordinatorClient(target, f"c{i}", Backoff(give_up_s=PHASE_TIMEOUT_S), security=security)
        try:
            client.join(i)
            client.describe(spec)
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            plan = client.pull()
            while isinstance(plan, Wait):  # bounded: the round starts once all N have described
                if time.monotonic() > deadline:
                    raise TimeoutError(f"client {i} got no plan in {PHASE_TIMEOUT_S} s")
                time.sleep(plan.retry_after_s)
                plan = client.pull()
            assert (plan.task, plan.round, plan.instruction.factors()) == (0, 0, "B"), plan
            updates[i] = make_update(plan, i, rank, spec)
            barrier.wait()
            acks[i] = client.push(updates[i], f"load/0/0/{i}")  # True: a duplicate
        except BaseException as err:
            errors.append(err)
            barrier.abort()
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    on_barrier()
    for t in threads:
        t.join(PHASE_TIMEOUT_S)
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"{len(errors)} clients failed, {sum(t.is_alive() for t in threads)} hung: {errors[:3]}")
    if any(acks):
        raise AssertionError(f"{sum(map(bool, acks))} pushes were taken for duplicates")
    return updates


def inprocess_fold(cfg: RunConfig, spec: ModelSpec, updates: list) -> dict[str, torch.Tensor]:
    """The coordinator's steps for task 0, round 0, in this process: fold 0..N-1, merge, open round 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        return _fold(cfg, spec, updates)
    finally:
        torch.set_num_threads(threads)


def _fold(cfg: RunConfig, spec: ModelSpec, updates: list) -> dict[str, torch.Tensor]:
    strategy = make_strategy(cfg, spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.TRAIN)
    fold = strategy.fold(plan)
    for update in updates:
        fold.aggregator.fold(update)
    fold.finish()
    strategy.configure(0, 1, Phase.TRAIN)
    return strategy.state_tensors()


def measure(n: int, spec: ModelSpec, rank: int, root: Path) -> dict:
    cfg = config(n, rank)
    coordinator = CoordinatorProcess(cfg, root)
    marks: dict = {}
    try:

        def on_barrier() -> None:  # every client joined and described; no push yet
            marks["base"] = coordinator.memory()["VmRSS"]
            marks["start"] = time.perf_counter()

        updates = run_clients(coordinator.target, n, spec, rank, on_barrier)
        store = Store(coordinator.state)
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while not (saved := store.latest()) or not saved[0]["history"]:
            if time.monotonic() > deadline or coordinator.proc.poll() is not None:
                raise RuntimeError(f"round 0 did not merge (coordinator exit {coordinator.proc.poll()})")
            time.sleep(POLL_S)
        wall = time.perf_counter() - marks["start"]
        memory = coordinator.memory()
    finally:
        coordinator.stop()
    meta, tensors = saved
    expected = inprocess_fold(cfg, spec, updates)
    total = sum(u.nbytes for u in updates)
    differ = sorted(
        k
        for k in expected.keys() | tensors.keys()
        if k not in expected or k not in tensors or not torch.equal(expected[k], tensors[k])
    )
    return {
        "clients": n,
        "merged_clients": meta["history"][0]["clients"],
        "merged_equal": not differ,
        "differ": differ[:5],
        "bytes": total,
        "wall_s": wall,
        "updates_per_s": n / wall,
        "mb_per_s": total / 1e6 / wall,
        "base_rss": marks["base"],
        "peak_rss": memory["VmHWM"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="50,200", help="comma-separated client counts, one run each")
    parser.add_argument("--model", choices=sorted(MODELS), default="vit", help="update shapes")
    parser.add_argument("--rank", type=int, default=1, help="LoRA rank r")
    parser.add_argument("--root", default=tempfile.gettempdir(), help="where the temporary state dirs go")
    parser.add_argument("--json", action="store_true", help="one JSON line per run instead of a table")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    spec = MODELS[args.model]
    if not args.json:
        print(
            f"model {args.model} ({len(spec.layers)} LoRA layers), r = {args.rank}; {os.cpu_count()} CPUs; "
            "one coordinator process, one thread + channel per client in this process"
        )
        print(
            f"{'N':>5s} {'merged':>6s} {'equal':>5s} {'MB':>8s} {'wall s':>7s} {'upd/s':>7s} {'MB/s':>7s} "
            f"{'base MiB':>8s} {'peak MiB':>8s}"
        )
    for n in (int(s) for s in args.clients.split(",")):
        with tempfile.TemporaryDirectory(prefix=f"lorm-load-{n}-", dir=args.root) as root:
            r = measure(n, spec, args.rank, Path(root))
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print(
                f"{n:5d} {r['merged_clients']:6d} {str(r['merged_equal']):>5s} {r['bytes'] / 1e6:8.1f} "
                f"{r['wall_s']:7.2f} {r['updates_per_s']:7.1f} {r['mb_per_s']:7.1f} "
                f"{r['base_rss'] / 2**20:8.0f} {r['peak_rss'] / 2**20:8.0f}",
                flush=True,
            )
        if r["merged_clients"] != n or not r["merged_equal"]:
            print(
                f"N={n}: {r['merged_clients']} clients merged; state differing from the in-process fold: {r['differ']}",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
