"""An open run's schedule, which the operator extends while the run lives. Over the coordinator's
state machine: it idles past its last task (a pull waits), an appended task runs, the schedule survives a restart,
and a task the run cannot take is refused with nothing changed."""

from __future__ import annotations

import pytest

from common.run.schedule import run_tasks
from common.wire.messages import EvalReport, Phase, RoundPlan, Wait
from server.checks import Options, Refused
from server.coordinator import Coordinator
from server.run_state import State

from unit_helpers import LORA_SPEC, unit_config, valid_update

CLIENTS = 2


def open_config(open_: bool = True, max_classes: int = 6):
    data = {"owned": True, "classes": ["a", "b"], "open": open_, "max_classes": max_classes}
    return unit_config(dataset="textfile", num_tasks=1, num_clients=CLIENTS, settings={"data": data})


def started(tmp_path, config=None) -> Coordinator:
    coord = Coordinator(config or open_config(), tmp_path / "state", Options(results_dir=str(tmp_path / "results")))
    for i in range(CLIENTS):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", LORA_SPEC)
    return coord


def play(coord: Coordinator, steps: int = 100) -> None:
    """Every client does each step it is given, until none is given (at most ``steps`` rounds of pulls)."""
    for seed in range(steps):
        answers = [coord.pull(f"c{i}") for i in range(CLIENTS)]
        if not any(isinstance(a, RoundPlan) and a.phase != Phase.DONE for a in answers):
            return
        for i, plan in enumerate(answers):
            if not isinstance(plan, RoundPlan) or plan.phase == Phase.DONE:
                continue
            if plan.phase == Phase.EVALUATE:
                seen = plan.task + 1
                report = EvalReport(plan.run_id, f"c{i}", i, plan.task, [1] * seen, [2] * seen)
                coord.report_eval(report, f"e{plan.task}/{i}")
            else:
                assert coord.step is not None and coord.step.aggregator is not None
                update = valid_update(plan, coord.step.aggregator.expected(), i, seed * CLIENTS + i)
                coord.submit(update, f"{plan.task}/{plan.round}/{plan.phase.value}/{i}")
    raise AssertionError(f"the run took more than {steps} rounds of pulls")


def test_an_open_run_idles_past_its_last_task_takes_the_operators_next_and_ends_on_finish(tmp_path):
    coord = started(tmp_path)
    play(coord)
    assert coord.run.state == State.IDLE and coord.step is None and not coord.done.is_set()
    wait = coord.pull("c0")
    assert isinstance(wait, Wait) and wait.retry_after_s == Options().idle_retry_s and "task 1" in wait.reason

    assert coord.add_task(["c", "d", "e"]) == 1
    assert coord.run.state == State.RUNNING and coord.step is not None and coord.step.task == 1
    assert coord.run.strategy is not None and coord.run.strategy.tasks == [(0, 2), (2, 5)]
    config, schedule = coord.joined()  # what a client joining now is told
    assert schedule == [["a", "b"], ["c", "d", "e"]] and run_tasks(config, LORA_SPEC.num_classes) == [(0, 2), (2, 5)]
    play(coord)
    assert coord.run.state == State.IDLE and len(coord.run.matrix.correct) == 2

    coord.finish()
    assert coord.run.state == State.DONE and coord.done.is_set()
    assert (tmp_path / "results" / "metrics.json").exists()
    assert isinstance(coord.pull("c0"), RoundPlan)  # the DONE plan: the client stops


def test_a_task_appended_while_a_task_runs_follows_it_and_finish_ends_the_run_after_it(tmp_path):
    coord = started(tmp_path)
    coord.add_task(["c"])
    coord.finish()  # the run ends after its last scheduled task: task 1
    with pytest.raises(Refused, match="finished"):
        coord.add_task(["d"])
    play(coord)
    assert coord.run.state == State.DONE and len(coord.run.matrix.correct) == 2


@pytest.mark.parametrize(
    ("classes", "code", "why"),
    [
        ([], "INVALID_ARGUMENT", "1 to"),
        (["c", "c"], "INVALID_ARGUMENT", "twice"),
        (["a", "z"], "INVALID_ARGUMENT", "already scheduled: 'a' \\(task 0\\)"),
        ([""], "INVALID_ARGUMENT", "class names"),
        (["x" * 1001], "INVALID_ARGUMENT", "class names"),
        ([" c"], "INVALID_ARGUMENT", "surrounding spaces"),
        (["c,d"], "INVALID_ARGUMENT", "comma"),
        (["c", "d", "e", "f", "g"], "FAILED_PRECONDITION", "head has 6 rows"),
    ],
)
def test_a_task_the_run_cannot_take_is_refused_with_nothing_changed(tmp_path, classes, code, why):
    coord = started(tmp_path)
    play(coord)
    generation = coord.store.latest()
    with pytest.raises(Refused, match=why) as err:
        coord.add_task(classes)
    assert err.value.code == code
    assert coord.run.current_schedule() == [["a", "b"]] and coord.run.state == State.IDLE
    assert coord.store.latest() is not None and generation is not None
    assert coord.store.latest()[0] == generation[0]  # nothing committed


def test_a_closed_schedule_takes_no_task_and_needs_no_finish(tmp_path):
    coord = started(tmp_path, open_config(open_=False, max_classes=0))
    with pytest.raises(Refused, match="--open") as err:
        coord.add_task(["c"])
    assert err.value.code == "FAILED_PRECONDITION"
    with pytest.raises(Refused, match="closed"):
        coord.finish()
    play(coord)
    assert coord.run.state == State.DONE


def test_the_appended_schedule_survives_a_restart_idle_or_running(tmp_path):
    coord = started(tmp_path)
    play(coord)
    coord.add_task(["c", "d"])
    play(coord)
    coord.add_task(["e"])  # appended while idle: task 2 opens
    config = coord.config

    again = Coordinator(config, tmp_path / "state", Options(results_dir=str(tmp_path / "results")))
    assert again.run.current_schedule() == [["a", "b"], ["c", "d"], ["e"]]
    assert again.run.state == State.RUNNING and again.step is not None and again.step.task == 2
    assert again.run.strategy is not None and again.run.strategy.tasks == [(0, 2), (2, 4), (4, 5)]
    play(again)
    assert again.run.state == State.IDLE

    third = Coordinator(config, tmp_path / "state", Options(results_dir=str(tmp_path / "results")))
    assert third.run.state == State.IDLE and third.step is None
    assert isinstance(third.pull("c1"), Wait)
    third.finish()
    assert third.run.state == State.DONE and len(third.run.matrix.correct) == 3


def test_a_step_waits_for_the_clients_that_joined_not_for_an_empty_slot(tmp_path):
    """``--start-with 2`` of 3 slots and no deadline: the run goes on with the two that joined (a slot nobody
    holds has no update to wait for; its client takes the step open when it comes), to the end."""
    config = open_config(open_=False, max_classes=0).replace(num_clients=3)
    coord = Coordinator(config, tmp_path / "state", Options(results_dir=str(tmp_path / "results"), start_with=2))
    for i in range(CLIENTS):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", LORA_SPEC)
    assert coord.step is not None  # two of three joined: task 0 started
    play(coord)
    assert coord.run.state == State.DONE and all(entry["clients"] == 2 for entry in coord.run.history)
