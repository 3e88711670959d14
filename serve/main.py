"""``lorm-serve``: the inference server over a run's exports (uvicorn running ``serve/app.py``).

It serves the newest export under ``--models`` and replaces it when the coordinator writes a newer one.
Connections are secured with the coordinator's own flags (``common/infra/tls.py``): ``--tls-cert``/``--tls-key``
for HTTPS; ``--tls-ca`` for mutual TLS (a caller's identity is its certificate's ``lorm-client://<id>`` SAN
URI, else its CN, checked against ``--allowed-clients`` when the connection is made); ``--token-file`` for
bearer tokens; ``--insecure`` for plain HTTP on a trusted network. What requests may make it hold is bounded by
the ``--max-*`` flags of :class:`serve.app.Limits`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import ssl
import sys
from dataclasses import fields
from functools import partial
from typing import Any

import torch
import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from common.infra.logs import add_logging_arguments, setup_logging
from common.infra.tls import CLIENT_URI_SCHEME, Security, SecurityError, add_security_arguments, read_token_digests
from common.infra.tls import security_from_args as checked_security
from serve.app import Identities, Limits, create_app, flag
from serve.model import Classifier, add_source_arguments
from serve.watch import ModelSlot

log = logging.getLogger("lorm.serve")


def certificate_identity(peercert: dict[str, Any] | None) -> str | None:
    """The client id in a verified peer certificate (``ssl.SSLSocket.getpeercert()``): its
    ``lorm-client://<id>`` SAN URI, else its CN; ``None`` for none, or a certificate naming several."""
    if not peercert:
        return None
    san = peercert.get("subjectAltName", ())
    uris = {v[len(CLIENT_URI_SCHEME) :] for k, v in san if k == "URI" and v.startswith(CLIENT_URI_SCHEME)}
    if len(uris) > 1:
        return None  # a certificate for several clients identifies none of them
    if uris:
        return uris.pop() or None
    names = [v for rdn in peercert.get("subject", ()) for k, v in rdn if k == "commonName"]
    return names[0] if len(names) == 1 and names[0] else None


def admitting(identities: Identities, allowed: frozenset[str]) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, closing a connection whose certificate names no client, or one not in
    ``allowed`` (empty: any the CA signed), and recording each admitted connection's identity."""

    class Admitting(AutoHTTPProtocol):  # type: ignore[misc, valid-type]  # a class chosen at import
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            tls = transport.get_extra_info("ssl_object")
            who = certificate_identity(tls.getpeercert() if tls is not None else None)
            if who is None or (allowed and who not in allowed):
                log.warning("refused a connection from %s: client %r is not admitted", self.client, who)
                transport.close()
                return
            self.peer = self.client
            identities.by_peer[self.peer] = who

        def connection_lost(self, exc: Exception | None) -> None:
            identities.by_peer.pop(getattr(self, "peer", None), None)  # type: ignore[arg-type]
            super().connection_lost(exc)

    return Admitting


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorm-serve",
        description="Serve a run's exported model over HTTP (JSON), batching concurrent requests; "
        "a newer export in --models replaces it while serving.",
    )
    parser.add_argument(
        "--models",
        required=True,
        help="an export (a run's results/ directory, with model.json) or a folder of them: the newest is served",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (0: any free one, printed at start)")
    parser.add_argument("--max-batch", type=int, default=32, help="samples per forward pass, at most (default 32)")
    parser.add_argument(
        "--max-wait-ms", type=float, default=5.0, help="how long a sample waits for others to join its batch"
    )
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between looks for a newer export (0: never)")
    parser.add_argument("--device", default="auto", help="auto (a GPU when present), cpu, cuda, cuda:1, ...")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    add_source_arguments(parser)
    add_limit_arguments(parser)
    add_security_arguments(parser, "server")
    add_logging_arguments(parser)
    return parser


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`Limits` field, its default the field's."""
    limits = Limits()
    helps = {
        "max_body_bytes": "bytes of a request's body, at most (413 beyond)",
        "max_inputs": "sentences or images per request, at most (422 beyond)",
        "max_queue": "samples held across requests, prepared, waiting or running (503 and Retry-After beyond)",
        "max_chars": "characters per sentence, at most (422 beyond)",
        "max_image_bytes": "bytes of an image file, at most (413 beyond)",
        "max_image_pixels": "width x height of an image, read from its header before decoding (413 beyond)",
    }
    for f in fields(Limits):
        default = getattr(limits, f.name)
        parser.add_argument(flag(f.name), type=int, default=default, help=f"{helps[f.name]} (default {default})")


def limits_from_args(args: argparse.Namespace) -> Limits:
    """The limits the flags name; ``ValueError`` naming the flag for one that cannot be."""
    return Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)})


def security_from_args(args: argparse.Namespace) -> Security:
    try:
        return checked_security(args, "server")
    except SecurityError as err:  # its messages are the coordinator's; the flags are the same
        raise SecurityError(str(err).replace("the coordinator needs", "lorm-serve needs")) from err


def uvicorn_config(app: Any, security: Security, identities: Identities) -> uvicorn.Config:
    by_certificate = security.tls and bool(security.ca)
    return uvicorn.Config(
        app,
        ssl_certfile=security.cert or None,
        ssl_keyfile=security.key or None,
        ssl_ca_certs=security.ca or None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if by_certificate else ssl.CERT_NONE,
        http=admitting(identities, frozenset(security.allowed_clients)) if by_certificate else "auto",
        log_level="warning",
        access_log=False,  # a line per request costs more than a batched forward pass shares out
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_format)
    try:
        security = security_from_args(args)
    except SecurityError as err:
        parser.error(str(err))
    if args.max_batch < 1 or args.max_wait_ms < 0:
        parser.error(f"--max-batch must be >= 1 and --max-wait-ms >= 0, got {args.max_batch} and {args.max_wait_ms}")
    try:
        limits = limits_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    security.announce(log, "server")
    identities = Identities()
    slot: ModelSlot[Classifier] = ModelSlot(
        args.models, partial(Classifier, device=args.device, source=args.backbone, weights=args.weights)
    )
    app = create_app(
        slot,
        max_batch=args.max_batch,
        max_wait_s=args.max_wait_ms / 1000,
        poll_s=args.poll_s,
        token_digests=read_token_digests(security.token_file) if security.token_file else None,
        allowed=frozenset(security.allowed_clients),
        identities=identities,
        limits=limits,
    )
    server = uvicorn.Server(uvicorn_config(app, security, identities))
    listener = socket.create_server((args.host, args.port))
    host, port = listener.getsockname()[:2]
    scheme = "http" if security.insecure else "https"
    print(f"lorm-serve: listening on {scheme}://{host}:{port} (models in {args.models})", flush=True)
    server.run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
