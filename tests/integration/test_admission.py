"""One client cannot starve the rest: calls per client and in all are bounded, idle streams are cut off."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.infra.tls import Security
from common.run.config import RunConfig
from proto import lorm_pb2_grpc as pb_grpc
from server.admission import Busy, CallLimiter, Limits
from server.service import SERVICE_NAME

CONFIG = RunConfig(
    run_id="adm",
    num_clients=1,
    num_tasks=2,
    rounds_per_task=2,
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-2,
    threads=1,
    seed=2,
    extra={"synthetic_classes": 6, "synthetic_train": 12, "synthetic_test": 4},
)
ATTACK_STREAMS = 200  # the attack as measured: 32 idle streams were enough to stop the coordinator


def test_limiter_bounds_calls_per_caller_and_in_all():
    limiter = CallLimiter(Limits(per_client=2), max_active=3)
    with limiter.slot("a"), limiter.slot("a"):
        with pytest.raises(Busy, match="'a' already has 2 calls in progress"):
            with limiter.slot("a"):
                pass
        with limiter.slot("b"):
            with pytest.raises(Busy, match="coordinator has 3 calls in progress"):
                with limiter.slot("c"):
                    pass
            assert limiter.in_progress() == 3
    assert limiter.in_progress() == 0
    with limiter.slot("a"), limiter.slot("a"):  # every slot came back, also after a refusal
        pass
    with pytest.raises(ValueError, match="must be positive"):
        Limits(per_client=0)


@pytest.mark.long(12)
def test_one_client_holding_200_idle_streams_cannot_stop_the_run_or_health(cluster):
    c = cluster(CONFIG.to_json(), extra_ids=("mallory",))  # an authenticated identity with no slot in the run
    # Serving on after the run until SIGTERM: the streams it holds are cut at their idle limit (3 s) by a live
    # server, however soon the run ends (when it exits first, a stream ends UNAVAILABLE).
    server = c.server("--stream-idle", "3", "--keep-serving")
    server.wait_for("serving on")
    mallory = Security(ca=str(c.pki.ca), cert=str(c.pki.client_cert("mallory")), key=str(c.pki.client_key("mallory")))
    release = threading.Event()

    def nothing():  # a Push stream that never sends a message
        release.wait(60)
        return
        yield

    channel = mallory.channel(f"localhost:{c.port}", [])
    stub = pb_grpc.CoordinatorStub(channel)
    attacks = [stub.Push.future(nothing(), timeout=60) for _ in range(ATTACK_STREAMS)]
    health_channel = mallory.channel(f"localhost:{c.port}", [])  # its own connection, as a probe has
    health = health_pb2_grpc.HealthStub(health_channel)
    answers, stop = [], threading.Event()

    def probe():  # health every 0.2 s, each answer within 2 s, for as long as the run goes on
        for _ in range(3000):
            if stop.is_set():
                return
            try:
                answers.append(health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=2).status)
            except grpc.RpcError as err:
                answers.append(err.code())
            time.sleep(0.2)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        client = c.client(0)
        server.wait_for(r"run adm done: FAA", timeout=240)  # the honest client's whole run, beside the attack
        stop.set()
        prober.join(timeout=30)  # health answered throughout the run
        assert client.wait(timeout=60) == 0
        codes = [a.exception(timeout=30).code() for a in attacks]
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        assert "FAA (mean over tasks, paper)" in "".join(server.lines)
    finally:
        stop.set()
        release.set()
        prober.join(timeout=30)
        channel.close()
        health_channel.close()
    refused = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert refused >= ATTACK_STREAMS - Limits.per_client  # beyond the per-client bound: refused at once
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}  # the held ones: cut off
    assert len(answers) >= 5 and set(answers) == {health_pb2.HealthCheckResponse.SERVING}


@pytest.fixture
def token_server(tmp_path):
    """A coordinator of one slot over plaintext with bearer tokens (callers are known), per-client limit 1."""
    from server.certs import create_dev_pki
    from server.coordinator import Coordinator
    from server.service import create_server

    pki = create_dev_pki(tmp_path / "tls", ["c0", "c1"], tokens=True)
    coord = Coordinator(CONFIG, tmp_path / "state")
    server, port = create_server(
        coord, "127.0.0.1:0", security=Security(token_file=str(pki.tokens), insecure=True), limits=Limits(per_client=1)
    )
    server.start()
    yield pki, f"127.0.0.1:{port}"
    server.stop(0)


def test_a_full_run_is_final_and_a_busy_client_backs_off(token_server):
    from client.transport import Backoff, CoordinatorClient, Rejected

    pki, target = token_server

    def connect(client_id: str) -> CoordinatorClient:
        security = Security(token_file=str(pki.client_token(client_id)), insecure=True)
        return CoordinatorClient(
            target, client_id, Backoff(initial_s=0.05, give_up_s=20), call_timeout_s=5, security=security
        )

    assert connect("c0").join(0)[1] == 0
    start = time.monotonic()
    with pytest.raises(Rejected) as err:  # the only slot is taken: no retry can change that
        connect("c1").join()
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "slots are taken" in str(err.value)
    assert time.monotonic() - start < 2.0
    # c0 holds its one allowed call with an idle Push; its next call is refused as busy and retried,
    # not sooner than BUSY_RETRY_MIN_S although its backoff starts at 0.05 s, until the Push ends.
    from client.transport import BUSY_RETRY_MIN_S

    held = connect("c0")
    release = threading.Event()

    def nothing():
        release.wait(30)
        return
        yield

    push = held.stub.Push.future(nothing(), metadata=held.metadata, timeout=30)
    time.sleep(0.5)  # the Push is in progress
    threading.Timer(0.5, release.set).start()
    start = time.monotonic()
    assert connect("c0").join(0)[1] == 0
    assert time.monotonic() - start >= BUSY_RETRY_MIN_S
    push.exception(timeout=10)


def test_clients_of_one_process_are_separate_callers(tmp_path):
    """Where nobody is authenticated, the coordinator's caller is the connection. Two clients in one process
    (a load test, an application embedding several) must not share one: with the per-client limit at 1 and
    the first client's only call held by an idle Push, the second joins at once, not refused as the first."""
    from client.transport import BUSY_RETRY_MIN_S, Backoff, CoordinatorClient
    from server.coordinator import Coordinator
    from server.service import create_server

    config = CONFIG.replace(num_clients=2)
    server, port = create_server(
        Coordinator(config, tmp_path / "state"),
        "127.0.0.1:0",
        security=Security(insecure=True),
        limits=Limits(per_client=1),
    )
    server.start()
    target, release = f"127.0.0.1:{port}", threading.Event()
    first, second = (
        CoordinatorClient(target, f"c{i}", Backoff(give_up_s=20), call_timeout_s=5, security=Security(insecure=True))
        for i in range(2)
    )

    def nothing():
        release.wait(30)
        return
        yield

    try:
        push = first.stub.Push.future(nothing(), timeout=30)
        time.sleep(0.5)  # the Push is in progress: the first client's one call
        start = time.monotonic()
        assert second.join(1)[1] == 1
        assert time.monotonic() - start < BUSY_RETRY_MIN_S  # never refused as busy
    finally:
        release.set()
        push.exception(timeout=10)
        first.close()
        second.close()
        server.stop(0)


@pytest.mark.long(4)
def test_a_keep_serving_coordinator_stops_cleanly_on_sigterm_before_its_run_ends(cluster):
    """``--keep-serving`` takes SIGTERM from its start (a supervisor's stop at any time, not only once it serves the
    finished run's status): mid-run it stops like an interrupt, its state on disk, and exits 128 + SIGTERM, not
    killed by the signal; a restart resumes the run."""
    c = cluster(CONFIG.to_json())
    server = c.server("--keep-serving")  # its one client never comes: the run waits in its first step
    server.wait_for("serving on")
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 128 + signal.SIGTERM
    assert "interrupted: state is on disk" in "".join(server.lines)
    again = c.server()
    again.wait_for("serving on")
    client = c.client(0)
    assert client.wait(timeout=120) == 0 and again.wait(timeout=60) == 0
