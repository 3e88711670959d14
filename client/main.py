"""``lorm-client``: one client process. It dials out, trains on its own shard, and pushes."""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import socket
import sys
import time
from pathlib import Path

from client.datasets import DatasetError
from client.floor import FloorError, add_floor_arguments, check_floor, floor_from_args, pinned
from client.ledger import ClientLedger, LedgerRefused, budget_line, data_digest, ledger_path
from client.local import (
    LocalSettingError,
    add_local_arguments,
    applied,
    check_own_data,
    local_from_args,
    refuse_coordinator_local,
)
from client.owned import OwnData
from client.plans import PlanRefused, add_caps_arguments, caps_from_args, check_caps
from client.runtime import ClientRuntime, build_runtime, with_tasks
from client.secure import SecureRounds
from client.telemetry import DEFAULT_HOST, HOST_HELP, ClientMetrics
from client.transport import Backoff, CoordinatorClient, Rejected
from common.infra.faults import fault_point
from common.infra.logs import add_logging_arguments, plan_name, set_context, setup_logging, step_loss
from common.infra.progress import Progress
from common.infra.tls import SecurityError, add_security_arguments, security_from_args
from common.privacy.ledger import BudgetExceeded
from common.run.config import RunConfig
from common.run.schedule import same_but_schedule
from common.secagg.primitives import SecAggError
from common.wire.messages import ClientUpdate, EvalReport, Phase, RoundPlan, Wait
from common.wire.tensors import WireError


def idempotency_key(run_id: str, plan: RoundPlan, client_index: int) -> str:
    """One key per client and step: a retried or recomputed push of the same step has the same key."""
    return f"{run_id}/{plan.task}/{plan.round}/{plan.phase.value}/{client_index}"


def _record(
    metrics: ClientMetrics, config: RunConfig, plan: RoundPlan, result: ClientUpdate | EvalReport, seconds: float
) -> None:
    """Throughput counts every pass over the shard: local epochs when the step trained, else one."""
    if isinstance(result, ClientUpdate):
        trained = result.train_loss == result.train_loss  # NaN: nothing was trained
        samples = result.num_samples * (max(config.local_epochs, 1) if trained else 1)
        metrics.step_done(plan.phase.value, plan.task, plan.round, samples, seconds, result.train_loss)
    else:
        metrics.step_done(plan.phase.value, plan.task, plan.round, int(sum(result.total)), seconds)


def refuse(client: CoordinatorClient, run_id: str, why: object) -> int:
    """Refuse run ``run_id``, naming ``why``: nothing more is sent; the exit code, 3."""
    logging.getLogger("lorm.client").error("refusing run %s: %s", run_id, why)
    client.close()
    return 3


def push_as(client: CoordinatorClient, key: str, update: ClientUpdate) -> bool:
    return client.push(update, key)


def refreshed(
    client: CoordinatorClient, runtime: ClientRuntime, joined: RunConfig, index: int, own: OwnData | None
) -> ClientRuntime:
    """``runtime`` with the run's schedule as it now stands, learnt by joining again (the same slot): the same
    model, this client's own data read against the longer schedule. ``LocalSettingError`` when the coordinator
    now states another run than the one joined (anything but its schedule changed), or no own data."""
    config, again = client.join(index)
    if again != index or not same_but_schedule(config, joined):
        raise LocalSettingError(
            f"joined again for the run's next tasks, the coordinator sent index {again} (this client's is {index}) "
            "or another configuration than the run's besides its schedule"
        )
    if own is None or client.schedule is None:
        raise LocalSettingError("the run's schedule grew, but this client has no own data (--data) to match it")
    log = logging.getLogger("lorm.client")
    log.info("the run's schedule now has %d tasks: %s", len(client.schedule), client.schedule[-1])
    return with_tasks(runtime, client.schedule, own)


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    try:
        security = security_from_args(args, "client")
        floor = floor_from_args(args)
        caps = caps_from_args(args)
        local = local_from_args(args)
    except (SecurityError, FloorError, PlanRefused, ValueError) as err:
        parser.error(str(err))
    setup_logging(args.log_format)
    set_context(client=args.client_id)
    log = logging.getLogger("lorm.client")
    security.announce(log, "client")
    metrics = ClientMetrics()
    if args.metrics_port:
        bound = metrics.serve(args.metrics_port, args.metrics_host)
        log.info("metrics on http://%s:%d/metrics", args.metrics_host, bound)

    client = CoordinatorClient(
        args.server, args.client_id, Backoff(give_up_s=args.give_up), args.call_timeout, security=security
    )
    try:
        config, index = client.join(args.index)
    except WireError as err:  # the coordinator speaks another wire contract: nothing it sends can be read
        log.error("refusing the run: %s", err)
        client.close()
        return 3
    except ValueError as err:  # the Join reply's configuration does not parse: nothing of it is used
        log.error("refusing the run: the coordinator's configuration is invalid: %s", err)
        client.close()
        return 3
    joined = config  # as the coordinator sent it: a later Join must send the same run, its schedule aside
    set_context(run=config.run_id)
    log.info("joined run %s as client %d of %d", config.run_id, index, config.num_clients)
    # Checked before this client sends anything more: what it accepts is its own decision, not the coordinator's.
    try:
        if not 0 <= index < config.num_clients:
            raise LocalSettingError(f"the coordinator gave this client index {index} of {config.num_clients} clients")
        refuse_coordinator_local(config, local)
        check_own_data(config, local)
        check_caps(config, caps)
        accepted = check_floor(config, floor)
    except (LocalSettingError, FloorError, PlanRefused) as err:
        return refuse(client, config.run_id, err)
    log.info("accepted %s", accepted.describe())
    config = applied(pinned(config, accepted), local)  # masks with the threshold it checked
    try:
        runtime = build_runtime(config, local.own(), client.schedule)
    except (DatasetError, FileNotFoundError) as err:  # this client's data as configured: say what, and stop
        log.error("cannot load this client's data: %s", err)
        client.close()
        return 2
    worker = runtime.worker(index, args.client_id)
    own = local.own()
    ledger = None
    try:
        if ClientLedger.wanted(config):  # only then is the training file read again, for its digest
            data = data_digest(config, own.train if own is not None else "", index)
            ledger = ClientLedger(config, args.privacy_ledger or ledger_path(data), data)
            ledger.admit(args.lifetime_epsilon)
    except (LedgerRefused, OSError) as err:  # another site's file, unreadable, or over the lifetime budget
        return refuse(client, config.run_id, err)
    if ledger is not None:
        log.info("privacy ledger %s: %s", ledger.path, budget_line(ledger))
    worker.ledger = ledger
    metrics.watch_device(runtime.device)
    client.describe(runtime.spec)
    log.info(
        "model: %d LoRA layers, device %s; shard sizes per task %s",
        len(runtime.spec.layers),
        runtime.device,
        [int(s.numel()) for s in worker.shards],
    )
    # This step's batches and ETA: a status line on a terminal, else a plain line every 30 s (the
    # coordinator's log has the run's ETA).
    quiet = args.no_progress or args.log_format == "json"  # a redrawn status line is not a JSON record
    progress = Progress(
        [], interactive=False if quiet else None, every_s=math.inf if args.no_progress else 30.0, emit=log.info
    )
    worker.on_batch = progress.batch
    secure = accepted.enabled
    skipped: tuple | None = None  # a secure session (step, attempt) that went on without this client (it lost its keys)
    kept: tuple | None = None  # (step, result) of a secure step: kept, not recomputed, if its session restarts
    waits = 0  # Wait answers in a row: a long idle is polled ever more slowly, up to a bound
    while True:
        try:
            answer = client.pull()
        except (ValueError, RecursionError) as err:  # a plan that does not decode: nothing of it is used
            return refuse(client, config.run_id, f"the coordinator's plan is malformed: {err}")
        if isinstance(answer, Wait):
            waits += 1
            time.sleep(client.backoff.wait_s(answer.retry_after_s, waits))
            continue
        waits = 0
        plan = answer
        if plan.phase == Phase.DONE:
            log.info("run %s is over", config.run_id)
            client.close()
            return 0
        if plan.task >= len(worker.tasks):  # the operator appended tasks since this client joined
            try:
                runtime = refreshed(client, runtime, joined, index, local.own())
            except (DatasetError, FileNotFoundError, LocalSettingError) as err:
                log.error("refusing the run's longer schedule: %s", err)
                client.close()
                return 3
            worker = runtime.worker(index, args.client_id)
            worker.ledger = ledger  # the same account: the run's records do not start afresh
            worker.on_batch = progress.batch
            log.info("shard sizes per task %s", [int(s.numel()) for s in worker.shards])
        step = (plan.task, plan.round, plan.phase)
        if (*step, plan.secure_attempt) == skipped:
            time.sleep(1.0)
            continue
        set_context(task=plan.task, round=plan.round)
        if plan.phase != Phase.EVALUATE:  # before any key is advertised for it (evaluations: counted by handle)
            try:
                worker.check(plan)
            except PlanRefused as err:
                return refuse(client, config.run_id, err)
        rounds = None
        if secure and plan.phase != Phase.EVALUATE and ledger is not None and not ledger.may_mask(plan):
            log.warning(
                "task %d round %d %s (session %d): a secure session over the same inputs reached an unmask request "
                "that counted this client before: sitting it out (two sums over the same inputs can be differenced, "
                "and fresh noise averaged away)",
                plan.task,
                plan.round,
                plan.phase.value,
                plan.secure_attempt,
            )
            skipped = (*step, plan.secure_attempt)
            continue
        if secure and plan.phase != Phase.EVALUATE:
            answered = ledger.restart_survivors(plan) if ledger is not None else None
            rounds = SecureRounds(client, config, runtime.spec, index, plan, security=security, answered=answered)
            try:
                rounds.begin()  # keys and sealed shares before training: the others need them to mask
            except SecAggError as err:  # a roster a hostile peer or coordinator spoilt: this session goes on without us
                log.warning("sitting out secure session %d of this step: %s", plan.secure_attempt, err)
                skipped = (*step, plan.secure_attempt)
                continue
            except Rejected as err:
                if err.code.name == "ABORTED":
                    log.info("secure aggregation of this step restarted (%s); joining its new session", err)
                    continue
                if err.code.name != "FAILED_PRECONDITION":
                    raise
                log.info("secure aggregation of this step goes on without this client (%s); waiting for the next", err)
                skipped = (*step, plan.secure_attempt)
                continue
        start = time.perf_counter()
        if kept is not None and kept[0] == step:
            result = kept[1]  # computed before the step's secure session restarted: the same plan, the same result
        else:
            progress.begin(f"task {plan.task} round {plan.round} {plan_name(plan)}")
            try:
                result = worker.handle(plan)
            except (BudgetExceeded, LedgerRefused, PlanRefused) as err:  # a plan beyond the account: nothing is sent
                return refuse(client, config.run_id, err)
            except ValueError as err:  # a plan the method's client half cannot read (another mode, a half pair)
                return refuse(client, config.run_id, f"the coordinator's plan is malformed: {err}")
            finally:
                progress.end()
            _record(metrics, config, plan, result, time.perf_counter() - start)
            kept = (step, result) if rounds is not None else None
        key = idempotency_key(config.run_id, plan, index)
        try:
            if isinstance(result, ClientUpdate):
                fault_point("client.push")
                if rounds is not None:
                    unmasking = functools.partial(ledger.unmasking, plan) if ledger is not None else None
                    summed = rounds.finish(result, functools.partial(push_as, client, key), unmasking)
                    log.info("secure aggregation: pushed masked terms; the coordinator unmasks the sum of %d", summed)
                else:
                    client.push(result, key)
                loss = step_loss(plan.phase.value, result.train_loss)
                log.info(
                    "task %d round %d %s: %d samples%s, %.1f s",
                    plan.task,
                    plan.round,
                    plan_name(plan),
                    result.num_samples,
                    f", {loss}" if loss else "",
                    time.perf_counter() - start,
                )
            else:
                client.report(result, key)
                acc = [100.0 * c / t if t else float("nan") for c, t in zip(result.correct, result.total)]
                log.info("task %d evaluated on my test share: %s", plan.task, " ".join(f"{a:.1f}" for a in acc))
        except SecAggError as err:  # an unmask request or peer this client will not answer: nothing more revealed
            log.warning("sitting out the rest of secure session %d of this step: %s", plan.secure_attempt, err)
            skipped = (*step, plan.secure_attempt)
        except Rejected as err:
            if err.code.name == "ABORTED":  # the step's secure session restarted: mask the kept result anew
                log.info("secure aggregation of this step restarted (%s); joining its new session", err)
                continue
            # A stale step (closed at its deadline without us): drop it and pull the next one.
            if err.code.name != "FAILED_PRECONDITION":
                raise
            log.info("update refused (%s); moving on", err)


if __name__ == "__main__":
    sys.exit(main())
