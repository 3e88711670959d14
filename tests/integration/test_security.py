"""TLS and client authentication over real gRPC servers on 127.0.0.1, with lorm-certs' files."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.transport import Backoff, CoordinatorClient, Rejected
from common.infra.tls import Security, SecurityError
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, EvalReport, ModelSpec, Phase, RoundPlan
from common.wire.tensors import head_tensors, pack
from proto import codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc
from server.certs import create_dev_pki
from server.coordinator import Coordinator
from server.service import SERVICE_NAME, create_server

from procenv import project_pythonpath
from procs import Proc

ROOT = Path(__file__).resolve().parents[2]
SPEC = ModelSpec(layers={"l1": (5, 4)}, feature_dim=4, num_classes=6)
CONFIG = RunConfig(run_id="sec", num_clients=3, num_tasks=2, rounds_per_task=2, rank=2, seed=1)
IDS = ["c0", "c1", "c2"]


def update_for(plan: RoundPlan, index: int, client_id: str | None = None) -> ClientUpdate:
    g = torch.Generator().manual_seed(index)
    x = torch.randn(12, 4, generator=g, dtype=torch.float64)
    return ClientUpdate(
        run_id=plan.run_id,
        client_id=client_id or f"c{index}",
        client_index=index,
        task=plan.task,
        round=plan.round,
        phase=plan.phase,
        num_samples=10,
        tensors=pack(
            factors={"l1": {"B": torch.randn(5, 2, generator=g)}},
            grams={"l1": torch.rand(4, generator=g, dtype=torch.float64) + 0.1},
            head=head_tensors(torch.randn(6, 4, generator=g), torch.randn(6, generator=g)),
            head_gram=x.T @ x,
        ),
        train_loss=1.0,
    )


def snapshot(coord: Coordinator) -> tuple[dict, dict]:
    """Everything a refused call must leave alone: the status and every byte of the state on disk."""
    files = {
        str(p.relative_to(coord.store.root)): p.read_bytes()
        for p in sorted(Path(coord.store.root).rglob("*"))
        if p.is_file()
    }
    return coord.status(), files


@pytest.fixture
def pki(tmp_path):
    return create_dev_pki(tmp_path / "tls", IDS, tokens=True)


@pytest.fixture
def serve(tmp_path):
    servers = []

    def start(security: Security) -> tuple[Coordinator, str]:
        coord = Coordinator(CONFIG, tmp_path / f"state{len(servers)}")
        server, port = create_server(coord, "127.0.0.1:0", security=security.check("server"))
        server.start()
        servers.append(server)
        return coord, f"localhost:{port}"

    yield start
    for s in servers:
        s.stop(0)


def mtls_server(pki, **kw) -> Security:
    """The coordinator's side of mutual TLS, admitting the run's clients ``IDS`` unless ``kw`` says otherwise."""
    if not kw.get("allow_any_client") and not kw.get("token_file"):
        kw.setdefault("allowed_clients", tuple(IDS))
    return Security(ca=str(pki.ca), cert=str(pki.server_cert), key=str(pki.server_key), **kw)


def mtls_client(pki, client_id: str) -> Security:
    return Security(ca=str(pki.ca), cert=str(pki.client_cert(client_id)), key=str(pki.client_key(client_id)))


def token_client(pki, token_of: str | None) -> Security:
    return Security(ca=str(pki.ca), token_file=str(pki.client_token(token_of)) if token_of else "")


def connect(target: str, client_id: str, security: Security) -> CoordinatorClient:
    return CoordinatorClient(target, client_id, Backoff(give_up_s=3), call_timeout_s=3, security=security)


def joined_and_running(target: str, pki) -> tuple[list[CoordinatorClient], RoundPlan]:
    clients = [connect(target, c, mtls_client(pki, c)) for c in IDS]
    for i, c in enumerate(clients):
        assert c.join(i)[1] == i
        c.describe(SPEC)
    plan = clients[0].pull()
    assert isinstance(plan, RoundPlan) and plan.phase == Phase.TRAIN
    return clients, plan


def test_mutual_tls_run_accepts_each_client_as_itself(serve, pki):
    coord, target = serve(mtls_server(pki))
    clients, plan = joined_and_running(target, pki)
    for i, c in enumerate(clients):
        assert c.push(update_for(plan, i), f"k{i}") is False
    assert coord.status()["round"] == 1  # all three pushes were accepted and merged
    assert clients[0].status()["clients_joined"] == 3
    plaintext = connect(target, "c0", Security(insecure=True))
    with pytest.raises(grpc.RpcError):
        plaintext.status()  # a plaintext client cannot speak to a TLS port
    for c in clients + [plaintext]:
        c.close()


@pytest.mark.parametrize("who", ["no certificate", "certificate of another CA", "coordinator's certificate"])
def test_client_without_a_valid_certificate_cannot_connect(serve, pki, tmp_path, who):
    coord, target = serve(mtls_server(pki))
    before = snapshot(coord)
    other = create_dev_pki(tmp_path / "other", ["c0"])
    cert, key = {
        "no certificate": ("", ""),
        "certificate of another CA": (other.client_cert("c0"), other.client_key("c0")),
        "coordinator's certificate": (pki.server_cert, pki.server_key),
    }[who]
    security = Security(ca=str(pki.ca), cert=str(cert), key=str(key))
    with security.channel(target, []) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.CoordinatorStub(channel).Join(
                pb.JoinRequest(client_id="c0", wire_version=codec.WIRE_VERSION), timeout=5
            )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails: no call is made
    assert snapshot(coord) == before


def test_one_client_cannot_act_as_another(serve, pki):
    coord, target = serve(mtls_server(pki))
    impostor = connect(target, "c1", mtls_client(pki, "c0"))  # c0's certificate, c1's id in every message
    with pytest.raises(Rejected) as err:
        impostor.join(1)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED and "authenticated as client 'c0'" in str(err.value)
    assert coord.status()["clients_joined"] == 0
    clients, plan = joined_and_running(target, pki)
    impostor.run_id = CONFIG.run_id
    before = snapshot(coord)
    calls = {
        "join": lambda: impostor.join(1),
        "describe": lambda: impostor.describe(SPEC),
        "pull": impostor.pull,
        "push": lambda: impostor.push(update_for(plan, 1), "k1"),
        "report": lambda: impostor.report(
            EvalReport(run_id="sec", client_id="c1", client_index=1, task=0, correct=[1], total=[2]), "k1"
        ),
    }
    for name, call in calls.items():
        with pytest.raises(Rejected) as err:
            call()
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED, name
    with pytest.raises(Rejected) as err:  # c0's own connection, pushing c1's update
        clients[0].push(update_for(plan, 1), "k1")
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert snapshot(coord) == before  # nothing staged, nobody joined, the step unchanged
    assert clients[1].push(update_for(plan, 1), "k1") is False  # the real c1 still can
    for c in clients + [impostor]:
        c.close()


def test_identity_outside_the_allowed_set_is_refused(serve, pki):
    coord, target = serve(mtls_server(pki, allowed_clients=("c0", "c1")))
    outsider = connect(target, "c2", mtls_client(pki, "c2"))
    with pytest.raises(Rejected) as err:
        outsider.join(2)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED and "not admitted" in str(err.value)
    assert coord.status()["clients_joined"] == 0
    assert connect(target, "c0", mtls_client(pki, "c0")).join(0)[1] == 0


def test_certificates_without_an_allow_list_are_refused_unless_any_client_is_admitted_plainly(tmp_path, serve):
    """A CA vouches for every certificate it ever signed; without an allow-list any holder of
    one (here "mallory", signed by the run's CA but no client of the run) would join."""
    pki = create_dev_pki(tmp_path / "tls", [*IDS, "mallory"])
    coordinator = Coordinator(CONFIG, tmp_path / "state")
    with pytest.raises(SecurityError, match="need an allow-list: pass --allowed-clients"):
        create_server(
            coordinator,
            "127.0.0.1:0",
            security=Security(ca=str(pki.ca), cert=str(pki.server_cert), key=str(pki.server_key)),
        )
    coord, target = serve(mtls_server(pki))  # the run's clients: mallory is refused
    with pytest.raises(Rejected) as err:
        connect(target, "mallory", mtls_client(pki, "mallory")).join()
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED and "not admitted" in str(err.value)
    coord, target = serve(mtls_server(pki, allow_any_client=True))  # the operator's plain word: any holder
    assert connect(target, "mallory", mtls_client(pki, "mallory")).join()[0].run_id == CONFIG.run_id


def _empty_call(channel: grpc.Channel, method) -> grpc.StatusCode:
    path = f"/{SERVICE_NAME}/{method.name}"
    request = getattr(pb, method.input_type.name)()
    kw = dict(request_serializer=type(request).SerializeToString, response_deserializer=lambda b: b)
    try:
        if method.client_streaming:
            list([channel.stream_unary(path, **kw)(iter([request]), timeout=5)])
        elif method.server_streaming:
            list(channel.unary_stream(path, **kw)(request, timeout=5))
        else:
            channel.unary_unary(path, **kw)(request, timeout=5)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_tokens_every_call_is_authenticated(serve, pki):
    """TLS for the server only; clients authenticate with bearer tokens (TLS ending at a proxy)."""
    coord, target = serve(Security(cert=str(pki.server_cert), key=str(pki.server_key), token_file=str(pki.tokens)))
    anonymous = token_client(pki, None)
    methods = pb.DESCRIPTOR.services_by_name["Coordinator"].methods
    assert len(methods) == 7  # SecAgg among them
    with anonymous.channel(target, []) as channel:
        for method in methods:  # every method, Status included, refuses a call without a token
            assert _empty_call(channel, method) == grpc.StatusCode.UNAUTHENTICATED, method.name
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING  # health needs no identity
    wrong = Path(pki.out / "wrong.token")
    wrong.write_text("not-a-token")
    for security, code in (
        (Security(ca=str(pki.ca), token_file=str(wrong)), grpc.StatusCode.UNAUTHENTICATED),
        (token_client(pki, "c0"), grpc.StatusCode.PERMISSION_DENIED),
    ):  # c0's token, as c1
        with pytest.raises(Rejected) as err:
            connect(target, "c1", security).join(1)
        assert err.value.code == code
    assert coord.status()["clients_joined"] == 0
    for i, c in enumerate(IDS):
        client = connect(target, c, token_client(pki, c))
        assert client.join(i)[1] == i
        client.describe(SPEC)
    assert coord.status()["state"] == "running"


def test_tokens_on_plaintext_and_with_certificates(serve, pki):
    coord, target = serve(Security(token_file=str(pki.tokens), insecure=True))
    with pytest.raises(Rejected) as err:
        connect(target, "c0", Security(insecure=True)).join(0)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert connect(target, "c0", Security(token_file=str(pki.client_token("c0")), insecure=True)).join(0)[1] == 0
    coord, target = serve(mtls_server(pki, token_file=str(pki.tokens)))  # both: they must name the same client
    mixed = Security(
        ca=str(pki.ca),
        cert=str(pki.client_cert("c1")),
        key=str(pki.client_key("c1")),
        token_file=str(pki.client_token("c0")),
    )
    with pytest.raises(Rejected) as err:
        connect(target, "c1", mixed).join(1)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED and "token belongs to 'c0'" in str(err.value)
    both = Security(
        ca=str(pki.ca),
        cert=str(pki.client_cert("c1")),
        key=str(pki.client_key("c1")),
        token_file=str(pki.client_token("c1")),
    )
    assert connect(target, "c1", both).join(1)[1] == 1


# ---------------------------------------------------------------- the commands


def spawn(module: str, *args: str) -> Proc:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORM_TLS_", "LORM_TOKEN_"))}
    env |= {"PYTHONPATH": project_pythonpath(), "PYTHONUNBUFFERED": "1"}
    return Proc(module, [sys.executable, "-m", module, *args], env, ROOT)


def test_server_and_client_refuse_to_start_without_tls_or_insecure(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(CONFIG.to_json())
    server = spawn("server.main", "--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0")
    assert server.wait(timeout=60) == 2, "".join(server.lines)
    out = "".join(server.lines)
    assert "the coordinator needs TLS: pass --tls-cert FILE --tls-key FILE" in out and "--insecure" in out
    assert not (tmp_path / "state").exists()
    client = spawn("client.main", "--server", "127.0.0.1:1", "--client-id", "c0")
    assert client.wait(timeout=60) == 2, "".join(client.lines)
    out = "".join(client.lines)
    assert "the client needs the CA that signed the coordinator's certificate: pass --tls-ca FILE" in out


def test_insecure_server_warns(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(CONFIG.to_json())
    server = spawn(
        "server.main", "--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0", "--insecure"
    )
    try:
        server.wait_for("serving on")
        warning = [line for line in server.lines if "--insecure" in line]
        assert warning and "WARNING" in warning[0] and "plaintext" in warning[0], "".join(server.lines)
        assert "not authenticated" in warning[0]
    finally:
        server.kill()


# lorm-launch over mutual TLS: tests/integration/test_client_floor.py (one launched run with the clients' own files
# checks both).
