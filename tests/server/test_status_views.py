"""What Status tells whom: a client reads run-level progress and its own figures; the
history's per-step sample counts, dropped lists and the robust mode's per-client cosines and ratios
reach only the operator, through ``Operator/OperatorStatus`` and the operator's token."""

from __future__ import annotations

import json
import logging
import math
import threading

import grpc
import pytest

from common.infra.tls import Security, token_digest
from proto import lorm_pb2 as pb
from server.admin import main as admin
from server.coordinator import Coordinator
from server.operator import OperatorAuth
from server.service import create_server
from server.telemetry import CoordinatorMetrics, coordinator_status

from unit_helpers import LORA_SPEC, unit_config, valid_update

CLIENTS = ("c0", "c1", "c2")
OPERATOR_TOKEN = "operator-secret-0123456789"
STATUS = "/lorm.v1.Coordinator/Status"
OPERATOR_STATUS = "/lorm.v1.Operator/OperatorStatus"
# What a secure step records (server.secure.secagg_report): with a later step whose survivors differ,
# its sample count gives the dropped client's shard size.
SECURE_ENTRY = {"task": 0, "round": 1, "phase": "train", "secagg": {"survivors": 2, "samples": 4321, "dropped": [2]}}
PRIVATE_WORDS = ("history", "robust", "cosine", "ratio", "samples", "dropped", "secagg", "4321")


def robust_run(tmp_path) -> Coordinator:
    """Three clients' first step, screened by the robust mode (its history entry holds every client's
    cosine and ratio), and the entry of a secure step after it."""
    config = unit_config(run_id="views", num_tasks=1, rounds_per_task=2, settings={"robust": {"enabled": True}})
    coord = Coordinator(config, tmp_path / "state")
    for i, client_id in enumerate(CLIENTS):
        coord.join(client_id, i)
        coord.describe(client_id, LORA_SPEC)
    step = coord.step
    assert step is not None and step.aggregator is not None
    for i in range(len(CLIENTS)):
        assert coord.submit(valid_update(step.plan, step.aggregator.expected(), i, seed=i), f"k{i}")
    assert coord.run.history and "cosine" in json.dumps(coord.run.history[0]["robust"])  # the step was screened
    coord.run.history.append(SECURE_ENTRY)
    return coord


@pytest.fixture
def served(tmp_path):
    """The run behind a server with bearer tokens (one per client) and the operator's token."""
    coord = robust_run(tmp_path)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({c: token_digest(f"token-{c}") for c in CLIENTS}))
    digest = tmp_path / "operator.sha256"
    digest.write_text(token_digest(OPERATOR_TOKEN) + "\n")
    server, port = create_server(
        coord,
        "127.0.0.1:0",
        security=Security(token_file=str(tokens), insecure=True),
        operator=OperatorAuth.from_file(str(digest)),
    )
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield coord, channel, port
    channel.close()
    server.stop(0)


def call(channel: grpc.Channel, method: str, token: str | None) -> pb.RunStatus:
    stub = channel.unary_unary(
        method, request_serializer=pb.StatusRequest.SerializeToString, response_deserializer=pb.RunStatus.FromString
    )
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    return stub(pb.StatusRequest(run_id="views"), timeout=10, metadata=metadata)


def test_a_clients_status_holds_its_own_figures_and_no_other_clients(served):
    coord, channel, _ = served
    reply = call(channel, STATUS, "token-c1")
    metrics = json.loads(reply.metrics_json)
    assert (reply.run_id, reply.state, reply.clients_joined) == ("views", "running", 3)
    assert (reply.task, reply.round) == (0, 1)  # run-level progress: the step after the screened one
    assert metrics["accuracy"] == coord.run.matrix.accuracy()  # the run's own published result
    assert metrics["client"] == {"client_id": "c1", "index": 1, "submitted": False}
    leaked = [w for w in PRIVATE_WORDS if w in reply.metrics_json]
    assert not leaked, f"a client's Status should hold no other client's figures, but it names {leaked}"


def test_the_operators_status_needs_the_operators_token(served):
    coord, channel, _ = served
    reply = call(channel, OPERATOR_STATUS, OPERATOR_TOKEN)
    history = json.loads(reply.metrics_json)["history"]
    assert history == json.loads(json.dumps(coord.run.history[-5:]))
    assert set(history[0]["robust"]["clients"]) == {"0", "1", "2"} and history[1] == SECURE_ENTRY
    for token, code in (
        ("token-c1", grpc.StatusCode.PERMISSION_DENIED),  # a client's own token is not the operator's
        ("not-the-token", grpc.StatusCode.PERMISSION_DENIED),
        (None, grpc.StatusCode.UNAUTHENTICATED),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call(channel, OPERATOR_STATUS, token)
        assert err.value.code() == code, (token, err.value.details())
        assert "history" not in (err.value.details() or "")


def test_without_an_operator_credential_the_operators_status_is_refused(tmp_path):
    coord = robust_run(tmp_path)
    server, port = create_server(coord, "127.0.0.1:0", security=Security(insecure=True))
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                call(channel, OPERATOR_STATUS, OPERATOR_TOKEN)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "--operator-digest-file" in err.value.details()
            public = call(channel, STATUS, None)  # nobody is authenticated: run-level progress only
    finally:
        server.stop(0)
    assert set(json.loads(public.metrics_json)) == {"accuracy"}


def test_lorm_admin_status_prints_the_operators_view(served, tmp_path, capsys):
    coord, _, port = served
    token = tmp_path / "operator.token"
    token.write_text(OPERATOR_TOKEN + "\n")
    target = ["status", "--target", f"127.0.0.1:{port}", "--insecure"]
    assert admin(target + ["--operator-token-file", str(token)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run_id"] == "views" and shown["state"] == "running" and shown["phase"] == "train"
    assert shown["metrics"]["history"][1] == SECURE_ENTRY
    wrong = tmp_path / "wrong.token"
    wrong.write_text("token-c0")
    assert admin(target + ["--operator-token-file", str(wrong)]) == 2
    assert "PERMISSION_DENIED" in capsys.readouterr().err


def test_the_operator_token_file_holds_one_digest(tmp_path):
    digest = tmp_path / "operator.sha256"
    digest.write_text(OPERATOR_TOKEN)  # the token itself, not its digest
    with pytest.raises(ValueError, match="64 lower-case hex digits"):
        OperatorAuth.from_file(str(digest))


def test_coordinator_metrics_publish_no_per_client_figures(tmp_path):
    """/metrics of the coordinator listens on its --host, which clients reach: no per-client sample
    counts, losses, cosines or ratios, and no metric labelled by client."""
    coord = robust_run(tmp_path)
    metrics = CoordinatorMetrics(lambda: coordinator_status(coord))
    metrics.heard_from("c0")
    metrics.merged("train", 0.5)
    families = list(metrics.registry.collect())
    names = {s.name for f in families for s in f.samples}
    labels = {k for f in families for s in f.samples for k in s.labels}
    assert not [n for n in names if any(w in n for w in ("sample", "loss", "cosine", "ratio", "dropped"))], names
    assert labels <= {"run_id", "state", "method", "reason", "phase", "le"}, labels


def test_under_mutual_tls_the_operators_view_needs_the_token_beside_a_certificate(tmp_path, capsys):
    """The handshake wants a certificate of the run's CA; the operator's is no client's (not on the
    allow-list), and a client's certificate without the operator's token reads nothing."""
    from server.certs import create_dev_pki

    pki = create_dev_pki(tmp_path / "tls", [*CLIENTS, "operator"])
    coord = robust_run(tmp_path)
    security = Security(ca=str(pki.ca), cert=str(pki.server_cert), key=str(pki.server_key), allowed_clients=CLIENTS)
    server, port = create_server(
        coord, "127.0.0.1:0", security=security, operator=OperatorAuth(token_digest(OPERATOR_TOKEN))
    )
    server.start()
    token, wrong = tmp_path / "operator.token", tmp_path / "wrong.token"
    token.write_text(OPERATOR_TOKEN)
    wrong.write_text("token-c1")

    def status(who: str | None, token_file) -> int:
        tls = ["--tls-ca", str(pki.ca)]
        if who is not None:
            tls += ["--tls-cert", str(pki.client_cert(who)), "--tls-key", str(pki.client_key(who))]
        return admin(
            [
                "status",
                "--target",
                f"127.0.0.1:{port}",
                "--timeout",
                "5",
                *tls,
                "--operator-token-file",
                str(token_file),
            ]
        )

    try:
        assert status("operator", token) == 0
        assert json.loads(capsys.readouterr().out)["metrics"]["history"][1] == SECURE_ENTRY
        assert status("c1", wrong) == 2 and "PERMISSION_DENIED" in capsys.readouterr().err
        assert status(None, token) == 2 and "UNAVAILABLE" in capsys.readouterr().err  # no certificate: no handshake
    finally:
        server.stop(0)


def test_a_flood_of_refused_operator_calls_is_logged_once_a_minute_and_admitted_like_any_call(served, caplog):
    """Every refused Operator call was logged, and the Operator service bypassed admission: a caller with a wrong
    token could fill the log and the pool. The refusals are now one line a minute with a count of the rest, and the
    service's calls take slots of their own (one at a time per caller) out of the pool's reserve."""
    from server.operator import REFUSALS, RefusalLog

    _, channel, _ = served
    clock = [1000.0]
    log = RefusalLog(every_s=60.0, clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="lorm.server.operator"):
        assert log.refused("peer", "PERMISSION_DENIED", "no") and not log.refused("peer", "PERMISSION_DENIED", "no")
        clock[0] += 61.0
        assert log.refused("peer", "PERMISSION_DENIED", "no")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "(1 more refused in the last 60 s" in lines[1]
    caplog.clear()
    REFUSALS.last = -math.inf  # a quiet spell before the flood
    with caplog.at_level(logging.WARNING, logger="lorm.server.operator"):
        for _ in range(50):
            with pytest.raises(grpc.RpcError):
                call(channel, OPERATOR_STATUS, "not-the-token")
    assert len([r for r in caplog.records if "refused an operator call" in r.getMessage()]) == 1
    assert json.loads(call(channel, OPERATOR_STATUS, OPERATOR_TOKEN).metrics_json)["history"]  # the operator still


def test_operator_calls_take_admission_slots_one_at_a_time_per_caller(tmp_path, monkeypatch):
    """A caller whose Operator call is still in progress gets RESOURCE_EXHAUSTED for a second one at once, instead
    of a second pool thread."""
    from server.service import OperatorServicer

    inside, release = threading.Event(), threading.Event()
    honest = OperatorServicer.OperatorStatus

    def slow(self, request, context):  # type: ignore[no-untyped-def]
        inside.set()
        release.wait(10)
        return honest(self, request, context)

    monkeypatch.setattr(OperatorServicer, "OperatorStatus", slow)
    coord = robust_run(tmp_path)
    digest = tmp_path / "operator.sha256"
    digest.write_text(token_digest(OPERATOR_TOKEN) + "\n")
    server, port = create_server(
        coord, "127.0.0.1:0", security=Security(insecure=True), operator=OperatorAuth.from_file(str(digest))
    )
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            first = threading.Thread(target=call, args=(channel, OPERATOR_STATUS, OPERATOR_TOKEN))
            first.start()
            assert inside.wait(10)
            with pytest.raises(grpc.RpcError) as err:
                call(channel, OPERATOR_STATUS, OPERATOR_TOKEN)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            release.set()
            first.join(10)
            assert call(channel, OPERATOR_STATUS, OPERATOR_TOKEN).run_id == "views"  # admitted again
    finally:
        release.set()
        server.stop(0)
