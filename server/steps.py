"""One step's lifecycle, written once for both drivers (issue 42).

A run is a sequence of steps: per task, the strategy's steps (``TRAIN`` rounds, then e.g. ``TASK_GRAM``)
and an ``EVALUATE``. A step opens (:func:`open_step`: the strategy's plan and a fresh aggregator; an
evaluation has none), the clients' updates are folded through the driver's fold policy (in index order,
screened by the robust mode, or masked by secure aggregation), the strategy merges, and the step leaves
one history entry and one log line (:func:`merge`, :func:`evaluate`); then the run moves on
(:func:`following`). The coordinator drives this over the wire (concurrency, staging, deadlines), the
in-process engine in a loop over its workers; both call these functions, so what they record agrees
by construction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from common.logs import plan_name, report_text, step_loss
from common.messages import EvalReport, Phase, RoundPlan
from common.metrics import AccuracyMatrix
from server.robust import robust_text
from server.secure import secagg_text
from server.strategies import Aggregator, Strategy


def schedule(strategy: Strategy, task: int, rounds_per_task: int) -> list[tuple[Phase, int]]:
    """Task ``task``'s steps as ``(phase, round)``: the strategy's, then the evaluation."""
    return strategy.steps(task) + [(Phase.EVALUATE, rounds_per_task)]


@dataclass(frozen=True)
class OpenStep:
    """A step as it opens: where it is in the run, its plan, and the aggregator its updates fold into."""

    task: int
    index: int  # position in the task's schedule
    phase: Phase
    round: int
    plan: RoundPlan
    aggregator: Aggregator | None  # None: an evaluation


def open_step(strategy: Strategy, rounds_per_task: int, task: int, index: int, begin_task: bool) -> OpenStep:
    """Step ``index`` of task ``task``: ``strategy.begin_task`` first when ``begin_task`` (the task is new to
    the strategy's state), then the plan (``configure``, or ``eval_plan``) and a fresh aggregator."""
    if begin_task:
        strategy.begin_task(task)
    phase, round_ = schedule(strategy, task, rounds_per_task)[index]
    if phase == Phase.EVALUATE:
        return OpenStep(task, index, phase, round_, strategy.eval_plan(task), None)
    plan = strategy.configure(task, round_, phase)
    return OpenStep(task, index, phase, round_, plan, strategy.aggregator(plan))


def following(strategy: Strategy, rounds_per_task: int, task: int, index: int) -> tuple[int, int] | None:
    """The step after step ``index`` of task ``task``, as ``(task, index)``; ``None`` after the last evaluation."""
    if index + 1 < len(schedule(strategy, task, rounds_per_task)):
        return task, index + 1
    if task + 1 < len(strategy.tasks):
        return task + 1, 0
    return None


def merge(
    strategy: Strategy,
    step: OpenStep,
    clients: int,
    extras: dict[str, Any],
    after_merge: Callable[[float], None] = lambda seconds: None,
) -> tuple[dict[str, Any], str]:
    """Merge the folded ``step`` (``strategy.aggregate``; ``after_merge`` gets its seconds) and what the
    step records: its history entry and log line. ``clients``: how many took part; ``extras``: the fold
    policy's record (``robust``: the screening; ``secagg``: the secure session), kept where not empty."""
    aggregator = step.aggregator
    assert aggregator is not None, "an evaluation merges nothing"
    start = time.perf_counter()
    strategy.aggregate(step.plan, aggregator)
    after_merge(time.perf_counter() - start)
    report = strategy.step_report(step.plan)
    entry: dict[str, Any] = {
        "task": step.task,
        "round": step.round,
        "phase": step.phase.value,
        "factors": "".join(step.plan.train_factors),
        "clients": clients,
        "loss": aggregator.mean_loss,
        "bytes_per_client": aggregator.payload_bytes / max(aggregator.count, 1),
        **report,
        **{key: value for key, value in extras.items() if value},
    }
    loss = step_loss(step.phase.value, aggregator.mean_loss)
    line = (
        f"task {step.task} round {step.round} {plan_name(step.plan)} merged "
        f"({clients} clients{', ' + loss if loss else ''}){report_text(report)}"
        + (robust_text(entry["robust"]) if "robust" in entry else "")
        + (secagg_text(entry["secagg"]) if "secagg" in entry else "")
    )
    return entry, line


def evaluate(step: OpenStep, matrix: AccuracyMatrix, reports: Iterable[EvalReport]) -> tuple[dict[str, Any], str]:
    """Add the clients' test counts (in the order given: by client index) to ``matrix``; the evaluation's
    history entry and log line."""
    clients = 0
    for report in reports:
        matrix.add(step.task, report.correct, report.total)
        clients += 1
    accuracy = matrix.accuracy()[step.task]
    entry = {
        "task": step.task,
        "round": step.round,
        "phase": step.phase.value,
        "factors": "".join(step.plan.train_factors),
        "clients": clients,
        "accuracy": accuracy,
    }
    return entry, f"task {step.task} evaluated: " + " ".join(f"{a:.2f}" for a in accuracy)
