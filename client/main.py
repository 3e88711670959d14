"""``lorm-client``: one client process. It dials out, trains on its own shard, and pushes.

Its flags are ``client/arguments.py``'s; its part in the run is a :class:`~client.session.ClientSession` over the
gRPC transport (``client/transport.py``)."""

from __future__ import annotations

import logging
import sys

from client.arguments import client_parser, options_from_args
from client.floor import FloorError
from client.host import run_hosted
from client.plans import PlanRefused
from client.session import ClientSession
from client.telemetry import ClientMetrics
from client.transport import Backoff, CoordinatorClient
from common.infra.logs import set_context, setup_logging
from common.infra.tls import SecurityError, security_from_args


def main(argv: list[str] | None = None) -> int:
    parser = client_parser()
    args = parser.parse_args(argv)
    if args.sessions > 1:  # one process, many clients: each its own flags, checked before any starts
        setup_logging(args.log_format)
        try:
            return run_hosted(args, lambda a: options_from_args(a, security_from_args(a, "client")))
        except (SecurityError, FloorError, PlanRefused, ValueError) as err:
            parser.error(str(err))
    try:
        options = options_from_args(args, security_from_args(args, "client"))
    except (SecurityError, FloorError, PlanRefused, ValueError) as err:
        parser.error(str(err))
    setup_logging(args.log_format)
    set_context(client=args.client_id)
    log = logging.getLogger("lorm.client")
    options.security.announce(log, "client")
    metrics = ClientMetrics()
    if args.metrics_port:
        bound = metrics.serve(args.metrics_port, args.metrics_host)
        log.info("metrics on http://%s:%d/metrics", args.metrics_host, bound)
    backoff = Backoff(give_up_s=args.give_up)
    transport = CoordinatorClient(args.server, args.client_id, backoff, args.call_timeout, security=options.security)
    return ClientSession(transport, options, metrics, backoff).run()


if __name__ == "__main__":
    sys.exit(main())
