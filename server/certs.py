"""``lorm-certs``: a development CA, a coordinator certificate and one certificate per client.

Layout of the output directory (keys and tokens are written with mode 0600)::

    ca.crt  ca.key                      the development CA (keep ca.key off the clients)
    coordinator.crt  coordinator.key    the coordinator's certificate (SANs: --hosts), serverAuth
    serve.crt  serve.key                with --serve-hosts: lorm-serve's own (SANs: those), serverAuth, so the
                                        inference server never holds the key clients trust the coordinator by
    clients/<id>.crt  clients/<id>.key  one per client: CN <id> and SAN URI lorm-client://<id>, clientAuth
    clients/<id>.token  tokens.json     with --tokens: a bearer token per client, and the coordinator's
                                        file of their SHA-256 digests ({client_id: hex})

The client's identity travels in its certificate, so a client can only ever act as itself.
This is a development PKI: for production, issue the same shapes from your own CA.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.infra.tls import CLIENT_URI_SCHEME, token_digest

CLIENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # fits a CN and the host part of a URI


@dataclass(frozen=True)
class Pki:
    """Paths of what :func:`create_dev_pki` wrote."""

    out: Path

    @property
    def ca(self) -> Path:
        return self.out / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.out / "coordinator.crt"

    @property
    def server_key(self) -> Path:
        return self.out / "coordinator.key"

    @property
    def serve_cert(self) -> Path:
        return self.out / "serve.crt"

    @property
    def serve_key(self) -> Path:
        return self.out / "serve.key"

    @property
    def tokens(self) -> Path:
        return self.out / "tokens.json"

    def client_cert(self, client_id: str) -> Path:
        return self.out / "clients" / f"{client_id}.crt"

    def client_key(self, client_id: str) -> Path:
        return self.out / "clients" / f"{client_id}.key"

    def client_token(self, client_id: str) -> Path:
        return self.out / "clients" / f"{client_id}.token"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())  # P-256: fast to make, supported by every TLS stack


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "LoRM development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _builder(subject: str, issuer: x509.Name, key, days: int) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # tolerate clocks a little behind
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def _leaf(subject: str, sans: list[x509.GeneralName], usage, ca_cert: x509.Certificate, ca_key, days: int):
    key = _key()
    cert = (
        _builder(subject, ca_cert.subject, key, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        # One purpose per certificate: a client's certificate cannot serve, nor the coordinator's act as a client.
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def create_dev_pki(
    out: Path | str,
    client_ids: list[str],
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
    days: int = 365,
    tokens: bool = False,
    force: bool = False,
    serve_hosts: tuple[str, ...] = (),
) -> Pki:
    """Write a development CA, a coordinator certificate for ``hosts``, one certificate per client and, with
    ``serve_hosts``, lorm-serve's own server certificate for those names.

    Refuses (``FileExistsError``) to replace any existing file unless ``force``.
    """
    pki = Pki(Path(out))
    bad = [c for c in client_ids if not CLIENT_ID.match(c)]
    if bad:
        raise ValueError(
            f"client ids must be 1-64 characters of letters, digits, '.', '_', '-' starting with a "
            f"letter or digit; got {bad}"
        )
    if len(set(client_ids)) != len(client_ids):
        raise ValueError(f"client ids must be distinct, got {client_ids}")
    if not hosts:
        raise ValueError("hosts: the coordinator's certificate needs at least one host name or IP address")
    targets = [pki.ca, pki.out / "ca.key", pki.server_cert, pki.server_key]
    targets += [pki.serve_cert, pki.serve_key] if serve_hosts else []
    for c in client_ids:
        targets += [pki.client_cert(c), pki.client_key(c)] + ([pki.client_token(c)] if tokens else [])
    targets += [pki.tokens] if tokens else []
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise FileExistsError(f"refusing to overwrite {', '.join(existing)} (pass --force to replace them)")

    ca_key = _key()
    ca_cert = (
        _builder("LoRM development CA", _name("LoRM development CA"), ca_key, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(pki.out / "ca.key", _pem_key(ca_key), private=True)
    _write(pki.ca, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)

    key, cert = _leaf(
        "lorm-coordinator", [_host_name(h) for h in hosts], ExtendedKeyUsageOID.SERVER_AUTH, ca_cert, ca_key, days
    )
    _write(pki.server_key, _pem_key(key), private=True)
    _write(pki.server_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    if serve_hosts:
        key, cert = _leaf(
            "lorm-serve", [_host_name(h) for h in serve_hosts], ExtendedKeyUsageOID.SERVER_AUTH, ca_cert, ca_key, days
        )
        _write(pki.serve_key, _pem_key(key), private=True)
        _write(pki.serve_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)

    digests = {}
    for c in client_ids:
        key, cert = _leaf(
            c,
            [x509.UniformResourceIdentifier(f"{CLIENT_URI_SCHEME}{c}")],
            ExtendedKeyUsageOID.CLIENT_AUTH,
            ca_cert,
            ca_key,
            days,
        )
        _write(pki.client_key(c), _pem_key(key), private=True)
        _write(pki.client_cert(c), cert.public_bytes(serialization.Encoding.PEM), private=False)
        if tokens:
            token = secrets.token_urlsafe(32)
            _write(pki.client_token(c), (token + "\n").encode(), private=True)
            digests[c] = token_digest(token)
    if tokens:
        _write(pki.tokens, (json.dumps(digests, indent=1) + "\n").encode(), private=True)
    return pki


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lorm-certs",
        description="Create a development CA, a coordinator "
        "certificate and one certificate (and optionally a token) per client.",
    )
    parser.add_argument("--out", required=True, help="output directory")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--clients", default="", help="comma-separated client ids, e.g. site-a,site-b")
    who.add_argument(
        "--num-clients", type=int, default=0, help="client ids client-0 .. client-(N-1) (what lorm-launch uses)"
    )
    parser.add_argument(
        "--hosts",
        default="localhost,127.0.0.1",
        help="comma-separated names and IP addresses clients dial the coordinator by",
    )
    parser.add_argument(
        "--serve-hosts",
        default="",
        help="comma-separated names and IP addresses callers reach lorm-serve by: it gets a certificate of its own "
        "(serve.crt, serve.key) instead of the coordinator's, whose key would let it pose as the coordinator",
    )
    parser.add_argument("--days", type=int, default=365, help="validity of every certificate")
    parser.add_argument(
        "--tokens",
        action="store_true",
        help="also write a bearer token per client and the coordinator's tokens.json (for TLS ending at a proxy)",
    )
    parser.add_argument("--force", action="store_true", help="replace existing files")
    args = parser.parse_args(argv)
    ids = (
        [c.strip() for c in args.clients.split(",") if c.strip()]
        if args.clients
        else [f"client-{i}" for i in range(args.num_clients)]
    )
    if not ids:
        parser.error("no client ids: pass --clients ID,ID,... or --num-clients N (N > 0)")
    serve_hosts = tuple(h.strip() for h in args.serve_hosts.split(",") if h.strip())
    try:
        pki = create_dev_pki(
            args.out,
            ids,
            tuple(h.strip() for h in args.hosts.split(",") if h.strip()),
            days=args.days,
            tokens=args.tokens,
            force=args.force,
            serve_hosts=serve_hosts,
        )
    except (FileExistsError, ValueError) as err:
        print(f"lorm-certs: {err}", file=sys.stderr)
        return 2
    served = ", lorm-serve's" if serve_hosts else ""
    print(
        f"lorm-certs: wrote a development CA, the coordinator's certificate{served} and {len(ids)} client "
        f"certificate(s) to {pki.out}"
    )
    print(f"  coordinator: --tls-ca {pki.ca} --tls-cert {pki.server_cert} --tls-key {pki.server_key}")
    if served:
        print(f"  lorm-serve: --tls-ca {pki.ca} --tls-cert {pki.serve_cert} --tls-key {pki.serve_key}")
    print(
        f"  client {ids[0]}: --tls-ca {pki.ca} --tls-cert {pki.client_cert(ids[0])} --tls-key {pki.client_key(ids[0])}"
    )
    if args.tokens:
        print(
            f"  tokens: coordinator --token-file {pki.tokens}; client {ids[0]} --token-file {pki.client_token(ids[0])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
