"""One meta schema (server/run_state.py): what it writes, what it migrates, what it refuses."""

from __future__ import annotations

import json

import pytest
import torch
from test_coordinator import config, started, update_for
from test_validation import SPEC as FULL_SPEC
from test_validation import config as full_config

from common.run.metrics import AccuracyMatrix
from common.wire.messages import EvalReport, Phase, RoundPlan
from server.coordinator import Coordinator
from server.run_state import SCHEMA, RunMeta, State
from server.steps import open_step
from server.strategies import STRATEGIES, make_strategy

from unit_helpers import LORA_SPEC, valid_update


def drive(coord: Coordinator, steps: int | None = None) -> None:
    """Run the unit coordinator's 3 clients through ``steps`` steps (``None``: to the end)."""
    done = 0
    while coord.run.state == State.RUNNING and (steps is None or done < steps):
        plan = coord.pull("c0")
        assert isinstance(plan, RoundPlan), plan
        if plan.phase == Phase.EVALUATE:
            counts = plan.task + 1
            for i in range(3):
                coord.report_eval(EvalReport("unit", f"c{i}", i, plan.task, [5 + i] * counts, [10] * counts), f"e{i}")
        else:
            for i in range(3):
                coord.submit(update_for(plan, i, seed=plan.task), f"k{plan.task}/{plan.round}/{i}")
        done += 1


def generation(coord: Coordinator) -> tuple[dict, dict[str, torch.Tensor]]:
    saved = coord.store.latest()
    assert saved is not None
    return saved


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_meta_reads_back_as_written():
    meta = RunMeta(
        config(),
        State.RUNNING,
        (1, 2),
        AccuracyMatrix([[5]], [[10]]),
        [{"task": 0}],
        {"c0": 0},
        LORA_SPEC,
        12.5,
        3.25,
        2,
    )
    raw = json.loads(json.dumps(meta.to_json()))
    assert raw["schema"] == SCHEMA and RunMeta.from_json(raw) == meta


def test_the_coordinator_commits_before_it_opens_a_task(tmp_path):
    """The pointer names a step nothing of which has happened: at a task's first step, its tensors are the
    state the previous task left, not the new task's fresh factors."""
    coord = started(tmp_path)
    drive(coord, steps=4)  # task 0: train B, train A, task Gram, evaluate
    raw, tensors = generation(coord)
    assert raw["schema"] == SCHEMA and raw["pointer"] == [1, 0] and raw["state"] == "running"
    assert coord.step is not None and coord.step.task == 1  # open in memory, begun
    assert not same_state(tensors, coord.run.strategy.state_tensors())
    fresh = make_strategy(coord.config, LORA_SPEC)
    fresh.load_state_tensors(tensors)
    fresh.begin_task(1)
    assert same_state(fresh.state_tensors(), coord.run.strategy.state_tensors())


def test_the_coordinators_unversioned_meta_goes_on_as_the_run_would_have(tmp_path):
    """The coordinator's meta before schema 1, committed after opening the next step: its task begun."""
    straight = started(tmp_path / "straight")
    drive(straight)
    coord = started(tmp_path / "old")
    drive(coord, steps=4)
    raw, _ = generation(coord)
    old = {k: v for k, v in raw.items() if k not in ("schema", "seconds", "resumes")}
    coord.store.commit(old, coord.run.strategy.state_tensors())  # as it was written: task 1 begun
    resumed = Coordinator(config(), tmp_path / "old" / "state")
    assert resumed.run.pointer == (1, 0) and resumed.run.resumes == 1
    drive(resumed)
    assert resumed.run.state == State.DONE and resumed.run.history == straight.run.history
    assert resumed.run.matrix == straight.run.matrix
    assert same_state(resumed.run.strategy.state_tensors(), straight.run.strategy.state_tensors())
    assert generation(resumed)[0]["schema"] == SCHEMA  # written in the new schema from its first commit


def test_another_schema_is_refused_naming_it(tmp_path):
    coord = started(tmp_path)
    raw, tensors = generation(coord)
    coord.store.commit(raw | {"schema": 99}, tensors)
    with pytest.raises(ValueError, match=r"schema 99; this version reads schemas 1 to 2"):
        Coordinator(config(), tmp_path / "state")
    coord.store.commit({"config": raw["config"], "steps": 3}, tensors)
    with pytest.raises(ValueError, match="meta.json has no schema and is neither"):
        Coordinator(config(), tmp_path / "state")


def test_the_coordinator_refuses_the_engines_unversioned_meta(tmp_path):
    """The engine's meta before schema 1 names no model: the coordinator cannot build the strategy."""
    coord = started(tmp_path)
    drive(coord, steps=2)
    raw, tensors = generation(coord)
    old = {k: raw[k] for k in ("config", "pointer", "matrix", "history", "seconds", "resumes")}
    coord.store.commit(old, tensors)
    with pytest.raises(ValueError, match="no model description .*unversioned meta.*lorm-sim --state-dir"):
        Coordinator(config(), tmp_path / "state")


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_task_begun_again_on_its_begun_state_is_unchanged(name):
    """What lets the coordinator's unversioned meta at a task's first step go on: the task began before that
    commit and begins again when the step opens; every strategy's ``begin_task`` leaves such a state as it is."""
    cfg = full_config(method=name)
    strategy = make_strategy(cfg, FULL_SPEC)
    for index in range(len(strategy.steps(0))):  # task 0's steps, merged from valid updates
        step = open_step(strategy, cfg.rounds_per_task, 0, index)
        assert step.aggregator is not None
        for i in range(cfg.num_clients):
            step.aggregator.fold(valid_update(step.plan, step.aggregator.expected(), i, seed=10 * index + i))
        step.fold.finish()
    ended = strategy.state_tensors()
    strategy.begin_task(1)
    begun = strategy.state_tensors()
    for state in (ended, begun):  # resumed from the state before task 1 (schema 1), or after it began
        again = make_strategy(cfg, FULL_SPEC)
        again.load_state_tensors(state)
        again.begin_task(1)
        assert same_state(again.state_tensors(), begun)
