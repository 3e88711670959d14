"""What a state directory says of its run: one schema, written and read by the run.

Each generation of a :class:`server.store.Store` holds the strategy's tensors and a ``meta.json``, a
:class:`RunMeta`. The coordinator (its run, ``server/run.py``) and the in-process engine
(``engine/simulation.py``) commit at the same point of the step lifecycle (``server/steps.py``): after a
step's history entry, before the next step opens. So the tensors are the strategy's state after the
history's last step, and ``pointer`` names the step to run next, of which nothing has happened yet (a
task's first step: the task is not begun; opening it begins it). Either driver resumes a directory the
other left by opening ``pointer``; the coordinator then folds again what its clients staged for it.

Metas written before the schema had a number (``schema`` absent) came in two forms, both read here:

- the coordinator's (``state``, ``clients``, ``spec``, ``started``): its pointer named the step in
  progress, opened before the commit, so a task's first step had begun its task. Opening it again
  begins the task again, on a state where it began already; every strategy's ``begin_task`` leaves such
  a state as it is (``tests/server/test_run_state.py``), so the run goes on as it would have;
- the engine's (``seconds``, ``resumes``): the same pointer as now, but no run state and no model
  description; a pointer past the last task meant done. Only the engine, which knows its model and
  tasks, goes on with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from common.methods.checks import validate
from common.run.config import RunConfig
from common.run.metrics import AccuracyMatrix
from common.wire.messages import ModelSpec

SCHEMA = 2  # meta.json's "schema" (2 added the schedule and closed; 1 is read too); absent: the unversioned forms above


class State(str, Enum):
    WAITING = "waiting_for_clients"  # the coordinator's clients have not all joined and described their model
    RUNNING = "running"
    IDLE = "idle"  # an open run (data.open) past its last scheduled task: it waits for the operator's next task
    DONE = "done"
    FAILED = "failed"  # a step could not be completed (secure aggregation failed past its attempts): the run ends


def ended_task(state: State, pointer: tuple[int, int]) -> int | None:
    """The task whose end a run committed at ``state`` and ``pointer`` stands at, its model the strategy's
    state (``None``: it stands within a task, before any, or failed): ``DONE``, the task it ended at; ``IDLE``,
    or ``RUNNING`` at a task's first step (of which nothing has happened), the task before the pointer's."""
    task, index = pointer
    if state == State.DONE:
        return task
    if state == State.IDLE or (state == State.RUNNING and index == 0):
        return task - 1 if task >= 1 else None
    return None


@dataclass
class RunMeta:
    """One generation's ``meta.json``: where the run stands, beside the strategy's tensors."""

    config: RunConfig
    state: State
    pointer: tuple[int, int]  # (task, step index): the step to run next; DONE or FAILED: the step the run ended at
    matrix: AccuracyMatrix = field(default_factory=AccuracyMatrix)
    history: list[dict] = field(default_factory=list)  # one entry per recorded step
    clients: dict[str, int] = field(default_factory=dict)  # the coordinator's joined clients: id -> index
    spec: ModelSpec | None = None  # the clients' model (None: not described yet)
    started: float | None = None  # time.time() when the run began (None: not recorded, an unversioned engine meta)
    seconds: float = 0.0  # time the drivers ran it, summed over the resumed parts (not the time between them)
    resumes: int = 0  # how often the run went on from a state directory
    schedule: list[list[str]] | None = None  # the run's tasks by class name when the operator appended any
    #                                          (None: the configuration's, common.run.schedule.class_schedule)
    closed: bool = False  # an open run the operator finished (lorm-admin finish): it ends after its last task

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "config": json.loads(self.config.to_json()),
            "state": self.state.value,
            "pointer": list(self.pointer),
            "matrix": {"correct": self.matrix.correct, "total": self.matrix.total},
            "history": self.history,
            "clients": self.clients,
            "spec": self.spec.to_json() if self.spec is not None else None,
            "started": self.started,
            "seconds": self.seconds,
            "resumes": self.resumes,
            "schedule": self.schedule,
            "closed": self.closed,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunMeta:
        """Inverse of :meth:`to_json`; the unversioned metas are migrated (see the module's docstring), any
        other schema is refused with a ``ValueError`` that names it."""
        schema = raw.get("schema")
        if schema is None:
            raw = _unversioned(raw)
        elif schema not in (1, SCHEMA):
            raise ValueError(
                f"meta.json has schema {schema!r}; this version reads schemas 1 to {SCHEMA} and the unversioned "
                "coordinator and engine metas before it: use the version that wrote it, or a fresh state directory"
            )
        return cls(
            config=validate(RunConfig.from_dict(raw["config"])),
            state=State(raw["state"]),
            pointer=(int(raw["pointer"][0]), int(raw["pointer"][1])),
            matrix=AccuracyMatrix(raw["matrix"]["correct"], raw["matrix"]["total"]),
            history=raw["history"],
            clients={str(k): int(v) for k, v in raw["clients"].items()},
            spec=ModelSpec.from_json(raw["spec"]) if raw["spec"] else None,
            started=raw["started"],
            seconds=float(raw["seconds"]),
            resumes=int(raw["resumes"]),
            schedule=[[str(name) for name in task] for task in raw["schedule"]] if raw.get("schedule") else None,
            closed=bool(raw.get("closed", False)),
        )


def _unversioned(raw: dict[str, Any]) -> dict[str, Any]:
    """An unversioned meta in schema 1's fields: the coordinator's gains ``seconds`` and ``resumes`` (none
    counted), the engine's ``state`` (running), no ``clients``, ``spec`` or ``started``."""
    if "state" in raw and "clients" in raw:
        return {"seconds": 0.0, "resumes": 0, "started": None, **raw}
    if "seconds" in raw and "resumes" in raw:
        return {**raw, "state": State.RUNNING.value, "clients": {}, "spec": None, "started": None}
    raise ValueError(
        f"meta.json has no schema and is neither the unversioned coordinator meta nor the engine's "
        f"(keys {sorted(raw)}): not a state directory this version reads"
    )
