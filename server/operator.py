"""The operator's credential: who may read the run's full status (``Operator/OperatorStatus``).

A client's ``Status`` holds run-level progress and its own figures only. The recent history (per-step
sample counts and dropped clients of secure aggregation, the robust mode's per-client cosines and
ratios) would let one client learn another's shard size by differencing two steps, or calibrate a
poisoned update just under the bounds, so it goes to the operator alone.

The operator holds a bearer token that no client is given; the coordinator keeps only its SHA-256
digest (``--operator-digest-file``: one line of 64 hex digits, ``printf %s TOKEN | sha256sum``). A
token rather than a certificate identity: it works the same under mutual TLS, client tokens or
plaintext, and under mutual TLS every certificate from the run's CA is a client's, so an "operator"
certificate would be one more thing the CA must never issue to a client by mistake. The token
travels as ``authorization: Bearer <token>`` on the Operator service, which the clients' service's
authentication does not intercept; under mutual TLS the operator's connection still needs a
certificate from the run's CA for the handshake (as ``lorm-health``'s does).
"""

from __future__ import annotations

import argparse
import hmac
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import grpc

from common.infra.environ import renamed_variable
from common.infra.tls import token_digest
from server.auth import bearer_token

log = logging.getLogger("lorm.server.operator")
ENV_DIGEST_FILE = "LORM_OPERATOR_DIGEST_FILE"  # the path of the file holding the token's digest
OLD_ENV_DIGEST_FILE = "LORM_OPERATOR_TOKEN_FILE"  # its former name, still read (with a warning)
_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class RefusalLog:
    """Refused operator calls, logged at most once every ``every_s`` seconds: the first refusal of a quiet spell as
    it came, the others counted and named in the next line logged. A caller that floods the Operator service with
    bad tokens fills no disk and buries no other line."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.lock = threading.Lock()
        self.last = -math.inf
        self.suppressed = 0

    def refused(self, peer: str, code: str, message: str) -> bool:
        """Log this refusal unless one was logged in the last ``every_s`` seconds; whether it was logged."""
        with self.lock:
            now = self.clock()
            if now - self.last < self.every_s:
                self.suppressed += 1
                return False
            more, self.suppressed, self.last = self.suppressed, 0, now
        also = f" ({more} more refused in the last {self.every_s:g} s, not logged one by one)" if more else ""
        log.warning("refused an operator call from %s: %s: %s%s", peer, code, message, also)
        return True


REFUSALS = RefusalLog()


def _refuse(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    REFUSALS.refused(context.peer(), code.name, message)
    context.abort(code, message)
    raise AssertionError("context.abort returns only by raising")


@dataclass(frozen=True)
class OperatorAuth:
    """The operator's token, as the hex SHA-256 digest the coordinator keeps of it."""

    digest: str

    def __post_init__(self) -> None:
        if not _HEX_DIGEST.match(self.digest):
            raise ValueError(
                f"the operator's token digest must be 64 lower-case hex digits (sha256 of the token), "
                f"got {len(self.digest)} characters"
            )

    @classmethod
    def from_file(cls, path: str) -> OperatorAuth:
        """Read ``--operator-digest-file``: one line, the hex SHA-256 of the operator's token."""
        text = Path(path).read_text().strip()
        try:
            return cls(text)
        except ValueError as err:
            raise ValueError(
                f"--operator-digest-file {path}: expected one line of 64 lower-case hex digits (the token's sha256, "
                f"`printf %s TOKEN | sha256sum`), got {len(text)} characters"
            ) from err

    def authorize(self, context: grpc.ServicerContext) -> None:
        """Abort the call unless it carries the operator's token: UNAUTHENTICATED without a bearer
        token, PERMISSION_DENIED with another one (a client's own token included)."""
        token = bearer_token(context.invocation_metadata())
        if token is None:
            _refuse(
                context, grpc.StatusCode.UNAUTHENTICATED, "the operator's view needs 'authorization: Bearer <token>'"
            )
        if not hmac.compare_digest(token_digest(token), self.digest):  # no timing hint at the digest
            _refuse(context, grpc.StatusCode.PERMISSION_DENIED, "this bearer token is not the operator's")


def refuse_without_operator(context: grpc.ServicerContext) -> NoReturn:
    """The answer of a coordinator that was given no operator credential."""
    _refuse(
        context,
        grpc.StatusCode.FAILED_PRECONDITION,
        "this coordinator has no operator credential: start lorm-server with --operator-digest-file FILE "
        "(or read the run in its log and metrics.json)",
    )


def add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    """``lorm-server``'s flag for the operator's credential (and its old name, still read)."""
    parser.add_argument(
        "--operator-digest-file",
        default=None,
        metavar="FILE",
        help="the file holding the sha256 hex of the operator's bearer token (`printf %%s TOKEN | sha256sum`; "
        "lorm-admin token writes it as TOKENFILE.sha256): the token's holder may call the Operator service "
        "(lorm-admin status, add-task, finish), the run's full recent history, which no client may read (default "
        f"${ENV_DIGEST_FILE}; none: the Operator service is refused)",
    )
    parser.add_argument(
        "--operator-token-file",
        default=None,
        metavar="FILE",
        help="the old name of --operator-digest-file (lorm-admin's --operator-token-file is the token itself)",
    )


def operator_from_args(args: argparse.Namespace) -> OperatorAuth | None:
    """The credential ``--operator-digest-file`` (or its old name ``--operator-token-file``, with a warning) names,
    or else ``$LORM_OPERATOR_DIGEST_FILE`` (``None`` without any); ``ValueError`` if unusable or if both flags
    name different files."""
    path, old = args.operator_digest_file, args.operator_token_file
    if old is not None:
        if path is not None and path != old:
            raise ValueError(
                f"--operator-digest-file {path} and --operator-token-file {old} (its old name) name different "
                "files: give --operator-digest-file only"
            )
        log.warning(
            "lorm-server --operator-token-file is now --operator-digest-file (the token's digest); the old "
            "name is still read"
        )
        path = old
    if path is None:
        path, warning = renamed_variable(ENV_DIGEST_FILE, OLD_ENV_DIGEST_FILE)
        if warning:
            log.warning("%s", warning)
    if not path:
        return None
    try:
        return OperatorAuth.from_file(path)
    except OSError as err:
        raise ValueError(f"--operator-digest-file {path}: {err.strerror}") from err
