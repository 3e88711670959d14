"""The operator's commands to an open run over gRPC: ``Operator/AddTask`` and ``Operator/Finish``
behind the operator's bearer token (none: UNAUTHENTICATED; another: PERMISSION_DENIED; a coordinator without
the credential: FAILED_PRECONDITION), a refused task named back to the operator, and ``lorm-admin add-task`` /
``finish``. A client that joins after the task was appended is told the longer schedule."""

from __future__ import annotations

import json
import socket
import threading

import grpc
import pytest

from common.infra.tls import Security, token_digest
from proto import codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc
from server.admin import main as admin
from server.operator import OperatorAuth
from server.run_state import State
from server.service import create_server

from test_open_schedule import play, started

TOKEN = "operator-secret-0123456789"


@pytest.fixture
def served(tmp_path):
    """An open run idle past its first task, behind a plaintext server with the operator's token."""
    coord = started(tmp_path)
    play(coord)
    server, port = create_server(
        coord, "127.0.0.1:0", security=Security(insecure=True), operator=OperatorAuth(token_digest(TOKEN))
    )
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield coord, pb_grpc.OperatorStub(channel), port
    channel.close()
    server.stop(0)


def auth(token: str | None):
    return (("authorization", f"Bearer {token}"),) if token else None


def test_the_operators_commands_need_the_operators_token(served):
    coord, stub, _ = served
    for token, code in ((None, grpc.StatusCode.UNAUTHENTICATED), ("wrong", grpc.StatusCode.PERMISSION_DENIED)):
        with pytest.raises(grpc.RpcError) as err:
            stub.AddTask(pb.AddTaskRequest(classes=["c"]), timeout=10, metadata=auth(token))
        assert err.value.code() == code
        with pytest.raises(grpc.RpcError) as err:
            stub.Finish(pb.FinishRequest(), timeout=10, metadata=auth(token))
        assert err.value.code() == code
    assert coord.run.current_schedule() == [["a", "b"]] and coord.run.state == State.IDLE


def test_add_task_appends_and_answers_the_schedule_and_refuses_a_bad_task_by_name(served):
    coord, stub, _ = served
    reply = stub.AddTask(pb.AddTaskRequest(run_id="unit", classes=["c", "d"]), timeout=10, metadata=auth(TOKEN))
    assert reply.task == 1 and codec.schedule_from_proto(reply.tasks) == [["a", "b"], ["c", "d"]]
    assert coord.run.state == State.RUNNING
    with pytest.raises(grpc.RpcError) as err:
        stub.AddTask(pb.AddTaskRequest(classes=["d", "e"]), timeout=10, metadata=auth(TOKEN))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'d' (task 1)" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.AddTask(pb.AddTaskRequest(run_id="other", classes=["e"]), timeout=10, metadata=auth(TOKEN))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # A client joining now is told the longer schedule, and a configuration that cuts it.
    config, schedule = coord.joined()
    assert schedule == [["a", "b"], ["c", "d"]] and (config.num_tasks, config.task_sizes) == (2, [2, 2])


def test_without_an_operator_credential_the_commands_are_refused(tmp_path):
    coord = started(tmp_path)
    server, port = create_server(coord, "127.0.0.1:0", security=Security(insecure=True))
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                stub = pb_grpc.OperatorStub(channel)
                stub.AddTask(pb.AddTaskRequest(classes=["c"]), timeout=10, metadata=auth(TOKEN))
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        server.stop(0)


def test_lorm_admin_add_task_and_finish(served, tmp_path, capsys):
    coord, _, port = served
    token = tmp_path / "operator.token"
    token.write_text(TOKEN + "\n")
    target = ["--target", f"127.0.0.1:{port}", "--insecure", "--operator-token-file", str(token)]
    assert admin(["add-task", "--classes", "c, d", *target]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == {"task": 1, "schedule": [["a", "b"], ["c", "d"]]} and len(out.splitlines()) == 1
    assert admin(["add-task", "--classes", "c,,e", *target]) == 2  # refused before any call
    assert "--classes" in capsys.readouterr().err
    assert admin(["add-task", "--classes", "z" * 3 + ",a", *target]) == 2
    assert "INVALID_ARGUMENT" in capsys.readouterr().err and coord.run.current_schedule()[-1] == ["c", "d"]
    play(coord)
    assert admin(["finish", *target]) == 0
    assert coord.run.state == State.DONE and coord.done.is_set()
    assert admin(["finish", *target]) == 2
    assert "FAILED_PRECONDITION" in capsys.readouterr().err


def test_lorm_admin_token_makes_a_credential_the_coordinator_reads_and_replaces_nothing(tmp_path, capsys):
    out = tmp_path / "ops" / "operator.token"
    assert admin(["token", "--out", str(out)]) == 0 and str(out) in capsys.readouterr().out
    token = out.read_text().strip()
    assert len(token) == 64 and out.stat().st_mode & 0o777 == 0o600
    assert OperatorAuth.from_file(str(out) + ".sha256").digest == token_digest(token)
    assert admin(["token", "--out", str(out)]) == 2 and "--force" in capsys.readouterr().err
    assert out.read_text().strip() == token
    assert admin(["token", "--out", str(out), "--force"]) == 0 and out.read_text().strip() != token


def test_lorm_admin_wait_reaches_a_coordinator_that_starts_after_the_call(tmp_path, capsys):
    """``--wait``: the call waits for the coordinator (a walk-through starts both at once); without it a
    coordinator not serving yet is UNAVAILABLE at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = tmp_path / "operator.token"
    token.write_text(TOKEN + "\n")
    target = ["--target", f"127.0.0.1:{port}", "--insecure", "--operator-token-file", str(token)]
    assert admin(["status", *target, "--timeout", "1"]) == 2 and "UNAVAILABLE" in capsys.readouterr().err

    coord = started(tmp_path)
    server, _ = create_server(
        coord, f"127.0.0.1:{port}", security=Security(insecure=True), operator=OperatorAuth(token_digest(TOKEN))
    )
    timer = threading.Timer(1.0, server.start)
    timer.start()
    try:
        assert admin(["add-task", "--classes", "c", "--wait", "--timeout", "30", *target]) == 0
        assert json.loads(capsys.readouterr().out)["schedule"] == [["a", "b"], ["c"]]
    finally:
        timer.join()
        server.stop(0)


def test_lorm_admin_reads_its_token_file_from_lorm_admin_token_file_and_the_old_name_with_a_warning(
    served, tmp_path, monkeypatch, capsys
):
    """``$LORM_ADMIN_TOKEN_FILE``; its old name ``$LORM_OPERATOR_TOKEN`` with a warning naming it; both, set to
    different files: refused before any call."""
    token, other = tmp_path / "operator.token", tmp_path / "other.token"
    token.write_text(TOKEN + "\n")
    other.write_text("another-operator-token\n")
    target = ["--target", f"127.0.0.1:{served[2]}", "--insecure"]
    monkeypatch.delenv("LORM_OPERATOR_TOKEN", raising=False)
    monkeypatch.setenv("LORM_ADMIN_TOKEN_FILE", str(token))
    assert admin(["add-task", "--classes", "c", *target]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["schedule"] == [["a", "b"], ["c"]] and "warning" not in out.err

    monkeypatch.delenv("LORM_ADMIN_TOKEN_FILE")
    monkeypatch.setenv("LORM_OPERATOR_TOKEN", str(token))
    assert admin(["add-task", "--classes", "d", *target]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["task"] == 2
    assert (
        "lorm-admin: warning: $LORM_OPERATOR_TOKEN is the old name of $LORM_ADMIN_TOKEN_FILE: set "
        "$LORM_ADMIN_TOKEN_FILE instead ($LORM_OPERATOR_TOKEN is read for now)"
    ) in out.err.splitlines()

    monkeypatch.setenv("LORM_ADMIN_TOKEN_FILE", str(other))
    assert admin(["add-task", "--classes", "e", *target]) == 2  # refused before any call: no task appended
    assert f"lorm-admin add-task: $LORM_ADMIN_TOKEN_FILE='{other}' and $LORM_OPERATOR_TOKEN=" in capsys.readouterr().err
    assert admin(["add-task", "--classes", "e", *target, "--operator-token-file", str(token)]) == 0  # the flag wins
    assert json.loads(capsys.readouterr().out)["schedule"] == [["a", "b"], ["c"], ["d"], ["e"]]
