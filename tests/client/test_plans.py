"""What a client holds each plan and the coordinator's sizes to (client/plans.py): the run's method's steps, its own
cut of the tasks, a cap on evaluations per task, and caps on every size the coordinator chooses."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from client.plans import DEFAULT_CAPS, Caps, PlanCheck, PlanRefused, add_caps_arguments, caps_from_args, check_caps
from common.run.config import RunConfig
from common.wire.instructions import FeaturesStep, LoraStep
from common.wire.messages import Phase, RoundPlan

TASKS = [(0, 2), (2, 4)]


def plan(phase: Phase = Phase.TRAIN, task: int = 0, **changes: object) -> RoundPlan:
    lo, hi = TASKS[task]
    base = RoundPlan("run", phase, task, 0, (lo, hi), hi, LoraStep(train_factors=("B",)))
    return dataclasses.replace(base, **changes)


def test_a_step_the_method_never_plans_is_refused_naming_the_pair_and_its_steps():
    check = PlanCheck(RunConfig(run_id="run", method="lorm"), TASKS)
    check(plan())
    check(plan(Phase.TASK_GRAM))
    with pytest.raises(PlanRefused, match=r"phase 'features' with a 'lora' instruction, which method lorm never"):
        check(plan(Phase.FEATURES))
    with pytest.raises(PlanRefused, match=r"'features' instruction.*its steps: task_gram with lora, train with lora"):
        check(plan(instruction=FeaturesStep()))


def test_a_plan_of_another_run_task_or_classes_than_the_clients_own_cut_is_refused():
    check = PlanCheck(RunConfig(run_id="run"), TASKS)
    with pytest.raises(PlanRefused, match="names run 'other'"):
        check(plan(run_id="other"))
    with pytest.raises(PlanRefused, match="cut the run into 2 tasks"):
        check(dataclasses.replace(plan(), task=2))
    with pytest.raises(PlanRefused, match=r"says its classes are \[2, 4\].*task 0 holds head rows \[0, 2\)"):
        check(plan(class_range=(2, 4)))
    with pytest.raises(PlanRefused, match="of 9 seen"):
        check(plan(seen_classes=9))


def test_evaluations_of_one_task_beyond_the_cap_are_refused():
    """Each evaluation returns exact counts of right answers on the client's test split: a coordinator that asks
    them again and again gets the cap's worth, per task."""
    check = PlanCheck(RunConfig(run_id="run"), TASKS, Caps(max_evaluations=2))
    for _ in range(2):
        check(plan(Phase.EVALUATE))
    check(plan(Phase.EVALUATE, task=1))  # another task's model: its own count
    with pytest.raises(PlanRefused, match=r"evaluation 3 of task 0's model.*cap of 2 \(--max-evaluations\)"):
        check(plan(Phase.EVALUATE))


def test_sizes_above_the_caps_are_refused_by_name_and_the_caps_are_the_clients_flags():
    parser = argparse.ArgumentParser()
    add_caps_arguments(parser)
    caps = caps_from_args(parser.parse_args(["--max-size", "rp_dim=4096", "--max-evaluations", "3"]))
    assert caps.sizes["rp_dim"] == 4096 and caps.max_evaluations == 3
    check_caps(RunConfig(), caps)  # the defaults are far above every preset
    ridge = RunConfig(method="ridge", settings={"ridge": {"rp_dim": 5000}})
    with pytest.raises(PlanRefused, match="sets ridge.rp_dim=5000, above this client's cap of 4096"):
        check_caps(ridge, caps)
    with pytest.raises(PlanRefused, match="sets gram_passes=1000, above this client's cap of 100"):
        check_caps(RunConfig(gram_passes=1000), Caps())
    for bad in (["--max-size", "nonsense=1"], ["--max-size", "rank"], ["--max-evaluations", "0"]):
        with pytest.raises(PlanRefused):
            caps_from_args(parser.parse_args(bad))
    assert set(DEFAULT_CAPS) >= {"max_length", "batch_size", "local_epochs", "gram_passes", "threads", "rp_dim"}
