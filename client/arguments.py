"""``lorm-client``'s flags (each with its environment variable where a container sets it) and the options they make."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from client.floor import add_floor_arguments, floor_from_args
from client.local import add_local_arguments, local_from_args
from client.plans import add_caps_arguments, caps_from_args
from client.session import ClientOptions, progress_settings
from client.telemetry import DEFAULT_HOST, HOST_HELP
from common.infra.logs import add_logging_arguments
from common.infra.tls import Security, add_security_arguments


def client_parser() -> argparse.ArgumentParser:
    """The parser of ``lorm-client``'s command line, its defaults read from the environment now."""
    parser = argparse.ArgumentParser(prog="lorm-client", description="Run one LoRM client.")
    # Containers configure these through the environment (LORM_SERVER, LORM_CLIENT_ID, LORM_CLIENT_INDEX).
    env = os.environ.get
    parser.add_argument(
        "--server",
        default=env("LORM_SERVER"),
        required=not env("LORM_SERVER"),
        help="coordinator address, host:port (default $LORM_SERVER)",
    )
    parser.add_argument(
        "--client-id",
        default=env("LORM_CLIENT_ID") or socket.gethostname(),
        help="this client's stable identity, reused on restart (default $LORM_CLIENT_ID, else the host name)",
    )
    parser.add_argument(
        "--index",
        type=int,
        default=env("LORM_CLIENT_INDEX") or None,  # argparse applies int
        help="ask for this data shard (0..N-1; default $LORM_CLIENT_INDEX, else the coordinator "
        "assigns the lowest free one)",
    )
    parser.add_argument("--give-up", type=float, default=600.0, help="seconds one call retries before failing")
    parser.add_argument(
        "--sessions",
        type=int,
        default=1,
        metavar="N",
        help="host N clients in this process, indices --index .. --index + N - 1, each over its own channel, with "
        "the id <--client-id>-<index>; {client_id} in the certificate, key, token and ledger paths names each "
        "one's own (client/host.py)",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (default: a status line on a terminal, else a line every 30 s)",
    )
    parser.add_argument(
        "--call-timeout",
        type=float,
        default=float(env("LORM_CALL_TIMEOUT", "300")),
        help="seconds one call (one whole push or pull, however large) may take before it is "
        "retried; raise it for large updates on slow links (default $LORM_CALL_TIMEOUT or 300)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("LORM_METRICS_PORT", "0")),
        help="serve Prometheus /metrics on this port (0: off; default $LORM_METRICS_PORT)",
    )
    parser.add_argument(
        "--metrics-host",
        default=env("LORM_METRICS_HOST", DEFAULT_HOST),
        help=HOST_HELP,
    )
    parser.add_argument(
        "--privacy-ledger",
        type=Path,
        default=env("LORM_PRIVACY_LEDGER") or None,
        metavar="FILE",
        help="a private or secure run: this client's own account of what its records have released, kept across "
        "restarts and runs (default $LORM_PRIVACY_LEDGER, else $XDG_STATE_HOME/lorm/privacy/<its data's digest>.json, "
        "~/.local/state when unset); keep it on a volume that outlives the container",
    )
    parser.add_argument(
        "--lifetime-epsilon",
        type=float,
        default=float(env("LORM_LIFETIME_EPSILON") or 0) or None,
        metavar="E",
        help="the most epsilon this client's records may spend over all private runs together (basic composition); "
        "default $LORM_LIFETIME_EPSILON, else one run's budget: the records take part in one private run until the "
        "site's operator resets the ledger (lorm-ledger reset)",
    )
    add_floor_arguments(parser)
    add_caps_arguments(parser)
    add_local_arguments(parser)
    add_security_arguments(parser, "client")
    add_logging_arguments(parser)
    return parser


def options_from_args(args: argparse.Namespace, security: Security) -> ClientOptions:
    """This client's own decisions from its flags (``ValueError`` naming a flag that does not parse)."""
    every_s, interactive = progress_settings(args.no_progress, args.log_format)
    return ClientOptions(
        client_id=args.client_id,
        index=args.index,
        local=local_from_args(args),
        floor=floor_from_args(args),
        caps=caps_from_args(args),
        security=security,
        privacy_ledger=args.privacy_ledger,
        lifetime_epsilon=args.lifetime_epsilon,
        progress_every_s=every_s,
        interactive=interactive,
    )
