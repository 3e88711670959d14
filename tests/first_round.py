"""A client's update of a task's first training round, planned as the coordinator plans it, on a tiny
synthetic run (the client tests that check what one update carries)."""

from __future__ import annotations

from client.runtime import build_runtime
from common.run.config import RunConfig
from common.wire.messages import Phase
from server.strategies import make_strategy

TINY = dict(
    num_clients=2,
    num_tasks=2,
    rounds_per_task=1,
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-2,
    threads=1,
    seed=3,
    extra={"synthetic_classes": 6, "synthetic_train": 8, "synthetic_test": 4},
)


def first_update(config: RunConfig, task: int = 0):
    """Client 0's update of ``task``'s first training round, its worker (holding the trained model) and
    the round's plan."""
    runtime = build_runtime(config)
    strategy = make_strategy(config, runtime.spec)
    strategy.begin_task(task)
    plan = strategy.configure(task, 0, Phase.TRAIN)
    worker = runtime.worker(0, "c0")
    return worker.update(plan), worker, plan
