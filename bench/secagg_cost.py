"""What secure aggregation costs per step: bytes per client and wall time, on and off (issue 19).

For each training step of a method's first task (LoRM: the B-round and the A-round) on a real
model's shapes, ``K`` clients with made-up updates of the step's declared shapes:

- off: each client's update bytes; the coordinator's time to check and fold them all and merge;
- on: every round's bytes per client, sent and received (keys, sealed shares, masked input,
  unmask answer; the roster and inbox it receives), each client's time to compute its terms,
  share and mask, and the coordinator's time to add the masked inputs, rebuild the secrets of
  the survivors and dropped clients, unmask and merge.

Usage (the model's shapes from a preset; CLINC150 needs LORM_DATA_DIR)::

    python bench/secagg_cost.py --preset cpu-clinc150-quick --clients 10 100 --dropped 0.1

Prints one table row per (step, K); the figures in docs/BENCHMARKS.md come from it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from client.runtime import build_runtime
from common.config import RunConfig
from common.messages import ClientUpdate
from common.presets import preset
from common.settings import SecAggSettings
from common.tensors import (
    FACTOR,
    GRAM,
    HEAD_BIAS,
    HEAD_GRAM,
    HEAD_WEIGHT,
    parse_tensor_name,
    update_nbytes,
    with_tensors,
)
from server.secure import Timings, secure_step
from server.strategies import make_strategy

KEYS = 64  # two X25519 public keys
ENTRY = 4 + 64  # a roster entry: index and keys


def made_up_update(plan, shapes: dict, index: int, samples: int = 50) -> ClientUpdate:
    g = torch.Generator().manual_seed(index)
    tensors = {}
    for name, shape in shapes.items():
        kind, _, _ = parse_tensor_name(name)
        if kind == GRAM or name == HEAD_GRAM:
            x = torch.randn(samples, shape[0], generator=g, dtype=torch.float64)
            tensors[name] = x.T @ x if len(shape) == 2 else (x * x).sum(0)
        elif kind == FACTOR or name in (HEAD_WEIGHT, HEAD_BIAS):
            tensors[name] = torch.randn(shape, generator=g) * 1e-2
    base = ClientUpdate(plan.run_id, f"c{index}", index, plan.task, plan.round, plan.phase, samples, train_loss=1.0)
    return with_tensors(base, tensors)


def measure(config: RunConfig, spec, clients: int, dropped_share: float) -> list[dict]:
    settings = SecAggSettings(enabled=True)
    strategy = make_strategy(config, spec)
    strategy.begin_task(0)
    rows, seen = [], set()
    for phase, round_ in strategy.steps(0):
        plan = strategy.configure(0, round_, phase)
        kind = (phase, plan.train_factors)
        if kind in seen:  # a later B-round costs what the first did
            continue
        seen.add(kind)
        shapes = strategy.aggregator(plan).expected()
        updates = [made_up_update(plan, shapes, i) for i in range(clients)]
        # off: the coordinator checks and folds every update, then merges
        start = time.perf_counter()
        plain = strategy.aggregator(plan)
        for u in updates:
            plain.fold(u)
        strategy.aggregate(plan, plain)
        off_server = time.perf_counter() - start
        off_bytes = statistics.mean(update_nbytes(u) for u in updates)
        # on: every round, as the in-process engine runs them (the last clients drop after sharing)
        gone = tuple(range(clients - int(round(dropped_share * clients)), clients))
        secure, clock = strategy.aggregator(plan), Timings()
        server = secure_step(secure, strategy, dict(enumerate(updates)), settings, clients, gone, clock)
        survivors, dropped = server.close_inputs()
        start = time.perf_counter()
        strategy.aggregate(plan, secure)
        server_s = clock.server + time.perf_counter() - start
        sent = sum(server.received.values()) / clients
        box = len(next(iter(server.boxes[0].values())))
        received = ENTRY * clients + box * (clients - 1) + 4 * (clients + len(dropped))  # roster, inbox, request
        rows.append(
            {
                "step": f"{phase.value} {''.join(plan.train_factors)}",
                "clients": clients,
                "dropped": len(dropped),
                "off_bytes": off_bytes,
                "on_sent": sent,
                "on_received": received,
                "masked": 16 * server.size,
                "keys_and_shares": KEYS + box * (clients - 1),
                "off_server_s": off_server,
                "on_client_s": statistics.mean(clock.client[i] for i in survivors),
                "on_server_s": server_s,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cpu-clinc150-quick")
    parser.add_argument("--method", default="lorm")
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--dropped", type=float, default=0.1, help="share of clients that drop after sharing")
    args = parser.parse_args(argv)
    config = RunConfig(**(preset(args.preset) | {"strategy": args.method}))
    spec = build_runtime(config).spec
    print(
        f"{args.method} on {args.preset}: {len(spec.layers)} LoRA layers, head {spec.num_classes} x {spec.feature_dim}"
    )
    head = (
        "| step | K | dropped | off: bytes/client | on: sent/client | of which keys+shares | received/client "
        "| off: coordinator s | on: client s | on: coordinator s |"
    )
    print(head)
    print("|" + "---|" * 10)
    for k in args.clients:
        for r in measure(config, spec, k, args.dropped):
            print(
                f"| {r['step']} | {r['clients']} | {r['dropped']} | {r['off_bytes'] / 1e6:.3f} MB | "
                f"{r['on_sent'] / 1e6:.3f} MB | {r['keys_and_shares'] / 1e3:.1f} kB | "
                f"{r['on_received'] / 1e3:.1f} kB | "
                f"{r['off_server_s']:.2f} | {r['on_client_s']:.2f} | {r['on_server_s']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
