"""``lorm-certs``: the development CA and the certificates it signs."""

from __future__ import annotations

import ipaddress
import json
import stat

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
