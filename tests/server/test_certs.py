"""``lorm-certs``: the development CA and the certificates it signs."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import ssl
import stat
import threading

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.infra.tls import token_digest
from server.auth import certificate_identity
from server.certs import create_dev_pki, main


def load(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_ca_signs_a_coordinator_and_one_certificate_per_client(tmp_path):
    pki = create_dev_pki(tmp_path / "tls", ["site-a", "site-b"], hosts=("coord.example", "10.0.0.7"), tokens=True)
    ca = load(pki.ca)
    server = load(pki.server_cert)
    server.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["coord.example"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    assert list(server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    digests = json.loads(pki.tokens.read_text())
    for client in ("site-a", "site-b"):
        cert = load(pki.client_cert(client))
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == client
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier
        )
        assert uris == [f"lorm-client://{client}"]
        assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
            ExtendedKeyUsageOID.CLIENT_AUTH
        ]
        assert digests[client] == token_digest(pki.client_token(client).read_text().strip())
    assert digests["site-a"] != digests["site-b"]
    for secret in [
        pki.out / "ca.key",
        pki.server_key,
        pki.client_key("site-a"),
        pki.client_token("site-a"),
        pki.tokens,
    ]:
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert stat.S_IMODE(pki.ca.stat().st_mode) == 0o644


def handshake(cert, key, ca, dialled: str) -> None:
    """A TLS handshake over loopback: a server presenting ``cert``, a client that trusts ``ca`` and dials the
    name ``dialled`` (the client's verification raises ``ssl.SSLCertVerificationError`` on a name not in it)."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)

        def accept() -> None:
            conn, _ = listener.accept()
            with contextlib.suppress(ssl.SSLError, OSError), server_ctx.wrap_socket(conn, server_side=True):
                pass

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=10) as raw:
                with client_ctx.wrap_socket(raw, server_hostname=dialled):
                    pass
        finally:
            thread.join(timeout=10)


def test_lorm_serve_gets_a_certificate_of_its_own_that_cannot_pose_as_the_coordinator(tmp_path):
    """With --serve-hosts, lorm-serve's certificate is a server certificate for those names, with its own key: a
    client that dials the coordinator refuses it (the attack: an inference server holding the coordinator's key
    could answer the clients as the coordinator), and a caller of lorm-serve accepts it."""
    pki = create_dev_pki(tmp_path, ["c0"], hosts=("coordinator",), serve_hosts=("serve", "10.0.0.8"))
    serve = load(pki.serve_cert)
    serve.verify_directly_issued_by(load(pki.ca))
    sans = serve.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["serve"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.8")]
    assert list(serve.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    assert serve.public_key() != load(pki.server_cert).public_key()
    assert stat.S_IMODE(pki.serve_key.stat().st_mode) == 0o600
    handshake(pki.serve_cert, pki.serve_key, pki.ca, "serve")
    handshake(pki.server_cert, pki.server_key, pki.ca, "coordinator")
    with pytest.raises(ssl.SSLCertVerificationError, match="coordinator"):
        handshake(pki.serve_cert, pki.serve_key, pki.ca, "coordinator")
    plain = create_dev_pki(tmp_path / "other", ["c0"])  # without --serve-hosts: none written
    assert not plain.serve_cert.exists() and not plain.serve_key.exists()


def test_refuses_to_overwrite_without_force(tmp_path):
    pki = create_dev_pki(tmp_path, ["c0"])
    before = pki.ca.read_bytes()
    with pytest.raises(FileExistsError, match="--force"):
        create_dev_pki(tmp_path, ["c0"])
    assert pki.ca.read_bytes() == before
    create_dev_pki(tmp_path, ["c0"], force=True)
    assert pki.ca.read_bytes() != before  # a new CA


def test_command_line(tmp_path, capsys):
    out = tmp_path / "dev"
    assert main(["--out", str(out), "--num-clients", "2"]) == 0
    assert (out / "clients" / "client-1.crt").is_file() and not (out / "tokens.json").exists()
    assert "--tls-cert" in capsys.readouterr().out
    assert main(["--out", str(tmp_path / "served"), "--num-clients", "1", "--serve-hosts", "serve,127.0.0.1"]) == 0
    assert f"lorm-serve: --tls-ca {tmp_path / 'served' / 'ca.crt'}" in capsys.readouterr().out
    assert (tmp_path / "served" / "serve.crt").is_file() and (tmp_path / "served" / "serve.key").is_file()
    assert main(["--out", str(out), "--num-clients", "2"]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert main(["--out", str(tmp_path / "bad"), "--clients", "a b"]) == 2
    assert "client ids" in capsys.readouterr().err


def test_identity_is_the_uri_san_else_the_common_name():
    assert (
        certificate_identity(
            {"x509_subject_alternative_name": [b"lorm-client://c1", b"other.example"], "x509_common_name": [b"c9"]}
        )
        == "c1"
    )
    assert certificate_identity({"x509_common_name": [b"c9"]}) == "c9"
    assert (
        certificate_identity(
            {"x509_subject_alternative_name": [b"lorm-client://c1", b"lorm-client://c2"], "x509_common_name": [b"c1"]}
        )
        is None
    )
    assert certificate_identity({}) is None
