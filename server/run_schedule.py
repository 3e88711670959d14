"""The operator's schedule of an open run: a task appended, the run finished.

An open run (``data.open``) takes more tasks while it runs, or while it idles after its last one
(``lorm-admin add-task``), and ends when the operator says so (``lorm-admin finish``). Here, as functions of
the coordinator's run (:class:`server.run.Run`, whose ``add_task`` and ``finish`` are what the coordinator
calls): a task checked against what the run can still learn (:func:`check_task`), appended and, when the run
was idle, its first step opened (:func:`add_task`), and the run finished (:func:`finish`). The schedule itself,
the classes by name task by task, is ``common/run/schedule.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.run.schedule import MAX_NAME, MAX_TASK, head_classes, scheduled_classes
from common.run.settings import DataSettings
from server.checks import Refused
from server.intake import StepState
from server.run_state import State
from server.steps import schedule as task_steps

if TYPE_CHECKING:
    from server.run import Run


def add_task(run: Run, classes: list[str], keep: str | None) -> StepState | None:
    """Append a task of ``classes`` to an open run's schedule and commit (``keep``: the open step's key, whose
    staged submissions stay). Returns its first step, opened, when the run was idle, else ``None`` (the run
    reaches the task after those before it). ``Refused`` with nothing changed for a task the run cannot take."""
    check_task(run, classes)
    schedule = run.current_schedule()
    assert schedule is not None  # an owned-data run names its classes (RunConfig's check)
    run.schedule = [*schedule, list(classes)]
    if run.strategy is not None:
        run.strategy.extend(run.live_config)
    run.progress = None  # the run's steps changed: counted again when the next step opens
    task = len(run.schedule) - 1
    run.emit(f"the operator appended task {task}: {', '.join(classes)}")
    if run.state != State.IDLE:
        run.commit(keep=keep)
        return None
    run.state, run.pointer = State.RUNNING, (task, 0)
    run.commit()  # at (task, 0), the task not begun: opening the step begins it
    return run.open(task, 0)


def check_task(run: Run, classes: list[str]) -> None:
    """``Refused`` unless the run is open and not over, and ``classes`` a task it can learn: 1 to
    :data:`MAX_TASK` names of 1 to :data:`MAX_NAME` characters, none twice nor already scheduled, within
    the head's rows (``data.max_classes``)."""
    if not run.config.section(DataSettings).open:
        raise Refused(
            "FAILED_PRECONDITION",
            "this run's schedule is closed: a coordinator started with --open (data.open=true) takes more tasks",
        )
    if run.state in (State.DONE, State.FAILED) or run.closed:
        why = "the operator finished it" if run.closed and run.state != State.FAILED else "it is over"
        raise Refused("FAILED_PRECONDITION", f"no task can be added to run {run.config.run_id}: {why}")
    if not 1 <= len(classes) <= MAX_TASK:
        raise Refused("INVALID_ARGUMENT", f"a task has 1 to {MAX_TASK} classes, got {len(classes)}")
    bad = [name for name in classes if not name or len(name) > MAX_NAME or name != name.strip() or "," in name]
    if bad:
        raise Refused(
            "INVALID_ARGUMENT",
            f"class names are 1 to {MAX_NAME} characters, without a comma or surrounding spaces; got {bad[:3]!r:.200}",
        )
    repeated = sorted({name for name in classes if classes.count(name) > 1})
    if repeated:
        raise Refused("INVALID_ARGUMENT", f"the task names a class twice: {repeated[:5]!r:.200}")
    schedule = run.current_schedule() or []
    taken = {name: t for t, task in enumerate(schedule) for name in task}
    again = [f"{name!r} (task {taken[name]})" for name in classes if name in taken]
    if again:
        raise Refused("INVALID_ARGUMENT", f"already scheduled: {', '.join(again[:5]):.300}")
    scheduled = len(scheduled_classes(schedule))
    rows = run.spec.num_classes if run.spec is not None else head_classes(run.config, scheduled)
    if scheduled + len(classes) > rows:
        raise Refused(
            "FAILED_PRECONDITION",
            f"the model's head has {rows} rows (data.max_classes={run.config.section(DataSettings).max_classes}, "
            f"fixed when the clients built it) and {scheduled} classes are scheduled: a task of {len(classes)} "
            "more does not fit; start a run with a larger data.max_classes",
        )


def finish(run: Run, keep: str | None) -> None:
    """The operator ends an open run: at once when it is idle (``DONE``), else after its last scheduled task.
    ``Refused`` for a closed schedule or a run already over."""
    if not run.config.section(DataSettings).open:
        raise Refused("FAILED_PRECONDITION", "this run's schedule is closed: it ends after its last task anyway")
    if run.state in (State.DONE, State.FAILED):
        raise Refused("FAILED_PRECONDITION", f"run {run.config.run_id} is over ({run.state.value})")
    run.closed = True
    if run.state == State.IDLE:
        assert run.strategy is not None  # idle: its tasks ran
        last = run.pointer[0] - 1  # the step the run ended at: its last task's evaluation
        steps = task_steps(run.strategy, last, run.config.rounds_per_task)
        run.state, run.pointer = State.DONE, (last, len(steps) - 1)
        run.emit("the operator finished the run")
    else:
        run.emit("the operator finished the run: it ends after its last scheduled task")
    run.commit(keep=keep)
