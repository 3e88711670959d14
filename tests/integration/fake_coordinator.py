"""A hostile coordinator on the generated stubs, no real coordinator behind it: it answers a real ``lorm-client``
process's Join with a configuration of its choosing and its pulls with the plans it chooses, and keeps, decoded,
everything the client sends (its model description, updates, evaluations and secure-aggregation messages), so that a
test can say what left the client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from common.run.config import RunConfig
from common.run.schedule import class_schedule
from common.wire.messages import ClientUpdate, EvalReport, Phase, RoundPlan
from proto import codec, secagg_codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc


@dataclass
class Sent:
    """What the client sent, decoded."""

    described: list[str] = field(default_factory=list)
    updates: list[ClientUpdate] = field(default_factory=list)
    reports: list[EvalReport] = field(default_factory=list)
    secagg: list[dict] = field(default_factory=list)
    pulls: int = 0


class HostileCoordinator(pb_grpc.CoordinatorServicer):
    """Join answers ``config`` (index ``index``, or the raw reply ``join``); the n-th pull answers ``plans[n]`` (a
    ``RoundPlan``, or a list of raw ``PlanChunk`` messages), then a finished run."""

    def __init__(
        self,
        config: RunConfig,
        plans: list[RoundPlan | list[pb.PlanChunk]] | None = None,
        index: int = 0,
        join: pb.JoinReply | None = None,
    ) -> None:
        self.config, self.plans, self.index, self.join_reply = config, list(plans or []), index, join
        self.sent = Sent()
        self.lock = threading.Lock()

    def Join(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinReply:
        if self.join_reply is not None:
            return self.join_reply
        return pb.JoinReply(
            run_id=self.config.run_id,
            config_json=self.config.to_json(),
            client_index=self.index,
            num_clients=self.config.num_clients,
            wire_version=codec.WIRE_VERSION,
            tasks=codec.schedule_to_proto(class_schedule(self.config)),
        )

    def Describe(self, request: pb.ModelDescription, context: grpc.ServicerContext) -> pb.Ack:
        with self.lock:
            self.sent.described.append(request.model_spec_json)
        return pb.Ack(accepted=True)

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[pb.PlanChunk]:
        with self.lock:
            n, self.sent.pulls = self.sent.pulls, self.sent.pulls + 1
        if n >= len(self.plans):
            done = RoundPlan(self.config.run_id, Phase.DONE, 0, 0, (0, 0), 0)
            yield from codec.plan_to_proto(done)
            return
        answer = self.plans[n]
        yield from codec.plan_to_proto(answer) if isinstance(answer, RoundPlan) else answer

    def Push(self, request_iterator: Iterator[pb.UpdateChunk], context: grpc.ServicerContext) -> pb.PushReply:
        _, update = codec.update_from_proto(request_iterator)
        with self.lock:
            self.sent.updates.append(update)
        return pb.PushReply(accepted=True, duplicate=False, message="recorded")

    def ReportEval(self, request: pb.EvalReport, context: grpc.ServicerContext) -> pb.Ack:
        with self.lock:
            self.sent.reports.append(codec.eval_from_proto(request)[1])
        return pb.Ack(accepted=True)

    def SecAgg(self, request: pb.SecAggRequest, context: grpc.ServicerContext) -> pb.SecAggReply:
        with self.lock:
            self.sent.secagg.append(secagg_codec.secagg_request_from_proto(request))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this coordinator runs no secure session")
        raise AssertionError("unreachable")


def serve(coordinator: HostileCoordinator) -> tuple[grpc.Server, int]:
    """``coordinator`` on a loopback port without TLS; the server and its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_CoordinatorServicer_to_server(coordinator, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port
