"""The client halves of EWC and LwF on the tiny model: the penalty's centre and weights, and the
teacher, are the ones the plan hands out."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from client.methods.base import load_dense
from client.methods.continual import EwcTrainer, LwfTrainer, distillation, ewc_penalty
from client.runtime import build_runtime
from common.run.config import RunConfig
from common.wire.messages import ANCHOR_HEAD, Phase, RoundPlan
from common.wire.tensors import ANCHOR, FISHER, HEAD_BIAS, HEAD_WEIGHT, named_tensors
from server.strategies import make_strategy

BASE = dict(
    num_clients=2,
    num_tasks=2,
    rounds_per_task=1,
    local_epochs=1,
    lr=3e-2,
    threads=1,
    seed=3,
    extra={"synthetic_classes": 6, "synthetic_train": 12, "synthetic_test": 4},
)


def second_task_plan(method: str):
    config = RunConfig(**BASE, method=method)
    runtime = build_runtime(config)
    strategy = make_strategy(config, runtime.spec)
    strategy.begin_task(1)
    plan = strategy.configure(1, 0, Phase.TRAIN)
    gen = torch.Generator().manual_seed(5)
    params = runtime.spec.params
    anchor = {name: 0.01 * torch.randn(shape, generator=gen) for name, shape in params.items()}
    fisher = {name: torch.rand(shape, generator=gen) for name, shape in params.items()}
    if method != "ewc":  # a teacher's anchor holds the previous task's head, not the plan's (moving) one
        anchor |= {key: 0.1 * torch.randn(t.shape, generator=gen) for key, t in zip(ANCHOR_HEAD, plan_head(plan))}
    return runtime, with_named(with_named(plan, ANCHOR, anchor), FISHER, fisher if method == "ewc" else {})


def with_named(plan: RoundPlan, kind: str, named: dict[str, torch.Tensor]) -> RoundPlan:
    """``plan`` with ``named`` as its ``<kind>/<name>`` tensors (and none other of that kind)."""
    others = {name: t for name, t in plan.tensors.items() if not name.startswith(kind + "/")}
    return dataclasses.replace(plan, tensors=others | named_tensors(kind, named))


def plan_head(plan):
    weight, bias = plan.get(HEAD_WEIGHT), plan.get(HEAD_BIAS)
    assert weight is not None and bias is not None
    return weight, bias


def test_ewc_penalises_the_distance_to_the_plans_anchor_weighted_by_its_fisher():
    runtime, plan = second_task_plan("ewc")
    worker = runtime.worker(0, "c0")
    worker.model.to(worker.device)  # as a step does before loading its plan (a GPU when there is one)
    half = EwcTrainer()
    half.load(worker, plan)
    model = worker.model
    w0 = model.pristine()
    anchor, fisher = plan.named(ANCHOR), plan.named(FISHER)
    centre = {n: w0[n].cpu() + anchor[n] for n in fisher}
    params = {n: p.detach().cpu() for n, p in model.dense_params().items()}
    expected = ewc_penalty(params, centre, fisher, strength=2.0)
    no_labels = torch.zeros(1, dtype=torch.long)
    got = half.regulariser(worker, plan, {}, torch.zeros(1), no_labels)
    assert got is not None and torch.allclose(got.cpu(), expected) and got.item() > 0
    half.load(worker, with_named(plan, FISHER, {}))
    assert half.regulariser(worker, plan, {}, torch.zeros(1), no_labels) is None  # the first task: no penalty


def test_lwf_distils_the_old_classes_from_the_anchor_model_with_the_anchors_head():
    runtime, plan = second_task_plan("lwf")
    worker = runtime.worker(0, "c0")
    worker.model.to(worker.device)  # as a step does before loading its plan (a GPU when there is one)
    half = LwfTrainer()
    half.load(worker, plan)
    anchor = plan.named(ANCHOR)
    teacher = copy.deepcopy(worker.model)
    load_dense(teacher, anchor)
    with torch.no_grad():
        teacher.head.weight.copy_(anchor[ANCHOR_HEAD[0]])
        teacher.head.bias.copy_(anchor[ANCHOR_HEAD[1]])
    teacher.eval()
    lo = plan.class_range[0]
    assert lo > 0 and torch.equal(half.teacher.head.weight.cpu(), anchor[ANCHOR_HEAD[0]])
    assert torch.equal(half.teacher.head.bias.cpu(), anchor[ANCHOR_HEAD[1]])
    assert not torch.equal(
        half.teacher.head.weight.cpu(), plan.get(HEAD_WEIGHT)
    )  # not the plan's: it moves in the task
    inputs, labels = worker.train.batch(worker.shards[1][:4], worker.device)
    student = worker.model(inputs)[0]
    with torch.no_grad():
        target = teacher(inputs)[0][:, :lo]
    got = half.regulariser(worker, plan, inputs, student, labels)
    assert got is not None and torch.allclose(got, 0.5 * distillation(student[:, :lo], target, 2.0))
    for name, p in half.teacher.dense_params().items():  # W0 + anchor, not the step's W0 + delta
        assert torch.equal(p.cpu(), worker.model.pristine()[name].cpu() + anchor[name])
    half.load(worker, with_named(plan, ANCHOR, {}))
    assert half.regulariser(worker, plan, inputs, student, labels) is None
    headless = {k: v for k, v in anchor.items() if k not in ANCHOR_HEAD}
    with pytest.raises(ValueError, match="previous task's head"):
        half.load(worker, with_named(plan, ANCHOR, headless))
