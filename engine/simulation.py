"""The in-process engine: one coordinator strategy and N clients in one process, no sockets.

It runs exactly the strategy (merge) code of the coordinator and the worker (training) code
of the clients, passing the same messages by reference. Clients run one after another in
index order, and their updates are folded in that order.

With a state directory, the run is committed after every step as the coordinator commits it
(``server.store.Store``; ``server.run_state.RunMeta``: the step pointer, accuracy matrix, history, the
model; and the strategy's tensors), and a run started again on the same directory, by this engine or
by the coordinator, goes on from the last committed step. Clients keep nothing between steps (each
step's training is seeded by its plan), so the resumed run is the uninterrupted one, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from client.owned import client_files
from client.runtime import ClientRuntime, build_runtime, owned_runtimes, process_settings_kept
from client.splits import DatasetError
from client.worker import ClientWorker
from common.infra.logs import add_logging_arguments, plan_name, setup_logging
from common.infra.progress import Progress, kind_of
from common.methods import describe, overview
from common.methods.checks import unread_sections, validate
from common.privacy.ledger import privacy_summary
from common.run.arguments import add_config_arguments
from common.run.config import RunConfig
from common.run.metrics import AccuracyMatrix, format_summary
from common.run.partition import describe_tasks
from common.run.schedule import add_schedule_arguments, class_schedule, config_with_schedule
from common.run.settings import DataSettings, RobustSettings, SecAggSettings
from common.secagg.primitives import SecAggError
from common.wire.messages import ClientUpdate, EvalReport, LowRank, ModelSpec, RoundPlan
from engine.tokens import count_tokens
from server.results import RunReporter, TrainedModel
from server.robust import screen_and_fold
from server.run_state import RunMeta, State, ended_task
from server.secure import require_secure, secagg_report, secure_step
from server.state_lock import StateDirHeld, held
from server.steps import OpenStep, evaluate, following, merge, open_step
from server.store import Store
from server.strategies import make_strategy

Log = Callable[[str], None]
OPEN_IN_ONE_PROCESS = (
    "in one process no operator appends tasks while the run lives: it ends after its last task, as a "
    "coordinator's open run ends at lorm-admin finish; give the tasks the operator will add as more --task (or "
    "lines of --schedule), and the adapter and head are the federation's"
)


class Worker(Protocol):
    """A client as the engine drives it: a plan in, an update or evaluation report out."""

    def handle(self, plan: RoundPlan) -> ClientUpdate | EvalReport: ...


@dataclass
class RunResult:
    config: RunConfig
    matrix: AccuracyMatrix
    adapter: dict[str, LowRank]  # merged backbone delta (B_cat, A_cat) per layer, float64
    head_weight: Tensor  # (num_classes, feature_dim)
    head_bias: Tensor  # (num_classes,)
    seconds: float  # of computing, summed over the resumed parts (not the time between them)
    history: list[dict] = field(default_factory=list)  # one entry per step
    resumes: int = 0  # how often the run went on from a state directory

    def summary(self) -> dict:
        return {
            "config": json.loads(self.config.to_json()),
            "seconds": self.seconds,
            "history": self.history,
            **self.matrix.summary(),
            **privacy_summary(self.history),
            **({"resumes": self.resumes} if self.resumes else {}),
        }


def saved_config(state_dir: str | Path) -> RunConfig | None:
    """The configuration of the run committed in ``state_dir``, or ``None`` if it holds none."""
    if not Path(state_dir).is_dir():
        return None
    meta = Store(state_dir).latest_meta()
    return None if meta is None else RunMeta.from_json(meta).config


def _saved_run(store: Store, config: RunConfig, spec: ModelSpec) -> tuple[RunMeta, dict[str, Tensor]] | None:
    """The committed run in ``store`` to go on with, its resume counted, or ``None`` to start afresh (nothing
    committed, or a coordinator's run still waiting for its clients). A failed run, or one of another
    model, is refused."""
    saved = store.latest_run(config)
    if saved is None or saved[0].state == State.WAITING:
        return None
    run, tensors = saved
    where = f"state directory {store.root} holds a run"
    if run.state == State.FAILED:
        raise ValueError(
            f"{where} that failed at task {run.pointer[0]} step {run.pointer[1]}: nothing to go on with; "
            "use a fresh --state-dir"
        )
    if run.spec is not None and run.spec != spec and not run.spec.completed_by(spec):
        raise ValueError(f"{where} of another model: {run.spec.difference(spec)}")
    run.spec, run.resumes = spec, run.resumes + 1  # the unversioned engine meta: no model, no start time;
    # an older version's: no class names nor max_length
    run.started = time.time() if run.started is None else run.started
    return run, tensors


def client_runtimes(config: RunConfig) -> list[ClientRuntime]:
    """Each client's runtime: one that every client's shard of the dataset shares, or with ``data.owned``
    each client's own data in the folder ``data.clients_dir`` (``client.owned.client_files``), labelled by
    the configuration's schedule of classes as the coordinator sends it at Join."""
    data = config.section(DataSettings)
    if not data.owned:
        return [build_runtime(config)] * config.num_clients
    if not data.clients_dir:
        raise DatasetError(
            "data.owned (what --task and --schedule set): in one process the clients' own data comes from a folder "
            "of every client's files: set data.clients_dir=DIR (DIR/client0.csv, DIR/client1.csv, ...)"
        )
    owns = [client_files(data.clients_dir, i) for i in range(config.num_clients)]
    return owned_runtimes(config, class_schedule(config), owns)


def run_inprocess(
    config: RunConfig,
    log: Log = lambda _: None,
    results_dir: str | Path | None = None,
    wrap: Callable[[int, ClientWorker], Worker] | None = None,
    progress: bool = False,
    state_dir: str | Path | None = None,
) -> RunResult:
    """Run the whole experiment; with ``results_dir``, leave the same results as the coordinator.

    ``wrap(i, worker)``: what stands in for client ``i`` (e.g. a hostile client of
    ``engine.attacks``); by default the worker itself. ``progress``: show which client step runs,
    its batches and the run's ETA on stderr (``common.infra.progress``). ``state_dir``: commit the run
    after every step, and go on from the last commit found there (a run of another configuration
    there is an error: use a fresh directory; one that another run holds, :class:`server.state_lock.StateDirHeld`).
    The process's torch settings that the run changes
    (threads, deterministic kernels) are put back when it returns.
    """
    with process_settings_kept(), held(state_dir):  # no second run on the state directory while this one lasts
        return _run(config, log, results_dir, wrap, progress, state_dir)


def _run(
    config: RunConfig,
    log: Log,
    results_dir: str | Path | None,
    wrap: Callable[[int, ClientWorker], Worker] | None,
    progress: bool,
    state_dir: str | Path | None,
) -> RunResult:
    start = time.perf_counter()
    reporter = RunReporter(results_dir) if results_dir else None
    validate(config)  # what the coordinator would refuse, before any client builds its model
    runtimes = client_runtimes(config)
    runtime = runtimes[0]  # its model is the one every client builds
    strategy = make_strategy(config, runtime.spec)
    store = Store(state_dir) if state_dir is not None else None
    saved = _saved_run(store, config, runtime.spec) if store is not None else None
    robust, secagg = config.section(RobustSettings), config.section(SecAggSettings)
    if secagg.enabled:  # before any client trains: a method that needs individual updates refuses here
        require_secure(config, make_strategy(config, runtime.spec))
    honest = [rt.worker(i, f"client-{i}") for i, rt in enumerate(runtimes)]
    workers: list[Worker] = list(honest)
    if wrap is not None:
        workers = [wrap(i, w) for i, w in enumerate(honest)]
    kinds = [kind_of(phase.value) for phase in strategy.schedule() for _ in range(config.num_clients)]
    shown = Progress(kinds) if progress else None

    def handle(i: int, plan: RoundPlan) -> ClientUpdate | EvalReport:
        if shown is None:
            return workers[i].handle(plan)
        shown.begin(f"task {plan.task} round {plan.round} {plan_name(plan)}, client {i + 1}/{len(workers)}")
        honest[i].on_batch = shown.batch
        try:
            return workers[i].handle(plan)
        finally:
            honest[i].on_batch = None
            shown.end()

    def evaluation(i: int, plan: RoundPlan) -> EvalReport:
        report = handle(i, plan)
        assert isinstance(report, EvalReport)  # an evaluation step is answered with a report
        return report

    def train(i: int, plan: RoundPlan) -> ClientUpdate:
        update = handle(i, plan)
        assert isinstance(update, ClientUpdate)  # every step but the evaluation is answered with an update
        return update

    # Where the run stands (server.run_state): its pointer names the next step (task, index), index
    # len(steps) being the evaluation; the strategy's tensors are its state after the history's last step.
    run = RunMeta(config, State.RUNNING, (0, 0), spec=runtime.spec, started=time.time())
    if saved is not None:
        run, tensors = saved
        strategy.load_state_tensors(tensors)
        if reporter:
            reporter.replay(run.history)
        task, index = run.pointer
        ended = ended_task(run.state, run.pointer)
        if reporter and ended is not None and not reporter.task_exported(ended):  # a crash cut its export short
            reporter.export_task(config, TrainedModel.of(strategy, runtime.spec), ended, run.history)
        if shown is not None:  # the committed steps' client steps are done
            steps_done = sum(len(strategy.steps(t)) + 1 for t in range(task)) + index
            shown.done = steps_done * config.num_clients
        log(f"resumed from {state_dir}: task {task} step {index} ({len(run.history)} steps committed)")
    matrix, history, before_s = run.matrix, run.history, run.seconds

    def commit(pointer: tuple[int, int], state: State) -> None:
        """The run past its last recorded step: at ``pointer`` (the next step; ``DONE``: the last one)."""
        if store is not None:
            run.pointer, run.state, run.seconds = pointer, state, before_s + time.perf_counter() - start
            store.commit(run.to_json(), strategy.state_tensors())
            store.drop_staging()  # a coordinator's submissions to a step now past

    if saved is None:  # nothing committed before the first step: a run cut short in it starts afresh
        log(describe_tasks(strategy.tasks, chosen=config.num_tasks == 0))

    def ordered(step: OpenStep) -> dict[str, Any]:
        """Each client's update folded as it comes, in index order (the coordinator folds so)."""
        assert step.aggregator is not None
        for i in range(len(workers)):
            step.aggregator.fold(train(i, step.plan))
        return {}

    def screened(step: OpenStep) -> dict[str, Any]:
        """Every update first, checked, then screened together, as the coordinator screens a closed step."""
        assert step.aggregator is not None
        updates = [train(i, step.plan) for i in range(len(workers))]
        for update in updates:
            step.aggregator.check(update)
        return {
            "robust": screen_and_fold(
                robust, step.plan, step.aggregator, list(range(len(updates))), updates.__getitem__
            )
        }

    def masked(step: OpenStep) -> dict[str, Any]:
        """The clients' terms masked; only their sum unmasked (server.secure)."""
        assert step.aggregator is not None
        updates = {i: train(i, step.plan) for i in range(len(workers))}
        session = secure_step(step.aggregator, runtime.spec, config, updates, secagg, config.num_clients)
        return {"secagg": secagg_report(session, config.num_clients, step.aggregator)}

    fold = masked if secagg.enabled else screened if robust.enabled else ordered  # the fold policy, chosen once
    # Done: the state says so, or (the unversioned engine meta) its pointer is past the last task.
    running = run.state == State.RUNNING and run.pointer[0] < len(strategy.tasks)
    pointer: tuple[int, int] | None = run.pointer if running else None
    while pointer is not None:
        task, index = pointer
        step = open_step(strategy, config.rounds_per_task, task, index)
        if step.aggregator is None:
            entry, line = evaluate(step, matrix, (evaluation(i, step.plan) for i in range(len(workers))))
        else:
            entry, line = merge(strategy, step, len(workers), fold(step))
        history.append(entry)
        if reporter:
            reporter.step(len(history) - 1, entry)
        log(line)
        pointer = following(strategy, config.rounds_per_task, task, index)
        commit(pointer or (task, index), State.RUNNING if pointer else State.DONE)
        if reporter and (pointer is None or pointer[0] != task):  # the task's model, as the coordinator exports it
            reporter.export_task(config, TrainedModel.of(strategy, runtime.spec), task, history)
    result = RunResult(
        config,
        matrix,
        strategy.adapter(),
        strategy.head_w,
        strategy.head_b,
        before_s + time.perf_counter() - start,
        history,
        run.resumes,
    )
    if reporter:
        reporter.finish(config, TrainedModel.of(strategy, runtime.spec), result.summary())
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorm-sim",
        description="Run a federated class-incremental experiment in one process.",
        epilog=overview(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    add_schedule_arguments(parser, open_help=f"data.open=true, as lorm-server's; {OPEN_IN_ONE_PROCESS}")
    add_logging_arguments(parser)
    parser.add_argument("--results-dir", default="", help="write adapter, head, metrics, plot and TensorBoard here")
    parser.add_argument(
        "--state-dir",
        default="",
        help="commit the run here after every step; run the same command again to go on from the last "
        "committed step (bit-identical to an uninterrupted run)",
    )
    parser.add_argument(
        "--describe",
        metavar="METHOD",
        default="",
        help="print a method's halves and typed settings (defaults, help), or a settings "
        "section's (data, model, robust), and exit",
    )
    parser.add_argument(
        "--count-tokens",
        nargs="+",
        default=[],
        metavar="FILE",
        help="print for each text FILE (a site's training file, every row) the max_length that max_length 0 "
        "would choose there under the run's backbone, then the largest, the max_length to give a run on the "
        "sites' own data; and exit",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (default: a status line on a terminal, else a line every 30 s)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.describe:
        try:
            print(describe(args.describe))
        except ValueError as err:
            parser.error(str(err))
        return 0
    setup_logging(args.log_format)  # the clients' warnings and choices (e.g. max_length 0), on stdout
    try:
        config = validate(config_with_schedule(args))  # the flags of lorm-server's schedule read as it reads them
    except (OSError, ValueError) as err:  # a bad --set names its key and the expected type: say it without a traceback
        parser.error(str(err))
    if args.count_tokens:
        try:
            count_tokens(config, args.count_tokens, lambda line: print(line, flush=True))
        except (DatasetError, FileNotFoundError) as err:
            print(f"lorm-sim: error: {err}", file=sys.stderr)
            return 2
        return 0
    for warning in unread_sections(config):
        print(f"lorm-sim: warning: {warning}", file=sys.stderr)
    if args.open:
        print(f"lorm-sim: --open: {OPEN_IN_ONE_PROCESS}", file=sys.stderr)
    try:
        result = run_inprocess(
            config,
            log=lambda s: print(s, flush=True),
            results_dir=args.results_dir or None,
            progress=not args.no_progress,
            state_dir=args.state_dir or None,
        )
    except (DatasetError, FileNotFoundError, SecAggError, StateDirHeld) as err:  # say what, not where in the code
        print(f"lorm-sim: error: {err}", file=sys.stderr)
        return 2
    print(format_summary(result.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
