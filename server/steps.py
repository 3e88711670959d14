"""One step's lifecycle, written once: the run (``server/run.py``) opens, folds and records every step through it.

A run is a sequence of steps: per task, the strategy's steps (``TRAIN`` rounds, then e.g. ``TASK_GRAM``)
and an ``EVALUATE``. A step opens (:func:`open_step`: the strategy's plan and its fold, a fresh aggregator
typed together with the strategy's merge, under the run's privacy account; an evaluation has none), the
clients' updates are folded through the step's intake (``server/intake.py``: in index order, screened by the
robust mode, or masked by secure aggregation), the fold is finished (the strategy merges), and the step leaves
one history entry and one log line (:func:`merge`, :func:`evaluate`); then the run moves on
(:func:`following`), committed (``server/run_state.py``: one meta schema) before the next step opens.
The coordinator drives this over the wire (concurrency, staging, deadlines), the in-process engine in
a loop over its workers; both call these functions, so what they record agrees by construction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from common.aggregation.base import Aggregator
from common.infra.logs import plan_name, report_text, step_loss
from common.run.metrics import AccuracyMatrix
from common.wire.messages import EvalReport, Phase, RoundPlan
from server.robust import robust_text
from server.secure.report import secagg_text
from server.strategies import Strategy
from server.strategies.fold import Fold


def schedule(strategy: Strategy, task: int, rounds_per_task: int) -> list[tuple[Phase, int]]:
    """Task ``task``'s steps as ``(phase, round)``: the strategy's, then the evaluation."""
    return strategy.steps(task) + [(Phase.EVALUATE, rounds_per_task)]


@dataclass
class OpenStep:
    """A step as it opens: where it is in the run, its plan, and its fold (the aggregator its updates fold into)."""

    task: int
    index: int  # position in the task's schedule
    phase: Phase
    round: int
    plan: RoundPlan
    fold: Fold | None  # None: an evaluation

    @property
    def aggregator(self) -> Aggregator | None:
        return None if self.fold is None else self.fold.aggregator


def open_step(strategy: Strategy, rounds_per_task: int, task: int, index: int) -> OpenStep:
    """Step ``index`` of task ``task``: ``strategy.begin_task`` first when it is the task's first step, then
    the plan (``configure``, or ``eval_plan``) and its fold (``strategy.fold``: the privacy account refuses a step
    beyond the budget here). A step is opened once from a given
    state: the run commits before opening the next step, and a resumed one opens the committed
    ``pointer`` (``server/run_state.py``), so a task begins on the state its previous task left."""
    if index == 0:
        strategy.begin_task(task)
    phase, round_ = schedule(strategy, task, rounds_per_task)[index]
    if phase == Phase.EVALUATE:
        return OpenStep(task, index, phase, round_, strategy.eval_plan(task), None)
    plan = strategy.configure(task, round_, phase)
    return OpenStep(task, index, phase, round_, plan, strategy.fold(plan))


def following(strategy: Strategy, rounds_per_task: int, task: int, index: int) -> tuple[int, int] | None:
    """The step after step ``index`` of task ``task``, as ``(task, index)``; ``None`` after the last evaluation."""
    if index + 1 < len(schedule(strategy, task, rounds_per_task)):
        return task, index + 1
    if task + 1 < len(strategy.tasks):
        return task + 1, 0
    return None


def record(task: int, round_: int, phase: Phase, plan: RoundPlan, clients: int) -> dict[str, Any]:
    """What every history entry opens with: where the step is, what it trained, and how many clients took part."""
    return {
        "task": task,
        "round": round_,
        "phase": phase.value,
        "factors": plan.instruction.factors(),
        "clients": clients,
    }


class NothingToMerge(ValueError):
    """A step whose updates hold no sample of its task's classes: no client has data of the task."""


def merge(
    strategy: Strategy,
    step: OpenStep,
    clients: int,
    extras: dict[str, Any],
    after_merge: Callable[[float], None] = lambda seconds: None,
) -> tuple[dict[str, Any], str]:
    """Merge the folded ``step`` (its fold finished; ``after_merge`` gets its seconds) and what the step
    records: its history entry and log line. ``clients``: how many took part; ``extras``: the fold
    policy's record (``robust``: the screening; ``secagg``: the secure session), kept where not empty."""
    assert step.fold is not None, "an evaluation merges nothing"
    aggregator = step.fold.aggregator
    if aggregator.count and not aggregator.num_samples:  # clients on their own data, none of it this task's
        lo, hi = step.plan.class_range
        raise NothingToMerge(
            f"task {step.task} {step.phase.value} step: its {aggregator.count} updates hold no sample of the "
            f"task's classes [{lo}, {hi}): no client has data of this task, so there is nothing to merge"
        )
    start = time.perf_counter()
    step.fold.finish()
    after_merge(time.perf_counter() - start)
    report = strategy.report(step.plan)
    entry: dict[str, Any] = {
        **record(step.task, step.round, step.phase, step.plan, clients),
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
    entry = record(step.task, step.round, step.phase, step.plan, clients) | {"accuracy": accuracy}
    return entry, f"task {step.task} evaluated: " + " ".join(f"{a:.2f}" for a in accuracy)
