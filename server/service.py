"""The gRPC servicer (thin: decode, call the coordinator, encode) and the server factory."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.infra.faults import after_items
from common.infra.tls import Security
from common.wire.messages import ModelSpec, PushEnvelope, RoundPlan, Wait
from proto import codec, secagg_codec, status_codec, streams
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc
from server.admission import AdmissionInterceptor, CallLimiter, Limits
from server.auth import Authenticator, AuthInterceptor, bounded_details
from server.checks import Refused
from server.coordinator import Coordinator
from server.operator import OperatorAuth, refuse_without_operator

SERVICE_NAME = "lorm.v1.Coordinator"
OPERATOR_SERVICE = "lorm.v1.Operator"

SERVER_OPTIONS = codec.CHANNEL_OPTIONS + [
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),  # accept the clients' keepalives
    # A fixed receive window instead of bandwidth-delay probing: a push that waits for a worker
    # thread buffers at most this much, not a grown window (its whole update), so memory stays
    # flat however many clients push at once. Measured with bench/load_bench.py (200 rank-1
    # ViT-B/16 pushes, docs/RELIABILITY.md): peak RSS 2006 MiB with probing, 1308 MiB with a
    # 1 MiB window, 1177 MiB with 64 KiB. 256 KiB still moves ~5 MB/s per push at 50 ms RTT.
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 256 * 1024),
    # Refuse a port another process listens on: gRPC binds with SO_REUSEPORT unless told not to, and a second
    # coordinator on the port would then serve beside the first, the kernel spreading the clients over both.
    ("grpc.so_reuseport", 0),
]


class _Duplicate(Exception):
    pass


def _abort(context: grpc.ServicerContext, err: Exception) -> None:
    message = bounded_details(str(err))
    if isinstance(err, Refused):
        context.abort(getattr(grpc.StatusCode, err.code), message)
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    def __init__(
        self, coordinator: Coordinator, auth: Authenticator, chunk_bytes: int = streams.DEFAULT_CHUNK_BYTES
    ) -> None:
        self.coordinator = coordinator
        self.auth = auth  # every handler checks that the message's client_id is the authenticated caller
        self.chunk_bytes = chunk_bytes

    def Join(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinReply:
        coord = self.coordinator
        self.auth.authorize(context, request.client_id)
        try:
            if not request.client_id:
                raise ValueError("client_id: must not be empty")
            try:
                codec.check_wire_version(request.wire_version, "client")
            except ValueError as err:
                raise Refused("FAILED_PRECONDITION", str(err)) from err
            wanted = request.requested_index if request.HasField("requested_index") else None
            index = coord.join(request.client_id, wanted)
        except (Refused, ValueError) as err:
            _abort(context, err)
        config, schedule = coord.joined()  # the tasks the operator appended included
        return pb.JoinReply(
            run_id=config.run_id,
            config_json=config.to_json(),
            client_index=index,
            num_clients=config.num_clients,
            wire_version=codec.WIRE_VERSION,
            tasks=codec.schedule_to_proto(schedule),
        )

    def Describe(self, request: pb.ModelDescription, context: grpc.ServicerContext) -> pb.Ack:
        self.auth.authorize(context, request.client_id)
        try:
            self.coordinator.check_run_id(request.run_id)
            try:
                spec = ModelSpec.from_json(request.model_spec_json)
            except (ValueError, KeyError, TypeError, IndexError) as err:
                raise ValueError(f"model_spec_json: not a model description ({err})") from err
            self.coordinator.describe(request.client_id, spec)
        except (Refused, ValueError) as err:
            _abort(context, err)
        return pb.Ack(accepted=True)

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[pb.PlanChunk]:
        self.auth.authorize(context, request.client_id)
        try:
            query = codec.pull_from_proto(request)
            self.coordinator.check_run_id(query.run_id)
            answer = self.coordinator.pull(query.client_id)
        except (Refused, ValueError) as err:
            _abort(context, err)
        if isinstance(answer, Wait):
            yield from codec.wait_to_proto(Wait(answer.retry_after_s, answer.reason))
            return
        assert isinstance(answer, RoundPlan)
        yield from codec.plan_to_proto(answer, self.chunk_bytes)

    def Push(self, request_iterator: Iterator[pb.UpdateChunk], context: grpc.ServicerContext) -> pb.PushReply:
        coord = self.coordinator

        def on_envelope(env: PushEnvelope) -> None:
            self.auth.authorize(context, env.client_id)  # before any tensor is read or state touched
            if coord.precheck_push(env):
                raise _Duplicate()

        try:
            chunks = after_items(request_iterator, "push.receiving", 2)  # envelope + first chunk: tests kill here
            envelope, update = codec.update_from_proto(
                chunks, on_envelope=on_envelope, max_total_bytes=coord.options.max_push_bytes
            )
            accepted = coord.submit(update, envelope.idempotency_key)
        except _Duplicate:
            return pb.PushReply(accepted=True, duplicate=True, message="already recorded")
        except (Refused, ValueError) as err:
            _abort(context, err)
        return pb.PushReply(
            accepted=True, duplicate=not accepted, message="recorded" if accepted else "already recorded"
        )

    def ReportEval(self, request: pb.EvalReport, context: grpc.ServicerContext) -> pb.Ack:
        self.auth.authorize(context, request.client_id)
        try:
            key, report = codec.eval_from_proto(request)
            accepted = self.coordinator.report_eval(report, key)
        except (Refused, ValueError) as err:
            _abort(context, err)
        return pb.Ack(accepted=True, duplicate=not accepted)

    def SecAgg(self, request: pb.SecAggRequest, context: grpc.ServicerContext) -> pb.SecAggReply:
        self.auth.authorize(context, request.client_id)
        try:
            reply = self.coordinator.secagg(**secagg_codec.secagg_request_from_proto(request))
        except (Refused, ValueError) as err:
            _abort(context, err)
        return secagg_codec.secagg_reply_to_proto(reply)

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        if request.run_id:  # optional here: a status probe need not know the run
            try:
                self.coordinator.check_run_id(request.run_id)
            except Refused as err:
                _abort(context, err)
        # The caller's own figures beside the run's progress, never another client's.
        return status_codec.status_to_proto(self.coordinator.status(self.auth.identity(context)))


class OperatorServicer(pb_grpc.OperatorServicer):
    """The operator's full view of the run and its commands (an open run's next task, its end), behind the
    operator's token (``server.operator``)."""

    def __init__(self, coordinator: Coordinator, operator: OperatorAuth | None) -> None:
        self.coordinator, self.operator = coordinator, operator

    def OperatorStatus(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        self._authorize(request.run_id, context)
        return status_codec.status_to_proto(self.coordinator.status(operator=True))

    def _authorize(self, run_id: str, context: grpc.ServicerContext) -> None:
        """The operator's token first, before the run is touched, even its id; then the run's id, if named."""
        if self.operator is None:
            refuse_without_operator(context)
        self.operator.authorize(context)
        if run_id:
            try:
                self.coordinator.check_run_id(run_id)
            except Refused as err:
                _abort(context, err)

    def AddTask(self, request: pb.AddTaskRequest, context: grpc.ServicerContext) -> pb.AddTaskReply:
        self._authorize(request.run_id, context)
        try:
            task = self.coordinator.add_task(list(request.classes))
        except Refused as err:
            _abort(context, err)
        _, schedule = self.coordinator.joined()
        return pb.AddTaskReply(task=task, tasks=codec.schedule_to_proto(schedule))

    def Finish(self, request: pb.FinishRequest, context: grpc.ServicerContext) -> pb.Ack:
        self._authorize(request.run_id, context)
        try:
            self.coordinator.finish()
        except Refused as err:
            _abort(context, err)
        return pb.Ack(accepted=True)


def create_server(
    coordinator: Coordinator,
    address: str,
    max_workers: int = 32,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
    *,
    security: Security,
    limits: Limits = Limits(),
    operator: OperatorAuth | None = None,
) -> tuple[grpc.Server, int]:
    """A started-ready (not yet started) server bound to ``address`` (port 0: any free port).

    ``interceptors``: e.g. ``server.telemetry.CoordinatorMetrics.interceptor()``. ``security``
    (checked with ``Security.check("server")``): TLS and client authentication on every call of
    the coordinator's service; the health service needs no client identity (only the TLS handshake).
    ``limits`` (``server.admission``): calls in progress per client and in all (``max_workers`` less
    ``limits.reserve``, kept for health checks), and how slow a stream may be. ``operator``: the
    credential of ``Operator/OperatorStatus`` (``server.operator``; ``None``: that call is refused)."""
    auth = Authenticator(security)
    limiter = CallLimiter(limits, max_active=max_workers - limits.reserve)
    # The operator's calls out of the reserve, one at a time per caller: a flood of Operator calls (a token
    # guessed or not) cannot take the threads the health checks and the clients' refusals need.
    operator_limiter = CallLimiter(dataclasses.replace(limits, per_client=1), max_active=max(1, limits.reserve // 2))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        options=SERVER_OPTIONS,
        interceptors=[
            *interceptors,
            AuthInterceptor(auth, SERVICE_NAME),
            AdmissionInterceptor(limiter, auth, SERVICE_NAME),
            AdmissionInterceptor(operator_limiter, None, OPERATOR_SERVICE),
        ],
    )
    pb_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(coordinator, auth), server)
    pb_grpc.add_OperatorServicer_to_server(OperatorServicer(coordinator, operator), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    credentials = security.server_credentials()
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:  # gRPC's own says only "Failed to bind"; the errno is in its log
        port = 0
    if port == 0:
        raise OSError(f"could not listen on {address}: the port is in use (another coordinator?) or not this host's")
    return server, port
