"""Connection settings: nothing runs in plaintext or unauthenticated unless asked to."""

from __future__ import annotations

import argparse
import json

import pytest

from common.infra.tls import Security, SecurityError, add_security_arguments, read_token_digests, security_from_args


@pytest.fixture
def files(tmp_path):
    for name in ("ca.crt", "cert.crt", "cert.key"):
        (tmp_path / name).write_text("PEM")
    (tmp_path / "token").write_text("s3cret\n")
    (tmp_path / "tokens.json").write_text(json.dumps({"c0": "ab" * 32}))
    return {
        k: str(tmp_path / v)
        for k, v in dict(ca="ca.crt", cert="cert.crt", key="cert.key", token="token", tokens="tokens.json").items()
    }


def parse(role: str, argv: list[str]) -> Security:
    parser = argparse.ArgumentParser()
    add_security_arguments(parser, role)
    return security_from_args(parser.parse_args(argv), role)


def test_nothing_given_says_what_to_pass():
    with pytest.raises(SecurityError) as err:
        parse("server", [])
    assert all(
        flag in str(err.value)
        for flag in ("--tls-cert", "--tls-key", "--tls-ca", "--token-file", "--insecure", "lorm-certs")
    )
    with pytest.raises(SecurityError) as err:
        parse("client", [])
    assert "--tls-ca" in str(err.value) and "--insecure" in str(err.value)


def test_server_modes(files):
    mtls_flags = ["--tls-cert", files["cert"], "--tls-key", files["key"], "--tls-ca", files["ca"]]
    mtls = parse("server", mtls_flags + ["--allowed-clients", "c0"])
    assert mtls.tls and mtls.describe("server") == "TLS, clients authenticated by client certificates"
    tokens = parse(
        "server",
        [
            "--tls-cert",
            files["cert"],
            "--tls-key",
            files["key"],
            "--token-file",
            files["tokens"],
            "--allowed-clients",
            "c0, c1",
        ],
    )
    assert tokens.allowed_clients == ("c0", "c1") and "bearer tokens" in tokens.describe("server")
    assert parse("server", ["--insecure"]).describe("server") == "plaintext (no client authentication)"
    with pytest.raises(SecurityError, match="--allowed-clients needs client authentication"):
        parse("server", ["--insecure", "--allowed-clients", "c0"])
    with pytest.raises(SecurityError, match="without client authentication"):
        parse("server", ["--tls-cert", files["cert"], "--tls-key", files["key"]])
    with pytest.raises(SecurityError, match="together"):
        parse("server", ["--tls-cert", files["cert"], "--tls-ca", files["ca"]])
    with pytest.raises(SecurityError, match="contradicts"):
        parse("server", ["--insecure", "--tls-cert", files["cert"], "--tls-key", files["key"]])
    with pytest.raises(SecurityError, match="no such file: --tls-ca /nowhere"):
        parse("server", ["--tls-cert", files["cert"], "--tls-key", files["key"], "--tls-ca", "/nowhere"])


def test_client_modes(files):
    assert (
        parse("client", ["--tls-ca", files["ca"], "--tls-cert", files["cert"], "--tls-key", files["key"]]).describe(
            "client"
        )
        == "mutual TLS"
    )
    token = parse("client", ["--tls-ca", files["ca"], "--token-file", files["token"]])
    assert token.call_metadata() == (("authorization", "Bearer s3cret"),)
    with pytest.raises(SecurityError, match="no client credentials"):
        parse("client", ["--tls-ca", files["ca"]])


def test_environment_supplies_the_files(files, monkeypatch):
    monkeypatch.setenv("LORM_TLS_CA", files["ca"])
    monkeypatch.setenv("LORM_TLS_CERT", files["cert"])
    monkeypatch.setenv("LORM_TLS_KEY", files["key"])
    s = parse("client", [])
    assert (s.ca, s.cert, s.key) == (files["ca"], files["cert"], files["key"])
    with pytest.raises(SecurityError, match="contradicts"):  # plaintext is never chosen over given TLS files
        parse("client", ["--insecure"])


def test_token_files_are_checked(tmp_path):
    bad = tmp_path / "tokens.json"
    bad.write_text(json.dumps({"c0": "not-a-digest"}))
    with pytest.raises(SecurityError, match="64 lower-case hex"):
        read_token_digests(str(bad))
    bad.write_text(json.dumps({"c0": "ab" * 32, "c1": "ab" * 32}))
    with pytest.raises(SecurityError, match="share a token"):
        read_token_digests(str(bad))
    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(SecurityError, match="expected one token"):
        Security(token_file=str(empty), insecure=True).check("client")


def test_client_certificates_need_an_allow_list_or_the_operators_plain_word(files):
    """The CA vouches for every certificate it signed, so a coordinator that authenticates
    clients by certificate admits only the ids it is given, unless told that any such client may join."""
    mtls = ["--tls-cert", files["cert"], "--tls-key", files["key"], "--tls-ca", files["ca"]]
    with pytest.raises(SecurityError) as err:
        parse("server", mtls)
    assert "--allowed-clients" in str(err.value) and "--allow-any-authenticated-client" in str(err.value)
    assert parse("server", mtls + ["--allowed-clients", "c0,c1"]).allowed_clients == ("c0", "c1")
    anyone = parse("server", mtls + ["--allow-any-authenticated-client"])
    assert anyone.allow_any_client and anyone.allowed_clients == ()
    with pytest.raises(SecurityError, match="not both"):
        parse("server", mtls + ["--allowed-clients", "c0", "--allow-any-authenticated-client"])
    # A token file names its clients itself: it is the list.
    tokens = ["--tls-cert", files["cert"], "--tls-key", files["key"], "--tls-ca", files["ca"], "--token-file"]
    assert parse("server", tokens + [files["tokens"]]).allowed_clients == ()
