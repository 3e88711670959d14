"""The wire format of a run's status: the view a client or the operator reads of the coordinator.

:meth:`server.coordinator.Coordinator.status` gives a mapping (the run, its state, where it stands,
how many clients joined and finished, its metrics); it travels as a ``RunStatus``, the phase as the
wire's enum (:mod:`proto.fields`) and the metrics as JSON. The servicer answers a client's ``Status``
and the operator's ``OperatorStatus`` with it; the operator's command (``server/admin.py``) reads it
back. The envelopes are in :mod:`proto.codec`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from proto import lorm_pb2 as pb
from proto.fields import phase_from_proto, phase_to_proto


def status_to_proto(status: Mapping[str, Any]) -> pb.RunStatus:
    """A view of :meth:`server.coordinator.Coordinator.status` (a client's or the operator's) on the wire."""
    return pb.RunStatus(
        run_id=status["run_id"],
        state=status["state"],
        task=status["task"],
        round=status["round"],
        phase=phase_to_proto(status["phase"]),
        clients_joined=status["clients_joined"],
        clients_done=status["clients_done"],
        metrics_json=json.dumps(status["metrics"]),
    )


def status_from_proto(msg: pb.RunStatus) -> dict[str, Any]:
    """Inverse of :func:`status_to_proto` (the phase by name, the metrics parsed)."""
    return {
        "run_id": msg.run_id,
        "state": msg.state,
        "task": msg.task,
        "round": msg.round,
        "phase": phase_from_proto(msg.phase).value,
        "clients_joined": msg.clients_joined,
        "clients_done": msg.clients_done,
        "metrics": json.loads(msg.metrics_json or "{}"),
    }
