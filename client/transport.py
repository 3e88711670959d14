"""The client's side of the wire: the calls a client makes (:class:`Transport`), and their gRPC implementation
(:class:`CoordinatorClient`) with retry and exponential backoff."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc

from common.infra.tls import Security
from common.run.config import RunConfig
from common.run.schedule import Schedule
from common.secagg.rounds import Keys
from common.wire.messages import ClientUpdate, EvalReport, ModelSpec, PullQuery, RoundPlan, Wait
from proto import codec, secagg_codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc

log = logging.getLogger("lorm.client")
T = TypeVar("T")

# Worth retrying: the coordinator is down, restarting, or the network dropped the call.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
# The coordinator is busy (this client's calls in progress, or all of them, are at their bound): retry after
# a random wait between these, never sooner, so that a refused client does not hammer it; random, so that the
# clients of a burst refused together come back spread over the interval, not as one wave that the bound on
# calls in all refuses again (200 clients pushing at once: 6.4 s against 7.4-10.5 s with a fixed 2 s;
# docs/RELIABILITY.md "Load").
BUSY_RETRY_MIN_S, BUSY_RETRY_MAX_S = 1.0, 3.0
LONG_WAIT_S = 1.0  # a Wait's hint from which the client backs off, waiting longer each time (Backoff.wait_s)


@dataclass
class Backoff:
    initial_s: float = 0.2  # first retry delay
    max_s: float = 10.0  # cap on one delay
    factor: float = 2.0
    give_up_s: float = 600.0  # total time one call keeps retrying before it fails

    def wait_s(self, retry_after_s: float, waits: int) -> float:
        """Seconds to wait before pulling again after ``waits`` Wait answers in a row, the last hinting
        ``retry_after_s``. A hint under :data:`LONG_WAIT_S` (a step's peers, its deadline) is taken as it is:
        the client should see the step's end at once. A longer one (an open run idle between tasks) grows by
        ``factor`` each time, up to ``max_s``: a long idle is polled every ``max_s`` seconds, not spun on."""
        if retry_after_s < LONG_WAIT_S:
            return max(retry_after_s, 0.0)
        return max(retry_after_s, min(retry_after_s * self.factor ** min(waits - 1, 32), self.max_s))

    def delays(self) -> Iterator[float]:
        delay = self.initial_s
        while True:
            yield delay * (0.5 + random.random() / 2)  # jitter: clients restarted together spread out
            delay = min(delay * self.factor, self.max_s)


class Rejected(Exception):
    """The coordinator refused a call for a reason retrying cannot fix."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code


class Restarted(Rejected):
    """The step's secure session restarted since the call's plan was pulled (``ABORTED``): pull it again and take
    part in the new session."""


class Stale(Rejected):
    """The step went on without this client, or is over (``FAILED_PRECONDITION``): drop it and pull the next."""


def rejected(code: grpc.StatusCode, message: str) -> Rejected:
    """The refusal of ``code`` as the outcome the client acts on (:class:`Restarted`, :class:`Stale`, else
    :class:`Rejected`)."""
    kind = {grpc.StatusCode.ABORTED: Restarted, grpc.StatusCode.FAILED_PRECONDITION: Stale}.get(code, Rejected)
    return kind(code, message)


class Transport(Protocol):
    """The calls a client makes of its coordinator. A refusal that retrying cannot fix raises
    ``Rejected`` (a :class:`Restarted` or :class:`Stale` when the
    run goes on without this call)."""

    schedule: Schedule | None  # the run's tasks as the last join stated them

    def join(self, requested_index: int | None = None) -> tuple[RunConfig, int]: ...

    def describe(self, spec: ModelSpec) -> None: ...

    def pull(self) -> RoundPlan | Wait: ...

    def push(self, update: ClientUpdate, key: str) -> bool: ...

    def report(self, report: EvalReport, key: str) -> bool: ...

    def secagg(
        self,
        plan: RoundPlan,
        index: int,
        stage: str,
        keys: Keys | None = None,
        shares: Mapping[int, bytes] | None = None,
    ) -> dict: ...

    def pause(self, seconds: float) -> None:
        """Wait up to ``seconds`` before calling again (a Wait's hint, a secure stage not ready): the transport may
        end the wait early once the coordinator has moved on."""
        ...

    def close(self) -> None: ...


class CoordinatorClient:
    def __init__(
        self,
        target: str,
        client_id: str,
        backoff: Backoff | None = None,
        call_timeout_s: float = 300.0,
        *,
        security: Security,
    ):
        """``security``: checked with ``Security.check("client")``; plaintext only if it says ``insecure``."""
        self.target, self.client_id = target, client_id
        self.backoff = backoff or Backoff()
        self.call_timeout_s = call_timeout_s
        # Its own connection: gRPC shares one connection between a process's channels of equal target and options,
        # and a coordinator that authenticates nobody counts calls per connection (server.admission), so the
        # clients of one process (a load test, an embedding application) would all share one client's slots.
        options = [*codec.CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        self.channel = security.channel(target, options)
        self.metadata = security.call_metadata()  # the bearer token, sent with every call
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.run_id = ""
        self.schedule: Schedule | None = None  # the run's classes by name, from the Join reply

    def close(self) -> None:
        self.channel.close()

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        start = time.monotonic()
        for delay in self.backoff.delays():
            try:
                return fn()
            except grpc.RpcError as err:
                code = err.code()
                if code not in RETRYABLE:
                    raise rejected(code, err.details() or "") from err
                if time.monotonic() - start > self.backoff.give_up_s:
                    raise
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    delay = max(delay, random.uniform(BUSY_RETRY_MIN_S, BUSY_RETRY_MAX_S))
                log.info("%s: %s (%s); retrying in %.1f s", what, code.name, err.details(), delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def join(self, requested_index: int | None = None) -> tuple[RunConfig, int]:
        request = pb.JoinRequest(client_id=self.client_id, wire_version=codec.WIRE_VERSION)
        if requested_index is not None:
            request.requested_index = requested_index
        reply = self._call(
            "join",
            lambda: self.stub.Join(request, timeout=self.call_timeout_s, wait_for_ready=True, metadata=self.metadata),
        )
        codec.check_wire_version(reply.wire_version, "coordinator")
        self.run_id = reply.run_id
        self.schedule = codec.schedule_from_proto(reply.tasks)
        return RunConfig.from_json(reply.config_json), reply.client_index

    def describe(self, spec: ModelSpec) -> None:
        request = pb.ModelDescription(run_id=self.run_id, client_id=self.client_id, model_spec_json=spec.to_json())
        self._call(
            "describe",
            lambda: self.stub.Describe(
                request, timeout=self.call_timeout_s, wait_for_ready=True, metadata=self.metadata
            ),
        )

    def pull(self) -> RoundPlan | Wait:
        request = codec.pull_to_proto(PullQuery(self.run_id, self.client_id))
        return self._call(
            "pull",
            lambda: codec.plan_from_proto(
                self.stub.Pull(request, timeout=self.call_timeout_s, wait_for_ready=True, metadata=self.metadata)
            ),
        )

    def push(self, update: ClientUpdate, key: str) -> bool:
        """Send an update; ``True`` if the coordinator had it already (a retried push)."""
        reply = self._call(
            "push",
            lambda: self.stub.Push(
                codec.update_to_proto(update, key),
                timeout=self.call_timeout_s,
                wait_for_ready=True,
                metadata=self.metadata,
            ),
        )
        return reply.duplicate

    def report(self, report: EvalReport, key: str) -> bool:
        reply = self._call(
            "report",
            lambda: self.stub.ReportEval(
                codec.eval_to_proto(report, key),
                timeout=self.call_timeout_s,
                wait_for_ready=True,
                metadata=self.metadata,
            ),
        )
        return reply.duplicate

    def secagg(
        self,
        plan: RoundPlan,
        index: int,
        stage: str,
        keys: Keys | None = None,
        shares: Mapping[int, bytes] | None = None,
    ) -> dict:
        """One secure-aggregation call for ``plan``'s step and secure session (``proto.secagg_codec.SECAGG_STAGES``);
        the reply as a dict. ``Rejected`` ``ABORTED``: the step's secure aggregation restarted."""
        step = (plan.task, plan.round, plan.phase)
        request = secagg_codec.secagg_request_to_proto(
            self.run_id, self.client_id, index, step, stage, keys, shares, plan.secure_attempt
        )
        return self._call(
            f"secure aggregation ({stage})",
            lambda: secagg_codec.secagg_reply_from_proto(
                self.stub.SecAgg(request, timeout=self.call_timeout_s, wait_for_ready=True, metadata=self.metadata)
            ),
        )

    def status(self) -> dict:
        s = self._call(
            "status", lambda: self.stub.Status(pb.StatusRequest(run_id=self.run_id), timeout=10, metadata=self.metadata)
        )
        return {
            "run_id": s.run_id,
            "state": s.state,
            "task": s.task,
            "round": s.round,
            "clients_joined": s.clients_joined,
            "clients_done": s.clients_done,
            "metrics": json.loads(s.metrics_json or "{}"),
        }
