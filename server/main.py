"""``lorm-server``: the coordinator process."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from common.infra.logs import add_logging_arguments, set_context, setup_logging
from common.infra.tls import SecurityError, add_security_arguments, security_from_args
from common.methods.checks import unread_sections, validate
from common.run.arguments import add_config_arguments
from common.run.config import CLIENT_LOCAL, client_local_values
from common.run.metrics import format_summary
from common.run.schedule import add_schedule_arguments, config_with_schedule
from common.wire.messages import ModelSpec
from server.admission import Limits
from server.checks import Options, Refused
from server.coordinator import Coordinator, State, use_run_threads
from server.operator import add_operator_arguments, operator_from_args
from server.service import create_server
from server.state_lock import StateDirHeld
from server.state_lock import hold as state_dir_lock
from server.telemetry import CoordinatorMetrics, coordinator_status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lorm-server", description="Run the LoRM coordinator (gRPC).")
    add_config_arguments(parser)
    add_schedule_arguments(parser)
    parser.add_argument("--state-dir", required=True, help="where the run's state is kept (resumed if present)")
    parser.add_argument(
        "--results-dir", default="", help="adapter, head and metrics at the end (default <state>/results)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=50051, help="port to listen on (0: any free port)")
    parser.add_argument("--port-file", default="", help="write the bound port to this file once serving")
    parser.add_argument("--quorum", type=int, default=0, help="submissions that close a step at its deadline (0: all)")
    parser.add_argument(
        "--round-deadline", type=float, default=0.0, help="seconds a step waits for all clients (0: forever)"
    )
    parser.add_argument(
        "--start-with",
        type=int,
        default=0,
        metavar="K",
        help="start the run once K clients have joined; the others may join at any later step (a step waits "
        "for the clients that have joined, a silent one up to --round-deadline with --quorum; 0: all num_clients)",
    )
    parser.add_argument(
        "--linger",
        type=float,
        default=10.0,
        help="seconds to keep serving after the run ends, so clients learn it is over",
    )
    parser.add_argument(
        "--keep-serving",
        action="store_true",
        help="after the run (and --linger), keep serving health, status and metrics until "
        "SIGTERM: for a supervisor that restarts a process that exits (Kubernetes Deployment)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("LORM_METRICS_PORT", "0")),
        help="serve Prometheus /metrics on this port of --host (0: off; default $LORM_METRICS_PORT)",
    )
    parser.add_argument(
        "--model-spec",
        default="",
        help="the run's model description (written by lorm-spec): a "
        "client's Describe must equal it; without it the first Describe fixes the model",
    )
    parser.add_argument(
        "--max-calls-per-client",
        type=int,
        default=Limits.per_client,
        help="calls one client may have in progress; beyond it: RESOURCE_EXHAUSTED",
    )
    parser.add_argument(
        "--stream-idle",
        type=float,
        default=Limits.idle_s,
        help="seconds a Push may send nothing (or a Pull's reader take nothing) before it is cancelled",
    )
    parser.add_argument(
        "--stream-grace",
        type=float,
        default=Limits.grace_s,
        help="seconds of waiting on a stream's peer before --stream-min-rate applies",
    )
    parser.add_argument(
        "--stream-min-rate",
        type=float,
        default=Limits.min_rate,
        help="bytes per second of waiting a stream's peer must move after --stream-grace, else the call is "
        "cancelled (0: no bound)",
    )
    add_operator_arguments(parser)
    add_security_arguments(parser, "server")
    add_logging_arguments(parser)
    return parser


def _serve_until_terminated(log: logging.Logger, terminated: threading.Event) -> None:
    log.info("the run is over; serving its status until SIGTERM (--keep-serving)")
    try:
        while not terminated.wait(1.0):  # short waits: the signal handler runs between them
            pass
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        security = security_from_args(args, "server")
    except SecurityError as err:
        parser.error(str(err))  # exits 2 before any state is written
    terminated = threading.Event()
    if args.keep_serving:  # a supervisor's SIGTERM at any time: a clean stop (its default would kill the process)
        signal.signal(signal.SIGTERM, lambda signum, frame: terminated.set())
    setup_logging(args.log_format)
    log = logging.getLogger("lorm.server")
    security.announce(log, "server")
    try:
        config = validate(config_with_schedule(args))
    except (OSError, ValueError) as err:
        parser.error(str(err))
    for warning in unread_sections(config):
        log.warning("%s", warning)
    for key, value in client_local_values(config).items():
        # Every client refuses a configuration that picks its files (client/local.py): say so before serving.
        parser.error(
            f"the configuration sets {key}={value}, a client's own setting that every client refuses from the "
            f"coordinator: give it to each client instead ({CLIENT_LOCAL[key]})"
        )
    set_context(run=config.run_id)
    use_run_threads(config)
    try:
        fixed = ModelSpec.from_json(Path(args.model_spec).read_text()) if args.model_spec else None
    except (OSError, ValueError) as err:
        parser.error(f"--model-spec {args.model_spec}: {err}")
    if fixed is None:
        log.info(
            "no --model-spec: the first client's Describe fixes the model, within the caps (lorm-spec writes "
            "the file that lets no client choose it)"
        )
    else:
        log.info(
            "model fixed by --model-spec %s: %d LoRA layers, %d classes; every Describe must equal it",
            args.model_spec,
            len(fixed.layers),
            fixed.num_classes,
        )
    options = Options(
        quorum=args.quorum,
        round_deadline_s=args.round_deadline,
        results_dir=args.results_dir,
        model_spec=fixed,
        start_with=args.start_with,
        secagg_ca=security.ca or "",
    )
    try:
        state_dir_lock(args.state_dir)  # held until the process ends: no second coordinator on this run's state
    except StateDirHeld as err:
        parser.error(str(err))
    made: list[Coordinator] = []  # events come from inside the constructor too (a resume)

    def on_event(message: str) -> None:
        # Called under the coordinator's lock, before it moves on: its step is the event's.
        step = made[0].step if made else None
        log.info(message, extra={"task": step.task, "round": step.round} if step else {})

    metrics = CoordinatorMetrics(lambda: coordinator_status(made[0]))
    try:
        coordinator = Coordinator(
            config,
            args.state_dir,
            options,
            on_event=on_event,
            on_fatal=lambda err: os._exit(70),
            on_merge=metrics.merged,
        )
    except (Refused, ValueError) as err:
        parser.error(str(err))
    made.append(coordinator)
    try:
        limits = Limits(
            per_client=args.max_calls_per_client,
            idle_s=args.stream_idle,
            grace_s=args.stream_grace,
            min_rate=args.stream_min_rate,
        )
        operator = operator_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    try:
        server, port = create_server(
            coordinator,
            f"{args.host}:{args.port}",
            interceptors=[metrics.interceptor()],
            security=security,
            limits=limits,
            operator=operator,
        )
    except OSError as err:
        parser.error(str(err))
    if args.metrics_port:  # before "serving on": whoever waits for that line may scrape at once
        log.info("metrics on http://%s:%d/metrics", args.host, metrics.serve(args.metrics_port, args.host))
    server.start()
    log.info(
        "coordinator for run %s serving on %s:%d (state %s, merges on %s)",
        config.run_id,
        args.host,
        port,
        args.state_dir,
        f"{config.threads} torch thread(s)" if config.threads else "torch's default threads",
    )
    if args.port_file:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(args.port_file)

    def ticker() -> None:
        while not coordinator.done.wait(0.2):
            try:
                coordinator.tick()
            except Exception:  # a bug in one step's closing must not leave every later deadline unwatched
                log.exception("closing a step at its deadline failed; the ticker goes on")

    threading.Thread(target=ticker, daemon=True).start()
    try:
        while not coordinator.done.wait(0.5):  # short waits: the signal handler runs between them
            if terminated.is_set():
                raise KeyboardInterrupt
        deadline = time.monotonic() + args.linger
        while time.monotonic() < deadline and not coordinator.all_clients_released() and not terminated.is_set():
            time.sleep(0.1)
    except KeyboardInterrupt:
        log.info("interrupted: state is on disk; restart with the same --state-dir to resume")
        server.stop(grace=1).wait()
        return 128 + signal.SIGTERM if terminated.is_set() else 130
    if args.keep_serving:
        _serve_until_terminated(log, terminated)
    server.stop(grace=2).wait()
    if args.log_format == "json":
        log.info(format_summary(coordinator.run.summary()))  # one record: every output line stays JSON
    else:
        print(format_summary(coordinator.run.summary()), flush=True)
    if coordinator.run.state == State.FAILED:
        log.error("run %s failed: a step could not be completed (its history entry says why)", config.run_id)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
