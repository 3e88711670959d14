"""The coordinator's Prometheus metrics: run state, clients, bytes on the wire, merges, refusals.

Three sources, none of which changes what the coordinator does:

- a collector that reads the coordinator's status at scrape time (run, state, task, round,
  steps done, clients joined);
- a gRPC server interceptor that counts the serialized bytes of every message in and out per
  method, the clients heard from recently, and the submissions (``Push``, ``ReportEval``)
  the servicer aborted, by status code;
- ``merged(phase, seconds)``, which the coordinator calls after each merge.

Metric names start with ``lorm_``; a fresh :class:`CollectorRegistry` per process (or test).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from server.coordinator import Coordinator

SUBMISSIONS = ("Push", "ReportEval")  # the calls whose refusals count as rejected submissions
CONNECTED_WINDOW_S = 60.0  # a client heard from within this many seconds counts as connected
MERGE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class _StatusCollector(Collector):
    def __init__(self, status: Callable[[], dict], connected: Callable[[Iterable[str]], int]) -> None:
        self.status = status
        self.connected = connected

    def collect(self) -> Iterable:
        s = self.status()
        info = InfoMetricFamily("lorm_run", "the run this coordinator serves", labels=["run_id", "state"])
        info.add_metric([s["run_id"], s["state"]], {})
        yield info
        for name, doc, value in (
            ("lorm_task", "task in progress (the last task once done)", s["task"]),
            ("lorm_round", "round in progress within the task", s["round"]),
            ("lorm_steps_completed", "steps merged or evaluated so far", s["steps_completed"]),
            ("lorm_clients_joined", "clients that have joined the run", s["clients_joined"]),
            ("lorm_step_submissions", "submissions received for the open step", s["clients_done"]),
            (
                "lorm_clients_connected",
                f"joined clients heard from in the last {CONNECTED_WINDOW_S:.0f} s",
                self.connected(s["client_ids"]),
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=float(value))


def coordinator_status(coordinator: Coordinator) -> dict:
    """What the collector reports, read without the coordinator's lock: a scrape never waits
    for a long merge (the values are each current, if not all from the same instant)."""
    step, run = coordinator.step, coordinator.run
    return {
        "run_id": run.config.run_id,
        "state": run.state.value,
        "task": step.task if step else run.pointer[0],
        "round": step.round if step else 0,
        "steps_completed": len(run.history),
        "clients_joined": len(run.roster.clients),
        "client_ids": list(run.roster.clients),  # one C-level copy: atomic under the GIL
        "clients_done": len(step.submitted) if step else 0,
    }


class CoordinatorMetrics:
    """Every coordinator metric, in one registry; :meth:`interceptor` goes to the gRPC server."""

    def __init__(self, status: Callable[[], dict], registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._seen: dict[str, float] = {}  # client id -> monotonic time last heard from
        self._seen_lock = threading.Lock()
        self.bytes_in = Counter(
            "lorm_received_bytes", "serialized message bytes received", ["method"], registry=self.registry
        )
        self.bytes_out = Counter("lorm_sent_bytes", "serialized message bytes sent", ["method"], registry=self.registry)
        self.rejected = Counter(
            "lorm_rejected_submissions", "submissions refused, by gRPC status code", ["reason"], registry=self.registry
        )
        self.merge_seconds = Histogram(
            "lorm_merge_seconds",
            "time to merge one step's submissions",
            ["phase"],
            buckets=MERGE_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StatusCollector(status, self.connected))

    # -------------------------------------------------------------- hooks

    def merged(self, phase: str, seconds: float) -> None:
        self.merge_seconds.labels(phase=phase).observe(seconds)

    def heard_from(self, client_id: str) -> None:
        with self._seen_lock:
            self._seen[client_id] = time.monotonic()

    def connected(self, joined: Iterable[str]) -> int:
        """Joined clients heard from recently (a caller that never joined is not a client)."""
        cutoff = time.monotonic() - CONNECTED_WINDOW_S
        with self._seen_lock:
            return sum(1 for c in joined if self._seen.get(c, -1.0) >= cutoff)

    def interceptor(self) -> grpc.ServerInterceptor:
        return _MeteringInterceptor(self)

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Expose ``/metrics`` over HTTP on ``host:port``; returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port


def _size(message: Any) -> int:
    return message.ByteSize() if hasattr(message, "ByteSize") else 0


class _MeteringInterceptor(grpc.ServerInterceptor):
    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.m = metrics

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method.rsplit("/", 1)[-1]
        m = self.m
        bytes_in, bytes_out = m.bytes_in.labels(method=method), m.bytes_out.labels(method=method)

        def received(request):
            bytes_in.inc(_size(request))
            client_id = getattr(request, "client_id", "")
            if isinstance(client_id, str) and client_id:
                m.heard_from(client_id)
            return request

        def requests(iterator: Iterator) -> Iterator:
            for request in iterator:
                yield received(request)

        def refused(context) -> None:
            code = context.code()
            if method in SUBMISSIONS and code is not None and code != grpc.StatusCode.OK:
                m.rejected.labels(reason=code.name.lower()).inc()

        def unary_out(behavior):
            def call(request_or_iterator, context):
                try:
                    reply = behavior(request_or_iterator, context)
                except BaseException:
                    refused(context)
                    raise
                bytes_out.inc(_size(reply))
                return reply

            return call

        def stream_out(behavior):
            # A streaming reply is produced lazily: refusals raise while it is iterated.
            def call(request_or_iterator, context):
                try:
                    for response in behavior(request_or_iterator, context):
                        bytes_out.inc(_size(response))
                        yield response
                except BaseException:
                    refused(context)
                    raise

            return call

        serializers = (handler.request_deserializer, handler.response_serializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: unary_out(handler.unary_unary)(received(request), context), *serializers
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: stream_out(handler.unary_stream)(received(request), context), *serializers
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                lambda iterator, context: unary_out(handler.stream_unary)(requests(iterator), context), *serializers
            )
        return grpc.stream_stream_rpc_method_handler(
            lambda iterator, context: stream_out(handler.stream_stream)(requests(iterator), context), *serializers
        )
