"""Which backbone a client trains on: ``W0 + s B A``, or ``W0 + extra + s B A`` when the plan says so."""

import dataclasses

import torch

from client.runtime import build_runtime
from common.run.config import RunConfig
from common.wire.instructions import LoraStep
from common.wire.messages import LowRank, Phase, RoundPlan
from common.wire.tensors import EXTRA, low_rank_tensors
from server.strategies import make_strategy

CONFIG = RunConfig(
    method="lorm-seq",
    num_clients=2,
    num_tasks=2,
    rounds_per_task=1,
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-2,
    threads=1,
    seed=3,
    extra={"synthetic_classes": 6, "synthetic_train": 12, "synthetic_test": 4},
)


def with_extra(plan: RoundPlan, extra: dict[str, LowRank], **instruction) -> RoundPlan:
    """``plan`` with ``extra`` as its frozen delta (and the instruction's fields ``instruction`` changed)."""
    others = {name: t for name, t in plan.tensors.items() if not name.startswith(EXTRA + "/")}
    step = dataclasses.replace(plan.expect(LoraStep), **instruction)
    return dataclasses.replace(plan, instruction=step, tensors=others | low_rank_tensors(EXTRA, extra))


def train_loss(worker, plan) -> float:
    update = worker.update(plan)
    assert update.phase == Phase.TRAIN
    return update.train_loss


def test_train_extra_puts_the_frozen_delta_under_training():
    runtime = build_runtime(CONFIG)
    strategy = make_strategy(CONFIG, runtime.spec)
    strategy.begin_task(1)
    plan = strategy.configure(1, 0, Phase.TRAIN)
    assert plan.expect(LoraStep).train_extra
    gen = torch.Generator().manual_seed(0)
    big = {
        name: LowRank(torch.randn(d_out, 2, generator=gen), torch.randn(2, d_in, generator=gen))
        for name, (d_out, d_in) in runtime.spec.layers.items()
    }  # an earlier task's residual, made large
    worker = runtime.worker(0, "c0")
    on_w0 = train_loss(worker, with_extra(plan, {}))
    trained_on_extra = train_loss(worker, with_extra(plan, big))
    ignored = train_loss(worker, with_extra(plan, big, train_extra=False))
    assert ignored == on_w0  # without the flag the extra delta is for Gram passes and evaluation only
    assert trained_on_extra != on_w0  # with it, the same seeds train a different network
