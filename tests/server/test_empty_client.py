"""A client on its own data that holds none of a task's classes: it takes part in every step of the
task with an update of zero samples, which adds nothing. Each method's state after every step of that task
is the same, bit for bit, whether its update is folded or not, with the robust mode off or on (it is kept
out of the medians, not refused); and an update of zero samples that carries something is refused."""

from __future__ import annotations

import pytest
import torch

from client.owned import client_files
from client.runtime import owned_runtimes
from common.run.config import RunConfig
from common.run.partition import dirichlet_partition
from common.run.presets import preset
from common.run.schedule import class_schedule
from common.run.settings import RobustSettings
from common.wire.messages import ClientUpdate, EvalReport, Phase
from common.wire.tensors import HEAD_GRAM
from engine.simulation import run_inprocess
from server.robust import screen_and_fold
from server.steps import merge, open_step, schedule
from server.strategies import make_strategy

from own_data import by_label, own_text_rows, owned_config, write_rows

EMPTY = 3  # holds only task 1's classes


def four_clients(folder):
    """Clients 0-2: a third of own-text's rows of every scheduled class each; client 3: task 1's classes only
    (the test split's rows of greeting and music)."""
    train, test = by_label(own_text_rows("train")), by_label(own_text_rows("test"))
    for i in range(3):
        rows = [(text, label) for label in ("alarm", "balance", "greeting", "music") for text in train[label][i::3]]
        write_rows(folder / f"client{i}.csv", rows)
    write_rows(folder / f"client{EMPTY}.csv", [(t, label) for label in ("greeting", "music") for t in test[label]])
    return folder


def config_of(folder, method: str, robust: bool):
    config = owned_config(folder, method=method, num_clients=4)
    if robust:
        config = config.replace(settings={**config.settings, "robust": {"enabled": True, "min_clients": 3}})
    return config


def fold(config, step, updates: dict[int, ClientUpdate]) -> dict:
    """The engine's fold policies, over the updates given (by client index)."""
    if config.section(RobustSettings).enabled:
        for update in updates.values():
            step.aggregator.check(update)
        return screen_and_fold(config.section(RobustSettings), step.plan, step.aggregator, list(updates), updates.get)
    for i in sorted(updates):
        step.aggregator.fold(updates[i])
    return {}


@pytest.mark.parametrize("robust", [False, True], ids=["plain", "robust"])
@pytest.mark.parametrize("method", ["lorm", "ridge", "fedavg", "pilora"])
def test_a_client_without_the_tasks_classes_adds_nothing_to_any_step(tmp_path, method, robust):
    config = config_of(four_clients(tmp_path), method, robust)
    runtimes = owned_runtimes(config, class_schedule(config), [client_files(tmp_path, i) for i in range(4)])
    workers = [rt.worker(i, f"client-{i}") for i, rt in enumerate(runtimes)]
    assert [int(s.numel()) for s in workers[EMPTY].shards] == [0, 8]
    spec = runtimes[0].spec
    with_it, without = make_strategy(config, spec), make_strategy(config, spec)
    for index, (phase, _) in enumerate(schedule(with_it, 0, config.rounds_per_task)):
        a, b = (
            open_step(with_it, config.rounds_per_task, 0, index),
            open_step(without, config.rounds_per_task, 0, index),
        )
        if phase == Phase.EVALUATE:
            report = workers[EMPTY].handle(a.plan)
            assert isinstance(report, EvalReport) and report.total == [0]  # no test split of its own
            continue
        assert a.plan.tensors.keys() == b.plan.tensors.keys()
        assert all(torch.equal(a.plan.tensors[k], b.plan.tensors[k]) for k in a.plan.tensors)
        updates = {i: w.handle(a.plan) for i, w in enumerate(workers)}
        empty = updates[EMPTY]
        assert isinstance(empty, ClientUpdate) and empty.num_samples == 0
        report = fold(config, a, updates)
        alone = fold(config, b, {i: u for i, u in updates.items() if i != EMPTY})
        if robust:  # not refused nor clipped, and the others' verdicts (their ratios to the medians) unchanged
            assert report["screened"] and EMPTY not in report["refused"] + report["clipped"]
            assert {i: v for i, v in report["clients"].items() if i != str(EMPTY)} == alone["clients"]
        a.fold.finish()
        b.fold.finish()
        kept, dropped = with_it.state_tensors(), without.state_tensors()
        assert kept.keys() == dropped.keys()
        for name in kept:
            assert torch.equal(kept[name], dropped[name]), (phase, name)


def test_an_update_of_no_samples_that_carries_something_is_refused_beside_the_honest_majority(tmp_path):
    config = config_of(four_clients(tmp_path), "lorm", robust=True)
    runtimes = owned_runtimes(config, class_schedule(config), [client_files(tmp_path, i) for i in range(4)])
    workers = [rt.worker(i, f"client-{i}") for i, rt in enumerate(runtimes)]
    strategy = make_strategy(config, runtimes[0].spec)
    step = open_step(strategy, config.rounds_per_task, 0, 0)
    updates = {i: w.handle(step.plan) for i, w in enumerate(workers)}
    forged = updates[EMPTY]
    forged.tensors[HEAD_GRAM] = torch.eye(forged.tensors[HEAD_GRAM].shape[0], dtype=torch.float64) * 1e6
    report = fold(config, step, updates)
    assert report["refused"] == [EMPTY] and not report["spared"]
    assert report["clients"][str(EMPTY)]["refused"].startswith("it claims no samples but carries head/gram")
    assert step.aggregator.count == 3  # the honest three folded


def test_a_task_that_no_client_holds_data_of_is_refused_by_name_not_merged_into_nans(tmp_path):
    config = config_of(four_clients(tmp_path), "ridge", robust=False).replace(num_clients=1)
    (runtime,) = owned_runtimes(config, class_schedule(config), [client_files(tmp_path, EMPTY)])
    strategy = make_strategy(config, runtime.spec)
    step = open_step(strategy, config.rounds_per_task, 0, 0)
    step.aggregator.fold(runtime.worker(0, "client-0").handle(step.plan))
    with pytest.raises(ValueError, match=r"task 0 features step: its 1 updates hold no sample of .* \[0, 2\)"):
        merge(strategy, step, 1, {})


def test_dirichlet_shards_with_no_minimum_let_a_client_without_a_tasks_samples_take_part():
    """``min_client_samples = 0``: the partition may leave a client none of a task's samples, and the coordinator
    takes its update of zero samples (its bound is the run's minimum, not 1), as a federation of many small
    clients needs."""
    changes = {"run_id": "empty-shards", "method": "ridge", "num_clients": 40, "min_client_samples": 0, "beta": 0.1}
    config = RunConfig(**{**preset("tiny"), **changes})
    labels = torch.arange(9).repeat_interleave(40).numpy()  # the synthetic set: 40 training samples of 9 classes
    shards = dirichlet_partition(labels, [(0, 3), (3, 6), (6, 9)], 40, 0.1, config.seed, 0)
    assert any(len(shard) == 0 for task in shards for shard in task)  # some client holds none of some task
    result = run_inprocess(config)
    assert [h["clients"] for h in result.history if h["phase"] == "features"] == [40, 40, 40]
    assert result.matrix.total[-1] == [30, 30, 30]
