"""A step's aggregator is the method's shared math: one pure factory of (plan, model spec, run config).

A client in a secure step masks its update folded into the step's aggregator, which it builds from the
plan it received, its model spec and the run's configuration (``common.aggregation.base.make_aggregator``), with
no strategy of its own: these tests hold that aggregator to the coordinator's at every step of two tasks,
after the coordinator's merges have moved its state on.
"""

from __future__ import annotations

import pytest
import torch

from common.aggregation.base import Aggregator, make_aggregator
from common.merges.sums import running_sums, summable
from common.methods import load_half, registry
from common.run.config import RunConfig
from common.wire.messages import ModelSpec, Phase, RoundPlan
from proto import codec
from server.strategies import make_strategy

from unit_helpers import valid_update

SPEC = ModelSpec(
    layers={"l1": (3, 4), "l2": (2, 3)},
    feature_dim=3,
    num_classes=6,
    params={"emb.weight": (5, 4), "l1.base.weight": (3, 4), "l1.base.bias": (3,), "l2.base.weight": (2, 3)},
)
CLIENTS = 3


def config(name: str) -> RunConfig:
    ridge = {"ridge": {"lambdas": [0.1, 1.0], "holdout": 4}} if "ridge" in name else {}
    return RunConfig(
        run_id="shared",
        method=name,
        num_clients=CLIENTS,
        num_tasks=2,
        rounds_per_task=2,
        rank=2,
        seed=3,
        settings=ridge,
    )


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_method_names_its_aggregator_factory_in_the_shared_layer(name):
    factory = load_half(registry()[name].aggregator, "common")

    assert callable(factory)
    with pytest.raises(ValueError, match="inside package 'server'"):
        load_half(registry()[name].aggregator, "server")


def test_an_unknown_method_has_no_aggregator():
    plan = make_strategy(config("lorm"), SPEC).configure(0, 0, Phase.TRAIN)

    with pytest.raises(ValueError, match=r"unknown method 'nope'; known: \[.*'lorm'"):
        make_aggregator(plan, SPEC, RunConfig(method="nope"))


@pytest.mark.parametrize("name", sorted(registry()))
def test_a_client_builds_the_coordinators_aggregator_from_the_plan_it_received(name):
    """The plan through the wire, the config through its JSON: the same aggregator type and declaration as the
    coordinator's, and the same running sums (bit for bit) from the same update."""
    cfg = config(name)
    strategy = make_strategy(cfg, SPEC)
    as_sent = RunConfig.from_json(cfg.to_json())
    checked = 0
    for task in range(2):
        strategy.begin_task(task)
        for phase, round_ in strategy.steps(task):
            plan = strategy.configure(task, round_, phase)
            received = codec.plan_from_proto(codec.plan_to_proto(plan))
            assert isinstance(received, RoundPlan)
            fold = strategy.fold(plan)
            coordinators, clients = fold.aggregator, make_aggregator(received, SPEC, as_sent)
            assert isinstance(clients, Aggregator) and type(clients) is type(coordinators)
            assert clients.expected() == coordinators.expected()
            updates = [
                valid_update(plan, coordinators.expected(), i, seed=100 * task + 10 * round_ + i) for i in range(3)
            ]
            clients.fold(updates[0])
            if summable(coordinators):
                alone = strategy.aggregator(plan)
                alone.fold(updates[0])
                want, got = running_sums(alone), running_sums(clients)
                assert want.keys() == got.keys()
                assert all(torch.equal(want[key], got[key]) for key in want), (name, phase)
            for update in updates:
                coordinators.fold(update)
            fold.finish()  # the next step's plan carries the merged state
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_step_a_method_plans_is_one_it_declares_and_every_declared_one_is_planned(name):
    """A client refuses a record-reading step whose (phase, instruction) pair its run's method does not declare
    (``Method.steps``): the declaration is exactly what the method's strategy plans over two tasks, and a method
    that trains privately calibrates its clients' noise with Grams exactly when its strategy sends them."""
    cfg = config(name)
    strategy = make_strategy(cfg, SPEC)
    planned = set()
    for task in range(2):
        strategy.begin_task(task)
        for phase, round_ in strategy.steps(task):
            plan = strategy.configure(task, round_, phase)
            planned.add((plan.phase.value, plan.instruction.KIND))
            fold = strategy.fold(plan)
            aggregator = fold.aggregator
            for i in range(2):
                aggregator.fold(valid_update(plan, aggregator.expected(), i, seed=10 * task + i))
            fold.finish()
    assert planned == set(registry()[name].steps)
    if registry()[name].dp_training:
        assert strategy.sends_grams == any(phase == "task_gram" for phase, _ in registry()[name].steps)
