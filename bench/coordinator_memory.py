"""Coordinator peak memory with 10, 100 and 1000 clients pushing ViT-B/16 LoRM B-round updates.

Each configuration runs in a fresh subprocess, so its peak RSS (``ru_maxrss``) is its own:

  in-process  a ``server.coordinator.Coordinator`` (one B-round of LoRM, r = 16, 48 ViT-B/16
              LoRA layers, 100-class head) receives N updates through ``submit`` calls in this
              process. Order "forward" (index 0..N-1: every update folds as it arrives) and
              "reverse" (N-1..0: every update waits on disk until index 0 arrives last, then
              all N fold from disk), the worst case for an implementation that buffered.
  grpc        the same coordinator behind ``server.service.create_server`` on 127.0.0.1:0;
              a separate load-generator process (so client memory is not counted) joins N
              clients, then K threads each pull the real plan and push an update through
              ``client.transport.CoordinatorClient``, concurrently and out of order.

Each update (B float32 per layer, diag Gram float64 per layer, head weight/bias float32,
768 x 768 float64 head Gram: 10.85 MB) is generated just before it is submitted and dropped
right after. Figures: RSS after import + setup ("base"), peak RSS (``ru_maxrss`` of the
coordinator's process) and its excess over base, seconds per update (wall / N), the last
submit (which merges and commits), and the staging bytes on disk when the round closes
(every staged file, measured by wrapping ``Store.stage_update`` from outside).

Run: .venv/bin/python bench/coordinator_memory.py [--sizes 10,100,1000] [--modes forward,reverse,grpc]
     [--grpc-max 100] [--malloc-arena-max 2] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.synthetic import LAYERS, make_update, update_bytes  # noqa: E402
from bench.synthetic import VIT_B16 as SPEC
from common.run.config import RunConfig  # noqa: E402
from common.wire.messages import ClientUpdate, Phase, RoundPlan  # noqa: E402

if TYPE_CHECKING:  # at run time imported where it is built (build_coordinator)
    from server.coordinator import Coordinator
    from server.store import Store

RANK = 16
UPDATE_BYTES = update_bytes(SPEC, RANK)
LOAD_THREADS = 4  # concurrent client threads in the gRPC load generator
WORKER_TIMEOUT_S = 1800  # one configuration may take at most this long


def config(n: int) -> RunConfig:
    return RunConfig(run_id="mem", num_clients=n, num_tasks=1, rounds_per_task=2, rank=RANK, seed=3)


def rss() -> int:
    return psutil.Process().memory_info().rss


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# ----------------------------------------------------------------------------- coordinator side


def build_coordinator(n: int, state: Path) -> tuple[Coordinator, list[int]]:
    """A coordinator with N joined and described clients; its open step is task 0 round 0 (B)."""
    from server.coordinator import Coordinator

    coordinator = Coordinator(config(n), state, on_event=lambda _: None)
    staged: list[int] = []  # bytes of each staged submission's files
    store = coordinator.store
    assert isinstance(store, Store)  # on disk: its staged files are measured
    original = store.stage_update

    def stage_and_measure(key: str, update: ClientUpdate, idempotency_key: str) -> None:
        original(key, update, idempotency_key)
        folder = store.root / "staging" / key
        i = update.client_index
        staged.append(sum((folder / f"{i}{ext}").stat().st_size for ext in (".safetensors", ".json")))

    # measured from outside, on this one store: wrapping the bound method is the point
    store.stage_update = stage_and_measure  # type: ignore[method-assign]
    return coordinator, staged


def worker_inprocess(n: int, order: str, state: Path) -> dict:
    coordinator, staged = build_coordinator(n, state)
    for i in range(n):
        coordinator.join(f"c{i}", i)
    for i in range(n):
        coordinator.describe(f"c{i}", SPEC)
    plan = coordinator.pull("c0")
    assert isinstance(plan, RoundPlan) and plan.instruction.factors() == "B", plan
    base = rss()
    indices = range(n) if order == "forward" else range(n - 1, -1, -1)
    start = time.perf_counter()
    last = 0.0
    for i in indices:
        update = make_update(plan, i, RANK)
        t0 = time.perf_counter()
        assert coordinator.submit(update, f"mem/0/0/{i}")
        last = time.perf_counter() - t0
        del update
    wall = time.perf_counter() - start
    step = coordinator.step
    assert step is not None and (step.task, step.round, step.phase) == (0, 1, Phase.TRAIN), "the B-round did not merge"
    return {
        "base": base,
        "peak": peak_rss(),
        "end": rss(),
        "wall": wall,
        "last": last,
        "staged": sum(staged),
        "staged_files": len(staged),
    }


def worker_grpc(n: int, state: Path) -> dict:
    from common.infra.tls import Security
    from server.service import create_server

    coordinator, staged = build_coordinator(n, state)
    server, port = create_server(coordinator, "127.0.0.1:0", security=Security(insecure=True))
    server.start()
    base = rss()
    start = time.perf_counter()
    try:
        load = subprocess.run(
            [sys.executable, __file__, "--load", f"127.0.0.1:{port}", "--clients", str(n)],
            capture_output=True,
            text=True,
            timeout=WORKER_TIMEOUT_S,
        )
        if load.returncode != 0:
            raise RuntimeError(f"load generator failed:\n{load.stderr[-3000:]}")
        wall = time.perf_counter() - start
        step = coordinator.step
        assert step is not None and (step.task, step.round) == (0, 1), "the B-round did not merge"
        client = json.loads(load.stdout.strip().splitlines()[-1])
    finally:
        server.stop(grace=1).wait()
    return {
        "base": base,
        "peak": peak_rss(),
        "end": rss(),
        "wall": wall,
        "last": float("nan"),
        "staged": sum(staged),
        "staged_files": len(staged),
        "client_peak": client["peak"],
    }


# ----------------------------------------------------------------------------- load generator


def load_generator(target: str, n: int) -> dict:
    """N clients: join + describe each, then pull the plan and push an update, K at a time."""
    from client.transport import CoordinatorClient
    from common.infra.tls import Security

    for i in range(n):
        client = CoordinatorClient(target, f"c{i}", security=Security(insecure=True))
        client.join(i)
        client.describe(SPEC)
        client.close()

    def one(i: int) -> None:
        client = CoordinatorClient(target, f"c{i}", security=Security(insecure=True))
        try:
            client.join(i)  # idempotent: sets the run id on this connection
            deadline = time.monotonic() + 300
            plan = client.pull()
            while not isinstance(plan, RoundPlan):  # bounded: every client has joined, so this is brief
                if time.monotonic() > deadline:
                    raise TimeoutError(f"client {i} got no plan in 300 s")
                time.sleep(plan.retry_after_s)
                plan = client.pull()
            update = make_update(plan, i, RANK)
            client.push(update, f"mem/0/0/{i}")
        finally:
            client.close()

    # Interleave from both ends so that submissions arrive out of index order.
    order = [i for pair in zip(range(n), range(n - 1, -1, -1)) for i in pair][:n]
    order = list(dict.fromkeys(order))
    with ThreadPoolExecutor(LOAD_THREADS) as pool:
        for future in [pool.submit(one, i) for i in order]:
            future.result()
    return {"peak": peak_rss()}


# ----------------------------------------------------------------------------- driver


def run_worker(mode: str, n: int, order: str, root: Path, arena_max: int) -> dict:
    state = Path(tempfile.mkdtemp(prefix=f"lorm-mem-{mode}-{n}-", dir=root))
    env = {**os.environ, **({"MALLOC_ARENA_MAX": str(arena_max)} if arena_max else {})}
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", mode, "--clients", str(n), "--order", order, "--state", str(state)],
            capture_output=True,
            text=True,
            timeout=WORKER_TIMEOUT_S,
            env=env,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{mode} N={n} failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--grpc-max", type=int, default=100, help="largest N also run through gRPC")
    parser.add_argument("--reverse-max", type=int, default=1000, help="largest N also run in reverse order")
    parser.add_argument("--modes", default="forward,reverse,grpc", help="which of forward, reverse, grpc to run")
    parser.add_argument(
        "--malloc-arena-max",
        type=int,
        default=0,
        help="set MALLOC_ARENA_MAX for the coordinator's process (0: glibc's default)",
    )
    parser.add_argument("--root", default=tempfile.gettempdir(), help="where the temporary state dirs go")
    parser.add_argument("--worker", choices=["inprocess", "grpc"])
    parser.add_argument("--load", metavar="TARGET")
    parser.add_argument("--clients", type=int)
    parser.add_argument("--order", default="forward", choices=["forward", "reverse", "mixed"])
    parser.add_argument("--state")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.load:
        print(json.dumps(load_generator(args.load, args.clients)))
        return 0
    if args.worker:
        state = Path(args.state)
        result = (
            worker_inprocess(args.clients, args.order, state)
            if args.worker == "inprocess"
            else worker_grpc(args.clients, state)
        )
        print(json.dumps(result))
        return 0

    root = Path(args.root)
    sizes = [int(s) for s in args.sizes.split(",")]
    free = shutil.disk_usage(root).free
    notes = []
    runs = []
    for n in sizes:
        need = int(n * UPDATE_BYTES * 1.1)
        if need > free * 0.5:
            scaled = max(10, int(free * 0.5 / (UPDATE_BYTES * 1.1)))
            notes.append(f"N={n} needs ~{need / 1e9:.1f} GB of staging, {free / 1e9:.1f} GB free: ran N={scaled}")
            n = scaled
        modes = args.modes.split(",")
        if "forward" in modes:
            runs.append(("inprocess", n, "forward"))
        if "reverse" in modes and n <= args.reverse_max:
            runs.append(("inprocess", n, "reverse"))
        if "grpc" in modes and n <= args.grpc_max:
            runs.append(("grpc", n, "mixed"))
    print(
        f"update: {UPDATE_BYTES / 1e6:.2f} MB of tensors; {len(LAYERS)} LoRA layers, r = {RANK}; "
        f"state under {root} ({free / 1e9:.0f} GB free); {os.cpu_count()} CPUs; "
        f"gRPC load: {LOAD_THREADS} client threads in a separate process; "
        f"MALLOC_ARENA_MAX={args.malloc_arena_max or 'default'}"
    )
    for note in notes:
        print("note:", note)
    header = (
        f"{'mode':10s} {'order':8s} {'N':>5s} {'base MB':>8s} {'peak MB':>8s} {'peak-base':>9s} "
        f"{'end MB':>7s} {'s/update':>8s} {'last s':>7s} {'staged GB':>9s} {'wall s':>7s}"
    )
    print(header)
    print("-" * len(header))
    for mode, n, order in runs:
        r = run_worker(mode, n, order, root, args.malloc_arena_max)
        last = "" if r["last"] != r["last"] else f"{r['last']:.2f}"
        print(
            f"{mode:10s} {order:8s} {n:5d} {r['base'] / 2**20:8.0f} {r['peak'] / 2**20:8.0f} "
            f"{(r['peak'] - r['base']) / 2**20:9.0f} {r['end'] / 2**20:7.0f} {r['wall'] / n:8.3f} {last:>7s} "
            f"{r['staged'] / 1e9:9.2f} "
            f"{r['wall']:7.1f}",
            flush=True,
        )
    print("MB = MiB of RSS; staged GB = 10^9 bytes on disk when the round closed (deleted at the merge's commit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
