"""Connection security shared by coordinator and clients: TLS files, tokens, flags, credentials.

Three ways to run, chosen explicitly (nothing falls back to plaintext on its own):

- mutual TLS: the coordinator has a certificate and trusts a CA for client certificates;
  each client's identity is in its certificate (SAN URI ``lorm-client://<id>``, else its CN).
- tokens: each client sends ``authorization: Bearer <token>``; the coordinator keeps only the
  tokens' SHA-256 digests. For TLS that ends at a proxy in front of the coordinator, or on top
  of server-only TLS.
- ``--insecure``: plaintext, logged as a warning; without a token file nobody is authenticated.

``lorm-certs`` (``server/certs.py``) writes development files of every kind.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

CLIENT_URI_SCHEME = "lorm-client://"  # a client certificate's SAN URI: lorm-client://<client_id>
ENV = {"ca": "LORM_TLS_CA", "cert": "LORM_TLS_CERT", "key": "LORM_TLS_KEY", "token_file": "LORM_TOKEN_FILE"}
_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class SecurityError(ValueError):
    """The connection settings are incomplete or contradictory; the message says what to pass."""


def token_digest(token: str) -> str:
    """What the coordinator stores for a token: the hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(token.encode()).hexdigest()


def read_token(path: str) -> str:
    token = Path(path).read_text().strip()
    if not token or any(c.isspace() for c in token):
        raise SecurityError(
            f"--token-file {path}: expected one token (no spaces), got {'nothing' if not token else 'several words'}"
        )
    return token


def read_token_digests(path: str) -> dict[str, str]:
    """The coordinator's token file: ``{client_id: hex sha256 of that client's token}``."""
    try:
        digests = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise SecurityError(f"--token-file {path}: expected JSON {{client_id: sha256 hex}}, got {err}") from err
    if not isinstance(digests, dict) or not digests:
        raise SecurityError(f"--token-file {path}: expected a non-empty JSON object {{client_id: sha256 hex}}")
    bad = [c for c, d in digests.items() if not isinstance(d, str) or not _HEX_DIGEST.match(d)]
    if bad:
        raise SecurityError(
            f"--token-file {path}: the digests of {bad} are not 64 lower-case hex digits "
            "(sha256 of the token, e.g. `printf %s TOKEN | sha256sum`)"
        )
    if len(set(digests.values())) != len(digests):
        raise SecurityError(f"--token-file {path}: two clients share a token")
    return digests


@dataclass(frozen=True)
class Security:
    """How one side secures its connections (every path a PEM or token file)."""

    ca: str = ""  # server: CA of client certificates (turns on mutual TLS); client: CA of the coordinator
    cert: str = ""  # this side's certificate
    key: str = ""  # its private key
    token_file: str = ""  # server: JSON {client_id: sha256 hex}; client: its bearer token
    allowed_clients: tuple[str, ...] = ()  # server: the only identities admitted (a token file names its own)
    allow_any_client: bool = False  # server: admit every identity the CA vouches for, without an allow-list
    server_name: str = ""  # client: name to expect in the coordinator's certificate (default: the dialed host)
    insecure: bool = False  # plaintext, on explicit request only

    @property
    def tls(self) -> bool:
        return not self.insecure

    def check(self, role: str) -> Security:
        """Raise :class:`SecurityError` naming the flags to pass unless the settings are usable by ``role``."""
        assert role in ("server", "client"), role
        named = {"--tls-ca": self.ca, "--tls-cert": self.cert, "--tls-key": self.key, "--token-file": self.token_file}
        missing = [f"{flag} {path}" for flag, path in named.items() if path and not Path(path).is_file()]
        if missing:
            raise SecurityError(f"no such file: {', '.join(missing)}")
        if self.token_file and role == "server":  # a malformed token file fails now, not at the first call
            read_token_digests(self.token_file)
        elif self.token_file:
            read_token(self.token_file)
        if bool(self.cert) != bool(self.key):
            raise SecurityError("pass --tls-cert and --tls-key together (a certificate and its private key)")
        if self.insecure:
            if self.allowed_clients and not self.token_file:
                raise SecurityError(
                    "--allowed-clients needs client authentication, which --insecure without --token-file does not have"
                )
            if self.ca or self.cert:
                raise SecurityError(
                    "--insecure (plaintext) contradicts --tls-ca/--tls-cert/--tls-key "
                    f"(or ${ENV['ca']}/${ENV['cert']}/${ENV['key']}): pass one or the other"
                )
            return self
        if role == "server":
            if not self.cert:
                raise SecurityError(
                    "the coordinator needs TLS: pass --tls-cert FILE --tls-key FILE and --tls-ca FILE (mutual TLS: "
                    "clients present certificates from that CA) or --token-file FILE (bearer tokens); or --insecure "
                    "for plaintext on a trusted network. Development files: lorm-certs --out DIR --num-clients N"
                )
            if not self.ca and not self.token_file:
                raise SecurityError(
                    "TLS without client authentication: add --tls-ca FILE (mutual TLS) or "
                    "--token-file FILE (bearer tokens)"
                )
            self.check_admission()
        else:
            if not self.ca:
                raise SecurityError(
                    "the client needs the CA that signed the coordinator's certificate: pass --tls-ca FILE, plus "
                    "--tls-cert FILE --tls-key FILE (mutual TLS) or --token-file FILE (bearer token); or --insecure "
                    "for plaintext on a trusted network"
                )
            if not self.cert and not self.token_file:
                raise SecurityError(
                    "no client credentials: pass --tls-cert FILE --tls-key FILE (mutual TLS) or "
                    "--token-file FILE (bearer token)"
                )
        return self

    def check_admission(self) -> None:
        """A coordinator that authenticates clients by certificate needs the list of those it admits: a CA
        vouches for every certificate it ever signed, so without ``--allowed-clients`` any holder of one
        would join the run. A token file names its clients itself. ``--allow-any-authenticated-client``
        is the operator saying that every certificate of the CA may join."""
        if self.allow_any_client and self.allowed_clients:
            raise SecurityError("pass --allowed-clients or --allow-any-authenticated-client, not both")
        if self.ca and not self.insecure and not self.token_file and not self.allowed_clients:
            if not self.allow_any_client:
                raise SecurityError(
                    "clients authenticated by certificate need an allow-list: pass --allowed-clients ID,ID,... "
                    "(the client ids admitted to the run), or --allow-any-authenticated-client to admit every "
                    "certificate the CA (--tls-ca) has signed"
                )

    def describe(self, role: str) -> str:
        if self.insecure:
            auth = "bearer tokens" if self.token_file else "no client authentication"
            return f"plaintext ({auth})"
        if role == "server":
            auth = " and ".join(
                a for a, on in (("client certificates", self.ca), ("bearer tokens", self.token_file)) if on
            )
            return f"TLS, clients authenticated by {auth}"
        return "mutual TLS" if self.cert else "TLS with a bearer token"

    def announce(self, log: logging.Logger, role: str) -> None:
        """Log how connections are secured; plaintext is a warning."""
        if not self.insecure:
            log.info("connections: %s", self.describe(role))
            return
        if role == "server":
            who = (
                "clients authenticate with bearer tokens, which travel unencrypted too"
                if self.token_file
                else "clients are not authenticated: anyone who reaches the port can join, push and read the run"
            )
        else:
            who = "the coordinator is not authenticated" + (
                " and the token travels unencrypted" if self.token_file else ""
            )
        log.warning(
            "WARNING: --insecure: plaintext gRPC, updates and models travel unencrypted, %s. "
            "Use only on a trusted network.",
            who,
        )

    # ---------------------------------------------------------------- credentials

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS credentials for ``add_secure_port``; ``None`` under ``--insecure``."""
        if self.insecure:
            return None
        pair = (Path(self.key).read_bytes(), Path(self.cert).read_bytes())
        if self.ca:
            return grpc.ssl_server_credentials(
                [pair], root_certificates=Path(self.ca).read_bytes(), require_client_auth=True
            )
        return grpc.ssl_server_credentials([pair])

    def channel(self, target: str, options: Sequence[tuple[str, object]]) -> grpc.Channel:
        if self.insecure:
            return grpc.insecure_channel(target, options=options)
        creds = grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca).read_bytes(),
            private_key=Path(self.key).read_bytes() if self.key else None,
            certificate_chain=Path(self.cert).read_bytes() if self.cert else None,
        )
        if self.server_name:
            options = [*options, ("grpc.ssl_target_name_override", self.server_name)]
        return grpc.secure_channel(target, creds, options=options)

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The client's per-call metadata: its bearer token, if it has one."""
        return (("authorization", f"Bearer {read_token(self.token_file)}"),) if self.token_file else ()


# -------------------------------------------------------------------- flags


def add_security_arguments(parser: argparse.ArgumentParser, role: str) -> None:
    """The same connection flags for ``lorm-server`` (role ``server``) and ``lorm-client`` (``client``)."""
    g = parser.add_argument_group(
        "connection security (TLS files default to $LORM_TLS_CA, $LORM_TLS_CERT, $LORM_TLS_KEY, $LORM_TOKEN_FILE)"
    )
    peer = "client certificates (mutual TLS)" if role == "server" else "the coordinator's certificate"
    g.add_argument(
        "--tls-ca",
        default=os.environ.get(ENV["ca"], ""),
        metavar="FILE",
        help=f"CA certificate (PEM) that signs {peer}",
    )
    g.add_argument(
        "--tls-cert", default=os.environ.get(ENV["cert"], ""), metavar="FILE", help="this side's certificate (PEM)"
    )
    g.add_argument(
        "--tls-key", default=os.environ.get(ENV["key"], ""), metavar="FILE", help="this side's private key (PEM)"
    )
    g.add_argument(
        "--token-file",
        default=os.environ.get(ENV["token_file"], ""),
        metavar="FILE",
        help="JSON {client_id: sha256 hex of its token}: clients authenticate with bearer tokens"
        if role == "server"
        else "file holding this client's bearer token",
    )
    if role == "server":
        g.add_argument(
            "--allowed-clients",
            default="",
            metavar="IDS",
            help="comma-separated client ids admitted to the run (needed with --tls-ca unless "
            "--allow-any-authenticated-client; with --token-file: the ids it names)",
        )
        g.add_argument(
            "--allow-any-authenticated-client",
            action="store_true",
            help="with --tls-ca and no --allowed-clients: admit every client certificate the CA has signed",
        )
    else:
        g.add_argument(
            "--tls-server-name",
            default="",
            metavar="NAME",
            help="name to expect in the coordinator's certificate (default: the host in --server)",
        )
    g.add_argument(
        "--insecure", action="store_true", help="plaintext connections (logged as a warning); only on a trusted network"
    )


def security_from_args(args: argparse.Namespace, role: str) -> Security:
    """The checked settings from :func:`add_security_arguments`' flags; :class:`SecurityError` if unusable."""
    allowed = tuple(c.strip() for c in getattr(args, "allowed_clients", "").split(",") if c.strip())
    return Security(
        ca=args.tls_ca,
        cert=args.tls_cert,
        key=args.tls_key,
        token_file=args.token_file,
        allowed_clients=allowed,
        allow_any_client=getattr(args, "allow_any_authenticated_client", False),
        server_name=getattr(args, "tls_server_name", ""),
        insecure=args.insecure,
    ).check(role)
