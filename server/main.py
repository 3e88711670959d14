"""``lorm-server``: the coordinator process."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path

from common.config import add_config_arguments, config_from_args
from common.metrics import format_summary
from server.coordinator import Coordinator, Options
from server.service import create_server


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lorm-server", description="Run the LoRM coordinator (gRPC).")
    add_config_arguments(parser)
    parser.add_argument("--state-dir", required=True, help="where the run's state is kept (resumed if present)")
    parser.add_argument("--results-dir", default="", help="adapter, head and metrics at the end (default <state>/results)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=50051, help="port to listen on (0: any free port)")
    parser.add_argument("--port-file", default="", help="write the bound port to this file once serving")
    parser.add_argument("--quorum", type=int, default=0, help="submissions that close a step at its deadline (0: all)")
    parser.add_argument("--round-deadline", type=float, default=0.0, help="seconds a step waits for all clients (0: forever)")
    parser.add_argument("--linger", type=float, default=10.0, help="seconds to keep serving after the run ends, "
                                                                   "so clients learn it is over")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    log = logging.getLogger("lorm.server")
    config = config_from_args(args)
    options = Options(quorum=args.quorum, round_deadline_s=args.round_deadline, results_dir=args.results_dir)
    coordinator = Coordinator(config, args.state_dir, options, on_event=log.info,
                              on_fatal=lambda err: os._exit(70))
    server, port = create_server(coordinator, f"{args.host}:{args.port}")
    server.start()
    log.info("coordinator for run %s serving on %s:%d (state %s)", config.run_id, args.host, port, args.state_dir)
    if args.port_file:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(args.port_file)

    def ticker() -> None:
        while not coordinator.done.wait(0.2):
            coordinator.tick()

    threading.Thread(target=ticker, daemon=True).start()
    try:
        coordinator.done.wait()
        deadline = time.monotonic() + args.linger
        while time.monotonic() < deadline and not coordinator.all_clients_released():
            time.sleep(0.1)
    except KeyboardInterrupt:
        log.info("interrupted: state is on disk; restart with the same --state-dir to resume")
        server.stop(grace=1).wait()
        return 130
    server.stop(grace=2).wait()
    print(format_summary(coordinator.summary()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
