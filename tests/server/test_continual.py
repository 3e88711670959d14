"""EWC and LwF: the coordinator's anchor and merged Fisher, and the clients' terms on hand-computed cases."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_baselines import SPEC, N, fake_update

from client.methods.continual import distillation, ewc_penalty
from common.methods.ewc import EwcSettings
from common.run.config import RunConfig
from common.wire.instructions import DenseStep, Mode
from common.wire.messages import ANCHOR_HEAD, ClientUpdate, Phase
from common.wire.tensors import ANCHOR, DELTA, FISHER, HEAD_WEIGHT
from server.strategies import make_strategy

from updates import plan_update


def config(method: str, **settings) -> RunConfig:
    return RunConfig(
        num_clients=3,
        num_tasks=2,
        rounds_per_task=2,
        seed=1,
        method=method,
        settings={"ewc": settings} if settings else {},
    )


def fisher_update(plan, index: int, value: float) -> ClientUpdate:
    shapes = dict(SPEC.params) | {"head.weight": (SPEC.num_classes, SPEC.feature_dim), "head.bias": (SPEC.num_classes,)}
    return plan_update(
        plan,
        index,
        N[index],
        fisher={name: torch.full(shape, value, dtype=torch.float64) for name, shape in shapes.items()},
    )


def run_task(strategy, task: int, fisher_values=(1.0, 2.0, 3.0)) -> list:
    strategy.begin_task(task)
    plans = []
    for phase, round_ in strategy.steps(task):
        plan = strategy.configure(task, round_, phase)
        plans.append(plan)
        fold = strategy.fold(plan)
        agg = fold.aggregator
        for i in range(3):
            update = (
                fisher_update(plan, i, fisher_values[i])
                if phase == Phase.TASK_GRAM
                else fake_update(plan, i, seed=10 * task + 3 * round_ + i)
            )
            agg.fold(update)
        fold.finish()
    return plans


def test_ewc_merges_the_task_fisher_by_samples_and_decays_the_old_one():
    strategy = make_strategy(config("ewc", decay=0.5), SPEC)
    plans = run_task(strategy, 0)
    assert [p.phase for p in plans] == [Phase.TRAIN, Phase.TRAIN, Phase.TASK_GRAM]
    fisher_plan = plans[-1]
    step = fisher_plan.expect(DenseStep)
    assert step.send_fisher and not step.send_head and fisher_plan.mode == Mode.FULL
    delta = fisher_plan.named(DELTA)
    assert all(torch.equal(delta[n], strategy.delta[n]) for n in SPEC.params)  # the task's merged weights
    assert not plans[0].named(ANCHOR) and not plans[0].named(FISHER)  # the first task: nothing to keep
    mean = (10 * 1.0 + 15 * 2.0 + 20 * 3.0) / 45  # sample-weighted: estimators that average over samples
    for name, shape in SPEC.params.items():
        assert strategy.fisher[name].shape == shape and torch.allclose(strategy.fisher[name], torch.full(shape, mean))
    end_of_task_0 = dict(strategy.delta)
    plans = run_task(strategy, 1, fisher_values=(4.0, 4.0, 4.0))
    anchor, fisher = plans[0].named(ANCHOR), plans[0].named(FISHER)
    assert all(torch.equal(anchor[n], end_of_task_0[n]) for n in SPEC.params)  # the centre: task 0's end
    assert all(torch.allclose(fisher[n], torch.full(SPEC.params[n], mean)) for n in SPEC.params)
    for name, shape in SPEC.params.items():  # F <- decay F + F_task
        assert torch.allclose(strategy.fisher[name], torch.full(shape, 0.5 * mean + 4.0))


def test_ewc_with_the_reference_estimator_divides_summed_fishers_by_all_samples():
    strategy = make_strategy(dataclasses.replace(config("ewc"), fisher="reference"), SPEC)
    run_task(strategy, 0)
    expected = (1.0 + 2.0 + 3.0) / 45  # the paper's code: sum over clients of per-sample sums / samples
    assert torch.allclose(strategy.fisher["emb.weight"], torch.full((5, 4), expected))


def test_anchor_and_fisher_survive_a_restart():
    strategy = make_strategy(config("ewc"), SPEC)
    run_task(strategy, 0)
    strategy.begin_task(1)
    again = make_strategy(config("ewc"), SPEC)
    again.load_state_tensors(strategy.state_tensors())
    a, b = strategy.configure(1, 0, Phase.TRAIN), again.configure(1, 0, Phase.TRAIN)
    assert a.named(ANCHOR).keys() == b.named(ANCHOR).keys() == set(SPEC.params)
    assert all(
        torch.equal(a.named(ANCHOR)[n], b.named(ANCHOR)[n]) and torch.equal(a.named(FISHER)[n], b.named(FISHER)[n])
        for n in SPEC.params
    )


@pytest.mark.parametrize("method", ["lwf", "target"])
def test_a_teachers_anchor_is_the_previous_tasks_weights_and_head_fixed_through_the_task(method):
    strategy = make_strategy(config(method), SPEC)
    plans = run_task(strategy, 0)
    assert [p.phase for p in plans] == [Phase.TRAIN, Phase.TRAIN] and not plans[0].named(ANCHOR)
    end = dict(strategy.delta)
    head = (strategy.head_w.clone(), strategy.head_b.clone())
    plans = run_task(strategy, 1)
    anchors = [p.named(ANCHOR) for p in plans]
    assert set(anchors[1]) == set(SPEC.params) | set(ANCHOR_HEAD) and not plans[1].named(FISHER)
    assert all(torch.equal(anchors[1][n], end[n]) for n in SPEC.params)
    # the head moved in task 1's first round (its old rows too: the clients' updates change every row);
    # the teacher's head in the second round's plan is still task 0's
    assert not torch.equal(plans[1].get(HEAD_WEIGHT)[:2], plans[0].get(HEAD_WEIGHT)[:2])
    for key, value in zip(ANCHOR_HEAD, head):
        assert torch.equal(anchors[0][key], value) and torch.equal(anchors[1][key], value)
    again = make_strategy(config(method), SPEC)  # and it survives a restart
    again.load_state_tensors(strategy.state_tensors())
    assert all(torch.equal(again.anchor[k], strategy.anchor[k]) for k in strategy.anchor)
    old = {k: v for k, v in strategy.state_tensors().items() if k not in {f"anchor/{a}" for a in ANCHOR_HEAD}}
    with pytest.raises(ValueError, match="start the run again"):  # a state saved before the head was kept
        make_strategy(config(method), SPEC).load_state_tensors(old)


def test_ewc_penalty_value_and_gradient_by_hand():
    theta = {"w": torch.tensor([1.0, 2.0, -1.0], requires_grad=True), "v": torch.tensor([[0.5]], requires_grad=True)}
    centre = {"w": torch.tensor([0.0, 2.0, 1.0]), "v": torch.tensor([[0.0]])}
    fisher = {"w": torch.tensor([2.0, 5.0, 0.5]), "v": torch.tensor([[4.0]])}
    penalty = ewc_penalty(theta, centre, fisher, strength=3.0)
    # 3/2 * (2*1^2 + 5*0^2 + 0.5*(-2)^2 + 4*0.5^2) = 1.5 * (2 + 0 + 2 + 1) = 7.5
    assert penalty.item() == pytest.approx(7.5)
    penalty.backward()
    # d/dtheta = strength * F * (theta - centre)
    assert torch.allclose(theta["w"].grad, torch.tensor([6.0, 0.0, -3.0]))
    assert torch.allclose(theta["v"].grad, torch.tensor([[6.0]]))
    assert (
        EwcSettings().strength == 2.0
    )  # = the paper's code's ewc_lambda 1 (its gradient is 2 lambda F (theta - centre))


def test_lwf_distillation_target_and_loss_at_temperature_two():
    teacher = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    student = torch.tensor([[0.0, 0.0], [4.0, 0.0]], requires_grad=True)
    loss = distillation(student, teacher, temperature=2.0)
    # row 1: target softmax([1, 0]) = (e/(e+1), 1/(e+1)); the student's log-softmax of [0, 0] is -ln 2 per class
    # row 2: target (1/2, 1/2); the student's log-softmax of [2, 0] is (-ln(1+e^-2), -2 - ln(1+e^-2))
    row1 = math.log(2.0)
    row2 = -0.5 * (-math.log1p(math.exp(-2))) - 0.5 * (-2 - math.log1p(math.exp(-2)))
    assert loss.item() == pytest.approx((row1 + row2) / 2)
    loss.backward()
    # d/ds = (softmax(s/T) - target) / T / batch
    p = torch.softmax(student.detach() / 2, 1)
    target = torch.softmax(teacher / 2, 1)
    assert torch.allclose(student.grad, (p - target) / 2 / 2)
