"""Who is calling: the coordinator's authentication of clients on every call.

The identity comes from the client's certificate (mutual TLS) or its bearer token, never from
the message; the servicer then checks that a message's ``client_id`` is that identity, so a
client can only act as itself. A refused call aborts before the coordinator is touched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import NoReturn

import grpc

from common.infra.tls import CLIENT_URI_SCHEME, Security, read_token_digests, token_digest

log = logging.getLogger("lorm.server.auth")


def certificate_identity(auth_context: dict[str, list[bytes]]) -> str | None:
    """The client id in a verified peer certificate: its ``lorm-client://<id>`` SAN URI, else its CN."""
    uris = {
        v.decode()[len(CLIENT_URI_SCHEME) :]
        for v in auth_context.get("x509_subject_alternative_name", [])
        if v.decode().startswith(CLIENT_URI_SCHEME)
    }
    if len(uris) > 1:
        return None  # a certificate for several clients identifies none of them
    if uris:
        return uris.pop() or None
    names = auth_context.get("x509_common_name", [])
    return names[0].decode() if len(names) == 1 and names[0] else None


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :].strip() or None
    return None


MAX_DETAILS = 2000  # status details travel in an HTTP/2 header, and clients drop headers over 8 KiB


def bounded_details(message: str) -> str:
    """``message`` cut to :data:`MAX_DETAILS` characters: refusals quote what the caller sent, which may be long."""
    if len(message) > MAX_DETAILS:
        return f"{message[:MAX_DETAILS]}... ({len(message)} characters)"
    return message


def _refuse(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    message = bounded_details(message)
    log.warning("refused a call from %s: %s: %s", context.peer(), code.name, message)
    context.abort(code, message)
    raise AssertionError("context.abort returns only by raising")


class Authenticator:
    """Checks the caller of every coordinator call against the run's security settings."""

    def __init__(self, security: Security) -> None:
        security.check_admission()  # certificates without an allow-list: refused here too, not only by the flags
        self.by_certificate = security.tls and bool(security.ca)
        digests = read_token_digests(security.token_file) if security.token_file else {}
        self.by_digest = {digest: client_id for client_id, digest in digests.items()}
        self.allowed = set(security.allowed_clients)
        self.required = self.by_certificate or bool(self.by_digest)

    def identity(self, context: grpc.ServicerContext) -> str | None:
        """The authenticated client id (``None`` when the run authenticates nobody: ``--insecure``).

        Aborts the call with UNAUTHENTICATED (no or unknown credentials) or PERMISSION_DENIED
        (credentials that disagree, or an identity not admitted to this run).
        """
        if not self.required:
            return None
        who = None
        if self.by_certificate:
            who = certificate_identity(context.auth_context())
            if who is None:
                _refuse(
                    context,
                    grpc.StatusCode.UNAUTHENTICATED,
                    "no client identity: the call needs a client "
                    f"certificate with a SAN URI {CLIENT_URI_SCHEME}<client_id> (or a CN) from the run's CA",
                )
        if self.by_digest:
            token = bearer_token(context.invocation_metadata())
            if token is None:
                _refuse(context, grpc.StatusCode.UNAUTHENTICATED, "missing 'authorization: Bearer <token>' metadata")
            holder = self.by_digest.get(token_digest(token))
            if holder is None:
                _refuse(context, grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token")
            if who is not None and who != holder:
                _refuse(
                    context,
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"the certificate names client {who!r} but the token belongs to {holder!r}",
                )
            who = holder
        if self.allowed and who not in self.allowed:
            _refuse(context, grpc.StatusCode.PERMISSION_DENIED, f"client {who!r} is not admitted to this run")
        return who

    def authorize(self, context: grpc.ServicerContext, client_id: str) -> None:
        """Abort with PERMISSION_DENIED unless the caller is ``client_id`` (a client acts only as itself)."""
        who = self.identity(context)
        if who is not None and who != client_id:
            _refuse(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"authenticated as client {who!r}, but the call is for client_id {client_id!r}",
            )


class AuthInterceptor(grpc.ServerInterceptor):
    """Authenticate every call to ``service`` before its handler runs (other services, e.g. health, pass)."""

    def __init__(self, auth: Authenticator, service: str) -> None:
        self.auth, self.prefix = auth, f"/{service}/"

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self.prefix) or not self.auth.required:
            return handler
        for kind, factory in (
            ("unary_unary", grpc.unary_unary_rpc_method_handler),
            ("unary_stream", grpc.unary_stream_rpc_method_handler),
            ("stream_unary", grpc.stream_unary_rpc_method_handler),
            ("stream_stream", grpc.stream_stream_rpc_method_handler),
        ):
            behavior = getattr(handler, kind)
            if behavior is not None:
                return factory(
                    self._guard(behavior),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    def _guard(self, behavior: Callable) -> Callable:
        def guarded(request_or_iterator, context):
            self.auth.identity(context)  # aborts an unauthenticated call: the handler never runs
            return behavior(request_or_iterator, context)

        return guarded
