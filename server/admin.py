"""``lorm-admin``: the operator's commands to a running coordinator.

``lorm-admin status`` calls ``Operator/OperatorStatus`` with the operator's bearer token and prints
the run's full status as JSON: its progress, the accuracy matrix and the last five history entries
(per-step sample counts, dropped clients, the robust mode's per-client figures), which a client's
``Status`` does not hold. The coordinator must have been started with ``--operator-digest-file``
(the token's SHA-256); this command reads the token itself.

``lorm-admin add-task --classes a,b,c`` appends a task to an open run's schedule (``lorm-server --open``;
``Operator/AddTask``) and prints the schedule as it now stands; an idle run starts the task at once.
``lorm-admin finish`` ends an open run (``Operator/Finish``): at once when it idles, else after its last
scheduled task. ``--wait`` waits (up to ``--timeout``) for a coordinator that is not serving yet.

``lorm-admin token --out FILE`` makes the operator's credential: a random token in ``FILE`` (mode 0600, for
``lorm-admin``) and its SHA-256 in ``FILE.sha256`` (for ``lorm-server --operator-digest-file``).

Exit codes: 0 done (the status or the schedule printed), 2 the call failed (its status code and details on
stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

import grpc

from common.infra.environ import renamed_variable
from common.infra.tls import Security, SecurityError, token_digest
from common.run.schedule import parse_task
from proto import codec, status_codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc

ENV_TOKEN_FILE = "LORM_ADMIN_TOKEN_FILE"  # a path, like $LORM_TOKEN_FILE: the token never sits in the environment
OLD_ENV_TOKEN_FILE = "LORM_OPERATOR_TOKEN"  # its former name, still read (with a warning)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lorm-admin", description="The operator's commands to a LoRM coordinator.")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="print the run's full status (the operator's view) as JSON")
    _connection_arguments(status)
    add = commands.add_parser("add-task", help="append a task to an open run's schedule; print the schedule")
    add.add_argument("--classes", required=True, metavar="A,B,C", help="the task's class names, separated by commas")
    _connection_arguments(add)
    finish = commands.add_parser("finish", help="end an open run (at once when idle, else after its last task)")
    _connection_arguments(finish)
    token = commands.add_parser("token", help="make the operator's token (FILE) and its digest (FILE.sha256)")
    token.add_argument("--out", required=True, metavar="FILE", help="the token's file; its digest goes to FILE.sha256")
    token.add_argument("--force", action="store_true", help="replace existing files")
    return parser


def _connection_arguments(status: argparse.ArgumentParser) -> None:
    """Where the coordinator is, the operator's token and the connection's security: every command's."""
    status.add_argument(
        "--target",
        default=os.environ.get("LORM_SERVER", "127.0.0.1:50051"),
        help="coordinator address host:port (default: $LORM_SERVER or 127.0.0.1:50051)",
    )
    status.add_argument(
        "--operator-token-file",
        default=None,
        metavar="FILE",
        help=f"file holding the operator's bearer token (lorm-admin token --out FILE; default ${ENV_TOKEN_FILE})",
    )
    status.add_argument("--run-id", default="", help="refuse unless the coordinator serves this run")
    status.add_argument("--timeout", type=float, default=10.0, help="seconds the call may take")
    status.add_argument(
        "--wait", action="store_true", help="wait (up to --timeout) for a coordinator that is not serving yet"
    )
    g = status.add_argument_group("connection (as lorm-health's: under mutual TLS the handshake needs a certificate)")
    g.add_argument("--tls-ca", default=os.environ.get("LORM_TLS_CA", ""), metavar="FILE", help="CA of the coordinator")
    g.add_argument("--tls-cert", default=os.environ.get("LORM_TLS_CERT", ""), metavar="FILE", help="certificate (PEM)")
    g.add_argument("--tls-key", default=os.environ.get("LORM_TLS_KEY", ""), metavar="FILE", help="its key (PEM)")
    g.add_argument("--tls-server-name", default="", metavar="NAME", help="name in the coordinator's certificate")
    g.add_argument("--insecure", action="store_true", help="plaintext (the token travels unencrypted)")


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


def _token_path(given: str | None) -> str:
    """The token's file: ``--operator-token-file``, else ``$LORM_ADMIN_TOKEN_FILE`` (or its old name, said on
    stderr); ``ValueError`` when the two names of the variable differ."""
    if given is not None:
        return given
    path, warning = renamed_variable(ENV_TOKEN_FILE, OLD_ENV_TOKEN_FILE)
    if warning:
        print(f"lorm-admin: warning: {warning}", file=sys.stderr)
    return path


def _token(path: str) -> str:
    token = Path(path).read_text().strip()
    if not token or any(c.isspace() for c in token):
        got = "nothing" if not token else "several words"
        raise SecurityError(f"--operator-token-file {path}: expected one token (no spaces), got {got}")
    return token


def make_token(out: str, force: bool = False) -> tuple[int, str]:
    """A random operator token written to ``out`` (0600) and its digest to ``out.sha256``; nothing replaced
    unless ``force``."""
    token_file, digest_file = Path(out), Path(f"{out}.sha256")
    existing = [str(f) for f in (token_file, digest_file) if f.exists()]
    if existing and not force:
        return 2, f"lorm-admin token: {', '.join(existing)} exists: pass --force to replace it"
    token = secrets.token_hex(32)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.unlink(missing_ok=True)
    token_file.touch(mode=0o600)
    token_file.write_text(token + "\n")
    digest_file.write_text(token_digest(token) + "\n")
    return 0, f"wrote {token_file} (the token: lorm-admin --operator-token-file) and {digest_file} (lorm-server's)"


def call(args: argparse.Namespace) -> tuple[int, str]:
    """(exit code, what to print) for one operator command: the status as JSON, or the schedule after
    add-task, or what went wrong."""
    what = f"lorm-admin {args.command}"
    if args.command == "token":
        return make_token(args.out, args.force)
    try:
        path = _token_path(args.operator_token_file)
    except ValueError as err:
        return 2, f"{what}: {err}"
    if not path:
        return 2, f"{what}: give --operator-token-file FILE (or ${ENV_TOKEN_FILE}): the operator's token"
    try:
        security = _security(args)
        token = _token(path)
        classes = parse_task(args.classes, "--classes") if args.command == "add-task" else []
    except (SecurityError, OSError, ValueError) as err:
        return 2, f"{what}: {err}"
    metadata = (("authorization", f"Bearer {token}"),)
    options = {"timeout": args.timeout, "metadata": metadata, "wait_for_ready": args.wait}
    with security.channel(args.target, []) as channel:
        stub = pb_grpc.OperatorStub(channel)
        try:
            if args.command == "add-task":
                added = stub.AddTask(pb.AddTaskRequest(run_id=args.run_id, classes=classes), **options)
                schedule = codec.schedule_from_proto(added.tasks)
                # one line (a machine reads it as JSON; a person reads the task it added and the schedule)
                return 0, json.dumps({"task": added.task, "schedule": schedule}, separators=(", ", ": "))
            if args.command == "finish":
                stub.Finish(pb.FinishRequest(run_id=args.run_id), **options)
                return 0, "the run ends: at once if it was idle, else after its last scheduled task"
            reply = stub.OperatorStatus(pb.StatusRequest(run_id=args.run_id), **options)
        except grpc.RpcError as err:
            return 2, f"{args.target}: {err.code().name} ({err.details()})"
    return 0, json.dumps(status_codec.status_from_proto(reply), indent=2)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code, text = call(args)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
