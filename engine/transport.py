"""The coordinator called in process: a :class:`~client.transport.Transport` for a
:class:`~client.session.ClientSession` in the same process as its :class:`~server.coordinator.Coordinator`.

Each call is the coordinator's own method that the gRPC service calls (``server/service.py``), with what crosses the
wire crossing here as data: the run's configuration and schedule as JSON, a plan's and an update's tensors copied, a
push's envelope checked (``precheck``) before the update is recorded, a secure-aggregation reply as the wire codec
reads it. A refusal is the outcome the
client acts on (``client.transport.rejected``: :class:`~client.transport.Restarted`, :class:`~client.transport.Stale`),
as over gRPC. No retry: nothing here drops a call.

The clients of one coordinator share a :class:`Hub`: a call that changes the run (a push, a report, a secure stage
sent keys or shares, a join) wakes every client that pauses on a Wait, so that the next step is pulled the moment it
opens; and a client that fails stops the others' waits (:class:`RunAborted`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

import grpc
from torch import Tensor

from client.transport import rejected
from common.run.config import RunConfig
from common.run.schedule import Schedule
from common.secagg.rounds import Keys
from common.wire.messages import ClientUpdate, EvalReport, ModelSpec, RoundPlan, Wait
from proto import codec, secagg_codec, streams
from server.checks import Refused
from server.coordinator import Coordinator

T = TypeVar("T")


def _copies(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {name: t.detach().clone() for name, t in tensors.items()}


class RunAborted(BaseException):
    """Another client of the run failed: this one stops where it waits (not an ``Exception``, so that no handler of
    a step's outcomes takes it for one)."""


class Hub:
    """What the in-process clients of ``coordinator`` share: a count of the calls that changed the run, which a
    pausing client waits on, and the first failure among them."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.changed = threading.Condition()
        self.changes = 0
        self.failure: BaseException | None = None

    def touched(self) -> None:
        with self.changed:
            self.changes += 1
            self.changed.notify_all()

    def fail(self, err: BaseException) -> None:
        """The run cannot go on (``err``: a client's failure): every client's wait ends in :class:`RunAborted`."""
        with self.changed:
            self.failure = self.failure or err
            self.changed.notify_all()

    def check(self) -> None:
        if self.failure is not None:
            raise RunAborted(f"another client of the run failed: {self.failure!r}")

    def pause(self, seconds: float, seen: int) -> None:
        """Wait up to ``seconds`` for a change after the ``seen``-th."""
        with self.changed:
            self.changed.wait_for(lambda: self.changes != seen or self.failure is not None, timeout=seconds)
        self.check()


class InProcessTransport:
    """Client ``client_id``'s calls of the hub's coordinator, in this process."""

    def __init__(self, hub: Hub, client_id: str) -> None:
        self.hub, self.coordinator, self.client_id = hub, hub.coordinator, client_id
        self.run_id = ""
        self.schedule: Schedule | None = None
        self.seen = 0  # the hub's changes when this client's last call began

    def _call(self, fn: Callable[[], T], changes: bool = True) -> T:
        """``fn``'s answer, a refusal as the client's outcome; ``changes``: the call may change the run (the
        other clients' waits end)."""
        self.hub.check()
        self.seen = self.hub.changes
        try:
            return fn()
        except Refused as err:
            raise rejected(getattr(grpc.StatusCode, err.code), str(err)) from err
        except ValueError as err:  # what the service answers INVALID_ARGUMENT
            raise rejected(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from err
        finally:
            if changes:
                self.hub.touched()

    def pause(self, seconds: float) -> None:
        """Until the run changed since this client's last call began, or ``seconds``."""
        self.hub.pause(seconds, self.seen)

    def join(self, requested_index: int | None = None) -> tuple[RunConfig, int]:
        index = self._call(lambda: self.coordinator.join(self.client_id, requested_index))
        config, schedule = self.coordinator.joined()
        self.run_id = config.run_id
        self.schedule = codec.schedule_from_proto(codec.schedule_to_proto(schedule))
        return RunConfig.from_json(config.to_json()), index

    def describe(self, spec: ModelSpec) -> None:
        self._call(lambda: self.coordinator.describe(self.client_id, ModelSpec.from_json(spec.to_json())))

    def pull(self) -> RoundPlan | Wait:
        """The next plan, its tensors the client's own copies (as received off the wire: a client that trains them
        in place must not change the coordinator's state)."""
        answer = self._call(lambda: self.coordinator.pull(self.client_id), changes=False)
        if isinstance(answer, Wait):
            return answer
        return dataclasses.replace(answer, tensors=_copies(answer.tensors))

    def push(self, update: ClientUpdate, key: str) -> bool:
        """Record ``update``; ``True`` if the coordinator had it already (a retried push)."""
        declared, total = streams.declared_of(update.tensors)
        u, coord = dataclasses.replace(update, tensors=_copies(update.tensors)), self.coordinator

        def checked() -> bool:
            if coord.precheck(
                u.client_id,
                u.client_index,
                u.run_id,
                u.task,
                u.round,
                u.phase,
                key,
                declared=declared,
                declared_bytes=total,
                secure_attempt=u.secure_attempt,
            ):
                return True
            return not coord.submit(u, key)

        return self._call(checked)

    def report(self, report: EvalReport, key: str) -> bool:
        return not self._call(lambda: self.coordinator.report_eval(report, key))

    def secagg(
        self,
        plan: RoundPlan,
        index: int,
        stage: str,
        keys: Keys | None = None,
        shares: Mapping[int, bytes] | None = None,
    ) -> dict:
        step = (plan.task, plan.round, plan.phase)
        attempt = plan.secure_attempt
        reply = self._call(
            lambda: self.coordinator.secagg(
                self.client_id, index, self.run_id, step, stage, keys, dict(shares or {}), attempt
            ),
            changes=keys is not None or bool(shares),  # a stage asked for, not sent to: a poll
        )
        return secagg_codec.secagg_reply_from_proto(secagg_codec.secagg_reply_to_proto(reply))

    def close(self) -> None:
        """Nothing to close: the coordinator is the caller's."""
