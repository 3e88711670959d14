"""A client process meeting a coordinator of another wire contract refuses the run at its Join, naming both
versions, and sends nothing more (the coordinator's side of the check: tests/server/test_coordinator.py)."""

from __future__ import annotations

import sys
from concurrent import futures

import grpc

from common.run.config import RunConfig
from proto import codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc

from procs import ProjectProc


class VersionOneCoordinator(pb_grpc.CoordinatorServicer):
    """What a version-1 coordinator answers a Join: no wire_version (0); it records every call after it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def Join(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinReply:
        self.calls.append("Join")
        return pb.JoinReply(run_id="old", config_json=RunConfig(num_clients=1).to_json(), client_index=0, num_clients=1)

    def Describe(self, request: pb.ModelDescription, context: grpc.ServicerContext) -> pb.Ack:
        self.calls.append("Describe")
        return pb.Ack(accepted=True)


def test_a_client_refuses_a_coordinator_of_another_wire_contract_at_join():
    servicer = VersionOneCoordinator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        argv = ["--server", f"127.0.0.1:{port}", "--client-id", "c0", "--insecure", "--give-up", "10"]
        client = ProjectProc("client", [sys.executable, "-m", "client.main", *argv])
        code = client.wait(timeout=120)
    finally:
        server.stop(0)
    out = "".join(client.lines)
    assert code == 3, out
    assert "version 1 (it names none)" in out and f"version {codec.WIRE_VERSION}" in out, out
    assert servicer.calls == ["Join"]  # nothing after the refused Join: no model description, no pull
