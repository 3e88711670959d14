"""lorm-health: exit 0 only when the coordinator's own health service answers SERVING."""

from __future__ import annotations

import pytest

from common.infra.tls import Security
from common.run.config import RunConfig
from server.certs import create_dev_pki
from server.coordinator import Coordinator
from server.health import main as health
from server.service import create_server


@pytest.fixture
def pki(tmp_path):
    return create_dev_pki(tmp_path / "certs", ["client-0", "health"])


def serve(tmp_path, security: Security):
    coordinator = Coordinator(RunConfig(run_id="h"), tmp_path / "state")
    server, port = create_server(coordinator, "127.0.0.1:0", security=security)
    server.start()
    return server, port


def test_plaintext_probe(tmp_path):
    server, port = serve(tmp_path, Security(insecure=True))
    try:
        assert health(["--target", f"127.0.0.1:{port}", "--insecure"]) == 0
        assert health(["--target", f"127.0.0.1:{port}", "--insecure", "--service", "lorm.v1.Coordinator"]) == 0
        assert health(["--target", f"127.0.0.1:{port}", "--insecure", "--service", "no.such.Service"]) == 2
    finally:
        server.stop(0).wait()
    assert health(["--target", f"127.0.0.1:{port}", "--insecure", "--timeout", "1"]) == 2  # nothing listens


def test_mutual_tls_probe_needs_a_certificate_from_the_ca(tmp_path, pki):
    # The probe's certificate is not among the run's clients: the health service needs none of theirs.
    admitted = ("client-0",)
    server, port = serve(
        tmp_path,
        Security(ca=str(pki.ca), cert=str(pki.server_cert), key=str(pki.server_key), allowed_clients=admitted),
    )
    target = ["--target", f"127.0.0.1:{port}", "--timeout", "5", "--tls-ca", str(pki.ca)]
    try:
        assert (
            health(target + ["--tls-cert", str(pki.client_cert("health")), "--tls-key", str(pki.client_key("health"))])
            == 0
        )
        assert health(target) == 2  # the TLS handshake itself wants a client certificate
        assert health(["--target", f"127.0.0.1:{port}", "--insecure", "--timeout", "2"]) == 2
    finally:
        server.stop(0).wait()


def test_probe_without_tls_files_or_insecure_says_what_to_pass(monkeypatch):
    for var in ("LORM_TLS_CA", "LORM_TLS_CERT", "LORM_TLS_KEY", "LORM_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit, match="--tls-ca FILE"):
        health(["--target", "127.0.0.1:1"])
