"""lorm-serve as a process over loopback: mutual TLS and tokens as the coordinator takes them, answers equal to
the export's model, concurrent requests batched together, and a newer export served once written."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import ssl
import sys
import threading
import time
from pathlib import Path

import pytest

from serve.model import Classifier
from server.certs import Pki, create_dev_pki

from exports import CLASSES, finished_run, held_out_rows
from procs import ProjectProc as Proc

TEXTS = [text for text, _ in held_out_rows()[:8]]


def context(pki: Pki, who: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if who is not None:
        ctx.load_cert_chain(str(pki.client_cert(who)), str(pki.client_key(who)))
    return ctx


class Caller:
    """One HTTPS connection to the server, as client ``who`` (its certificate) with ``token`` (its token's owner)."""

    def __init__(self, port: int, pki: Pki, who: str | None = "app", token: str | None = "app") -> None:
        self.conn = http.client.HTTPSConnection("127.0.0.1", port, context=context(pki, who), timeout=60)
        self.headers = {"content-type": "application/json"}
        if token is not None:
            self.headers["authorization"] = f"Bearer {pki.client_token(token).read_text().strip()}"

    def __call__(self, path: str, body: dict | None = None) -> tuple[int, dict]:
        method = "GET" if body is None else "POST"
        self.conn.request(method, path, body=None if body is None else json.dumps(body), headers=self.headers)
        response = self.conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")


def start(models: Path, pki: Pki, *extra: str) -> tuple[Proc, int]:
    proc = Proc(
        "lorm-serve",
        [
            sys.executable,
            "-m",
            "serve.main",
            "--models",
            str(models),
            "--port",
            "0",
            "--threads",
            "1",
            "--tls-ca",
            str(pki.ca),
            "--tls-cert",
            str(pki.server_cert),
            "--tls-key",
            str(pki.server_key),
            "--token-file",
            str(pki.tokens),
            "--allowed-clients",
            "app",
            *extra,
        ],
    )
    port = int(re.search(r"https://127\.0\.0\.1:(\d+)", proc.wait_for("listening on")).group(1))
    return proc, port


def wait_serving(port: int, pki: Pki, version: int = 1, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, body = Caller(port, pki, token=None)("/health")
            if status == 200 and body["version"] >= version:
                return body
        except (ConnectionError, OSError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"lorm-serve on port {port} not serving version {version} within {timeout} s")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return create_dev_pki(tmp_path_factory.mktemp("tls"), ["app", "other", "outsider"], tokens=True)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> Path:
    return finished_run(tmp_path_factory.mktemp("first") / "results")


@pytest.fixture(scope="module")
def server(tmp_path_factory, pki, first_run):
    models = tmp_path_factory.mktemp("models")
    shutil.copytree(first_run, models / "first")
    proc, port = start(models, pki, "--max-batch", "8", "--max-wait-ms", "300")
    try:
        wait_serving(port, pki)
        yield port
    finally:
        proc.kill()


def test_answers_are_the_exports_predictions_over_mutual_tls(server, pki, first_run):
    status, body = Caller(server, pki)("/v1/predict", {"inputs": TEXTS})
    assert status == 200, body
    expected = Classifier(first_run).predict(TEXTS)
    assert [p["label"] for p in body["predictions"]] == [p.label for p in expected]
    assert [p["score"] for p in body["predictions"]] == pytest.approx([p.score for p in expected], rel=1e-4)
    assert body["model"] == {"run_id": "own-text", "tasks_trained": 3, "version": 1}
    status, info = Caller(server, pki)("/v1/model")
    assert status == 200 and info["classes"] == CLASSES and info["backbone"] == "tiny-bert"


def test_callers_are_admitted_as_the_coordinator_admits_clients(server, pki):
    assert Caller(server, pki, token=None)("/v1/predict", {"inputs": ["hi"]})[0] == 401  # certificate, no token
    status, body = Caller(server, pki, token="other")("/v1/predict", {"inputs": ["hi"]})
    assert status == 403 and "token belongs to 'other'" in body["detail"]
    for who in ("other", None):  # a certificate not on the allow-list; none at all
        with pytest.raises((ConnectionError, ssl.SSLError, http.client.RemoteDisconnected, OSError)):
            Caller(server, pki, who=who, token=None)("/health")
    plain = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        plain.request("GET", "/health")
        plain.getresponse().read()


def test_bad_requests_are_refused_with_the_reason(server, pki):
    status, body = Caller(server, pki)("/v1/predict", {"images": ["aGk="]})
    assert status == 422 and "classifies sentences" in body["detail"]
    assert Caller(server, pki)("/v1/predict", {"inputs": ["x" * 20_001]})[0] == 422
    assert Caller(server, pki)("/v1/predict", {"inputs": [], "images": []})[0] == 422


def test_concurrent_requests_are_answered_in_shared_batches(server, pki):
    callers = [Caller(server, pki) for _ in TEXTS]
    for c in callers:  # every connection made (and its handshake done) before the burst
        c.conn.connect()
    alone = [Caller(server, pki)("/v1/predict", {"inputs": [t]})[1]["predictions"][0] for t in TEXTS[:2]]
    before = Caller(server, pki)("/v1/model")[1]["batch_sizes"]
    answers: list = [None] * len(TEXTS)
    go = threading.Barrier(len(TEXTS))

    def ask(i: int) -> None:
        go.wait()
        answers[i] = callers[i]("/v1/predict", {"inputs": [TEXTS[i]]})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(TEXTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    after = Caller(server, pki)("/v1/model")[1]["batch_sizes"]
    ran = {int(size): n - before.get(size, 0) for size, n in after.items() if n > before.get(size, 0)}
    assert sum(size * n for size, n in ran.items()) == len(TEXTS)  # every sample, once
    assert sum(ran.values()) < len(TEXTS) and max(ran) > 1, ran  # fewer passes than requests
    assert all(status == 200 for status, _ in answers)
    together = [body["predictions"][0] for _, body in answers[:2]]
    assert [(p["label"], p["index"]) for p in together] == [(p["label"], p["index"]) for p in alone]  # its own
    assert [p["score"] for p in together] == pytest.approx([p["score"] for p in alone], rel=1e-4)  # other batch


def test_a_newer_export_is_served_once_the_coordinator_has_written_it(tmp_path, pki, first_run):
    models = tmp_path / "models"
    shutil.copytree(first_run, models / "first")
    proc, port = start(models, pki, "--poll-s", "0.3")
    try:
        wait_serving(port, pki)
        (models / "broken").mkdir()
        (models / "broken" / "model.json").write_text("{")  # a newer card that is not one: the model in use stays
        time.sleep(1.5)
        status, info = Caller(port, pki)("/v1/model")
        assert info["version"] == 1 and "broken" in info["error"]
        second = finished_run(models / "second", run_id="second", seed=7, method="fedavg")  # exported here, live
        # each task's export as the run went on (as many as the polls caught), then its last task's or final one
        deadline = time.monotonic() + 60
        while True:
            status, body = Caller(port, pki)("/v1/predict", {"inputs": TEXTS})
            model = body.get("model", {})
            if status == 200 and (model.get("run_id"), model.get("tasks_trained")) == ("second", 3):
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.3)
        assert 2 <= model["version"] <= 5  # the broken export is no version; 3 task exports and the final at most
        assert [p["label"] for p in body["predictions"]] == [p.label for p in Classifier(second).predict(TEXTS)]
    finally:
        proc.kill()
    assert "serving" in "".join(proc.lines) and "could not load the export" in "".join(proc.lines)
