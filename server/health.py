"""``lorm-health``: a readiness probe that asks the coordinator itself, over gRPC.

It calls ``grpc.health.v1.Health/Check`` on the coordinator's port (over TLS when given a CA)
and exits 0 only when the answer is ``SERVING``. The coordinator reports ``SERVING`` only once
its state is loaded and its gRPC server is bound (``server.service.create_server``), so a
passing probe means a client can join now, not merely that a port is open or a process exists.

Exit codes: 0 serving, 1 reachable but not serving, 2 unreachable (or the call failed).
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.infra.tls import Security, add_security_arguments


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lorm-health", description="Check that a LoRM coordinator is serving.")
    parser.add_argument(
        "--target",
        default=os.environ.get("LORM_HEALTH_TARGET", "127.0.0.1:50051"),
        help="coordinator address host:port (default: $LORM_HEALTH_TARGET or 127.0.0.1:50051)",
    )
    parser.add_argument(
        "--service", default="", help="service name to check ('' = the whole server, or lorm.v1.Coordinator)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds the check may take")
    # The client's flags: under mutual TLS the handshake itself needs a certificate from the run's CA.
    add_security_arguments(parser, "client")
    return parser


def _security(args: argparse.Namespace) -> Security:
    security = Security(
        ca=args.tls_ca,
        cert=args.tls_cert,
        key=args.tls_key,
        token_file=args.token_file,
        server_name=args.tls_server_name,
        insecure=args.insecure,
    )
    if not security.insecure and not security.ca:
        raise SystemExit(
            "lorm-health: give --tls-ca FILE (with --tls-cert/--tls-key under mutual TLS) or --insecure (plaintext)"
        )
    if bool(security.cert) != bool(security.key):
        raise SystemExit("lorm-health: --tls-cert and --tls-key go together; got only one of them")
    return security


def check(args: argparse.Namespace) -> tuple[int, str]:
    """(exit code, what was found) for one Health/Check call."""
    security = _security(args)
    with security.channel(args.target, []) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service),
                timeout=args.timeout,
                metadata=security.call_metadata() or None,
            )
        except grpc.RpcError as err:
            return 2, f"{args.target}: {err.code().name} ({err.details()})"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return (0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1), f"{args.target}: {status}"


def main(argv: list[str] | None = None) -> int:
    code, message = check(build_parser().parse_args(argv))
    print(message, file=sys.stdout if code == 0 else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
