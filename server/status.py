"""What a caller of Status is told of the run (``Coordinator.status``).

Anyone reads the run's progress and its accuracy matrix: the run's published result, summed over every
client's test counts, of models each client is sent anyway. A client reads its own figures too: its index
and whether the open step holds its submission. The operator alone (``Operator/OperatorStatus``,
``server/operator.py``) reads the last five history entries: they hold per-step sample counts, dropped
clients and the robust mode's per-client cosines and ratios, from which one client differencing two steps
would learn another's shard size, or calibrate a poisoned update just under the bounds.
"""

from __future__ import annotations

from typing import Any

from common.wire.messages import Phase
from server.intake import StepState
from server.run import Run
from server.run_state import State


def run_status(
    run: Run, step: StepState | None, client_id: str | None = None, *, operator: bool = False
) -> dict[str, Any]:
    """Where ``run`` stands (``step``: its open step): its progress and accuracy matrix; with ``client_id``,
    that client's own figures; with ``operator``, the recent history."""
    metrics: dict[str, Any] = {"accuracy": run.matrix.accuracy()}
    index = run.roster.clients.get(client_id) if client_id is not None else None
    if index is not None:
        metrics["client"] = {
            "client_id": client_id,
            "index": index,
            "submitted": step is not None and index in step.submitted,
        }
    if operator:
        metrics["history"] = run.history[-5:]
    over = run.state in (State.DONE, State.FAILED)
    return {
        "run_id": run.config.run_id,
        "state": run.state.value,
        "task": step.task if step else run.pointer[0],
        "round": step.round if step else 0,
        "phase": step.phase if step else Phase.DONE if over else Phase.TRAIN,
        "clients_joined": len(run.roster.clients),
        "clients_done": len(step.submitted) if step else 0,
        "metrics": metrics,
    }
