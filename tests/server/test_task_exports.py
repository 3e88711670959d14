"""The coordinator exports the model after every finished task, where a server watching the results
finds it (``results/task-<t>/``), while the run goes on; a restart rewrites an export a crash cut short, and the
final export stays the run's. Over the coordinator's state machine with made-up client updates."""

from __future__ import annotations

import dataclasses

import torch
from safetensors.torch import load_file

from common.wire.messages import EvalReport, Phase, RoundPlan
from common.wire.model_card import CARD_FILE, HEAD_FILE, ModelCard
from serve.watch import ModelSlot
from server.checks import Options
from server.coordinator import Coordinator
from server.run_state import State, ended_task

from unit_helpers import LORA_SPEC, unit_config, valid_update

CLIENTS = 2
NAMES = ["a", "b", "c", "d", "e", "f"]
SPEC = dataclasses.replace(LORA_SPEC, classes=tuple(NAMES), max_length=16)  # a dataset that names its classes


def card(folder) -> ModelCard:
    return ModelCard.from_json((folder / CARD_FILE).read_text())


def coordinator(tmp_path, **config) -> Coordinator:
    base = dict(num_clients=CLIENTS, num_tasks=3, rounds_per_task=1, max_length=0)
    options = Options(results_dir=str(tmp_path / "results"))
    return Coordinator(unit_config(**{**base, **config}), tmp_path / "state", options)


def started(tmp_path, **config) -> Coordinator:
    coord = coordinator(tmp_path, **config)
    for i in range(CLIENTS):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", SPEC)
    return coord


def play_task(coord: Coordinator) -> int:
    """Every client does each step of the task in progress, its evaluation last; returns the task."""
    assert coord.step is not None
    task = coord.step.task
    for seed in range(100):
        plans = [coord.pull(f"c{i}") for i in range(CLIENTS)]
        assert all(isinstance(p, RoundPlan) and p.task == task for p in plans), plans
        for i, plan in enumerate(plans):
            assert isinstance(plan, RoundPlan)
            if plan.phase == Phase.EVALUATE:
                report = EvalReport(plan.run_id, f"c{i}", i, task, [1] * (task + 1), [2] * (task + 1))
                coord.report_eval(report, f"e{task}/{i}")
            else:
                assert coord.step is not None and coord.step.aggregator is not None
                update = valid_update(plan, coord.step.aggregator.expected(), i, seed * CLIENTS + i)
                coord.submit(update, f"{task}/{plan.round}/{plan.phase.value}/{i}")
        if plans[0].phase == Phase.EVALUATE:  # type: ignore[union-attr]
            return task
    raise AssertionError("the task took more than 100 steps")


def test_each_finished_task_is_exported_before_the_next_begins_and_a_watcher_swaps_to_it(tmp_path):
    results = tmp_path / "results"
    coord = started(tmp_path)
    slot = ModelSlot(results, card)
    assert not slot.poll()  # nothing exported before a task ends

    assert play_task(coord) == 0
    assert coord.step is not None and coord.step.task == 1  # the run goes on
    first = card(results / "task-0")
    assert first.tasks_trained == 1 and first.seen_classes == 2 and first.missing() == []
    assert first.classes == NAMES and first.preprocessing.max_length == 16  # the clients' description names them
    assert not (results / "task-1").exists() and not (results / CARD_FILE).exists()
    assert slot.poll() and slot.version == 1 and slot.current == first

    assert play_task(coord) == 1
    assert slot.poll() and slot.version == 2 and slot.current is not None and slot.current.tasks_trained == 2
    assert slot.stamp is not None and slot.stamp.path == results / "task-1"

    assert play_task(coord) == 2 and coord.run.state == State.DONE
    final, last = card(results), card(results / "task-2")
    assert final == last and final.tasks_trained == 3
    # The final export is written last; within the clock's tick of the last task's, either is the newest: the same.
    assert slot.poll() and slot.stamp is not None and slot.stamp.path in (results, results / "task-2")
    for name in (HEAD_FILE, "adapter/adapter_model.safetensors"):
        want, got = load_file(str(results / name)), load_file(str(results / "task-2" / name))
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)  # the same model
    early = load_file(str(results / "task-0" / "adapter" / "adapter_model.safetensors"))
    assert all(t.shape[0] == 2 for k, t in early.items() if "lora_A" in k)  # rank r after one task, not T r


def test_a_restart_rewrites_the_export_a_crash_cut_short_and_leaves_a_whole_one_alone(tmp_path):
    results = tmp_path / "results"
    coord = started(tmp_path)
    play_task(coord)
    head = (results / "task-0" / HEAD_FILE).read_bytes()
    # Killed after the commit past task 0, in the middle of its export: the card (written last) is missing.
    (results / "task-0" / CARD_FILE).unlink()
    (results / "task-0" / HEAD_FILE).unlink()
    coord = coordinator(tmp_path)
    assert coord.run.pointer == (1, 0) and ended_task(coord.run.state, coord.run.pointer) == 0
    assert card(results / "task-0").tasks_trained == 1 and (results / "task-0" / HEAD_FILE).read_bytes() == head
    written = (results / "task-0" / CARD_FILE).stat().st_mtime_ns
    coordinator(tmp_path)  # whole: not written again (a watcher would take a rewritten card for a new export)
    assert (results / "task-0" / CARD_FILE).stat().st_mtime_ns == written


def test_ended_task_is_the_task_whose_end_a_commit_stands_at():
    assert ended_task(State.RUNNING, (0, 0)) is None  # nothing learned yet
    assert ended_task(State.RUNNING, (2, 0)) == 1  # task 2 not begun: the model is task 1's
    assert ended_task(State.RUNNING, (2, 1)) is None  # within task 2
    assert ended_task(State.IDLE, (2, 0)) == 1
    assert ended_task(State.DONE, (2, 3)) == 2
    assert ended_task(State.FAILED, (2, 0)) is None
