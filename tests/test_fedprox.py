"""FedProx (``fedprox``), a method added as a slice in three files: its proximal term pulls a client's trained
parameters to the global ones by ``mu``, which the coordinator hands out in the step's instruction; with
``mu = 0`` it is FedAvg-LoRA exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from client.runtime import build_runtime
from common.methods import method
from common.methods.fedprox import FedProxStep
from common.run.config import RunConfig
from common.wire.instructions import LoraStep
from common.wire.messages import Phase, RoundPlan
from common.wire.tensors import FACTOR, HEAD_BIAS, HEAD_WEIGHT, LORA
from engine.simulation import run_inprocess
from proto import codec
from server.strategies import make_strategy

BASE = dict(
    num_clients=2,
    num_tasks=2,
    rounds_per_task=2,
    local_epochs=2,
    lr=3e-2,
    lr_lora=3e-2,
    threads=1,
    seed=3,
    extra={"synthetic_classes": 6, "synthetic_train": 12, "synthetic_test": 4},
)


def first_plan(strategy: str, **settings: float) -> tuple[RoundPlan, object]:
    config = RunConfig(**BASE, method=strategy, settings={"fedprox": settings} if settings else {})
    runtime = build_runtime(config)
    server = make_strategy(config, runtime.spec)
    server.begin_task(0)
    return server.configure(0, 0, Phase.TRAIN), runtime.worker(0, "c0")


def moved(plan: RoundPlan, worker, mu: float) -> float:
    """How far the client's trained factors and head end from the plan's, squared, with ``mu`` in its plan."""
    plan = dataclasses.replace(plan, instruction=dataclasses.replace(plan.expect(FedProxStep), mu=mu))
    update = worker.update(plan)
    start = plan.low_rank(LORA)
    distance = sum(
        float((parts["B"] - start[layer].b).square().sum() + (parts["A"] - start[layer].a).square().sum())
        for layer, parts in update.by_layer(FACTOR).items()
    )
    for name in (HEAD_WEIGHT, HEAD_BIAS):
        distance += float((update.tensors[name] - plan.tensors[name]).square().sum())
    return distance


def test_the_plan_carries_mu_from_the_settings_as_fedproxs_own_instruction_over_the_wire():
    plan, _ = first_plan("fedprox", mu=0.25)
    assert plan.expect(FedProxStep) == FedProxStep(train_factors=("B", "A"), mu=0.25)
    got = codec.plan_from_proto(codec.plan_to_proto(plan))
    assert isinstance(got, RoundPlan) and got.instruction == plan.instruction
    assert method("fedprox").settings is not None and method("fedprox").declare is None  # LoRA's declaration


def test_the_proximal_term_keeps_the_trained_parameters_nearer_the_global_ones_the_larger_mu():
    plan, worker = first_plan("fedprox")
    free, held, pinned = (moved(plan, worker, mu) for mu in (0.0, 10.0, 1000.0))
    assert free > held > pinned > 0.0


def test_with_mu_zero_a_clients_update_is_fedavg_loras_bit_for_bit():
    prox, worker = first_plan("fedprox", mu=0.0)
    plain, plain_worker = first_plan("fedavg-lora")  # the same model, data and shard: one seed
    assert isinstance(plain.instruction, LoraStep) and not isinstance(plain.instruction, FedProxStep)
    assert prox.tensors.keys() == plain.tensors.keys()
    got, want = worker.update(prox), plain_worker.update(plain)
    assert got.tensors.keys() == want.tensors.keys()
    for name, tensor in want.tensors.items():
        assert torch.equal(got.tensors[name], tensor), name
    assert got.train_loss == want.train_loss


@pytest.mark.parametrize("mu", [-1.0, float("nan")])
def test_a_negative_or_non_finite_mu_is_refused_by_the_settings_and_the_instruction(mu):
    with pytest.raises(ValueError, match="mu"):
        RunConfig(**BASE, method="fedprox", settings={"fedprox": {"mu": mu}}).section(method("fedprox").settings)
    with pytest.raises(ValueError, match="mu"):
        FedProxStep(train_factors=("B", "A"), mu=mu)


def test_a_whole_run_in_process_learns():
    result = run_inprocess(RunConfig(**BASE, method="fedprox", settings={"fedprox": {"mu": 0.1}}))
    assert [e["phase"] for e in result.history] == ["train", "train", "evaluate"] * 2
    correct, total = result.matrix.correct[-1], result.matrix.total[-1]
    assert sum(correct) / sum(total) > 1 / 6  # above chance over the 6 classes
