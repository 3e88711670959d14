"""``lorm-admin``: the operator's commands to a running coordinator.

``lorm-admin status`` calls ``Operator/OperatorStatus`` with the operator's bearer token and prints
the run's full status as JSON: its progress, the accuracy matrix and the last five history entries
(per-step sample counts, dropped clients, the robust mode's per-client figures), which a client's
``Status`` does not hold. The coordinator must have been started with ``--operator-token-file``
(the token's SHA-256); this command reads the token itself.

Exit codes: 0 the status was printed, 2 the call failed (its status code and details on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import grpc

from common.infra.tls import Security, SecurityError
from proto import codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc

ENV_TOKEN = "LORM_OPERATOR_TOKEN"  # a path, like $LORM_TOKEN_FILE: the token never sits in the environment


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lorm-admin", description="The operator's commands to a LoRM coordinator.")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="print the run's full status (the operator's view) as JSON")
    status.add_argument(
        "--target",
        default=os.environ.get("LORM_SERVER", "127.0.0.1:50051"),
        help="coordinator address host:port (default: $LORM_SERVER or 127.0.0.1:50051)",
    )
    status.add_argument(
        "--operator-token-file",
        default=os.environ.get(ENV_TOKEN, ""),
        metavar="FILE",
        help=f"file holding the operator's bearer token (default ${ENV_TOKEN})",
    )
    status.add_argument("--run-id", default="", help="refuse unless the coordinator serves this run")
    status.add_argument("--timeout", type=float, default=10.0, help="seconds the call may take")
    g = status.add_argument_group("connection (as lorm-health's: under mutual TLS the handshake needs a certificate)")
    g.add_argument("--tls-ca", default=os.environ.get("LORM_TLS_CA", ""), metavar="FILE", help="CA of the coordinator")
    g.add_argument("--tls-cert", default=os.environ.get("LORM_TLS_CERT", ""), metavar="FILE", help="certificate (PEM)")
    g.add_argument("--tls-key", default=os.environ.get("LORM_TLS_KEY", ""), metavar="FILE", help="its key (PEM)")
    g.add_argument("--tls-server-name", default="", metavar="NAME", help="name in the coordinator's certificate")
    g.add_argument("--insecure", action="store_true", help="plaintext (the token travels unencrypted)")
    return parser


def _security(args: argparse.Namespace) -> Security:
    if not args.insecure and not args.tls_ca:
        raise SecurityError("give --tls-ca FILE (with --tls-cert/--tls-key under mutual TLS) or --insecure (plaintext)")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SecurityError("--tls-cert and --tls-key go together; got only one of them")
    if args.insecure and (args.tls_ca or args.tls_cert):
        raise SecurityError("--insecure (plaintext) contradicts --tls-ca/--tls-cert/--tls-key: pass one or the other")
    return Security(
        ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, server_name=args.tls_server_name, insecure=args.insecure
    )


def _token(path: str) -> str:
    token = Path(path).read_text().strip()
    if not token or any(c.isspace() for c in token):
        got = "nothing" if not token else "several words"
        raise SecurityError(f"--operator-token-file {path}: expected one token (no spaces), got {got}")
    return token


def status(args: argparse.Namespace) -> tuple[int, str]:
    """(exit code, the status as JSON or what went wrong) for one OperatorStatus call."""
    if not args.operator_token_file:
        return 2, f"lorm-admin status: give --operator-token-file FILE (or ${ENV_TOKEN}): the operator's token"
    try:
        security = _security(args)
        token = _token(args.operator_token_file)
    except (SecurityError, OSError) as err:
        return 2, f"lorm-admin status: {err}"
    with security.channel(args.target, []) as channel:
        try:
            reply = pb_grpc.OperatorStub(channel).OperatorStatus(
                pb.StatusRequest(run_id=args.run_id),
                timeout=args.timeout,
                metadata=(("authorization", f"Bearer {token}"),),
            )
        except grpc.RpcError as err:
            return 2, f"{args.target}: {err.code().name} ({err.details()})"
    return 0, json.dumps(codec.status_from_proto(reply), indent=2)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code, text = status(args)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
