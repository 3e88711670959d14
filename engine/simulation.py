"""The in-process engine: the coordinator and N clients in one process, no sockets.

It is the federation itself, carried in process: one :class:`~server.coordinator.Coordinator` (the run's one driver,
``server/run.py``: its fold policy, commits, resume and export) and one :class:`~client.session.ClientSession` per
client (the session every ``lorm-client`` runs: its checks, privacy ledger and secure rounds), each in a thread,
their calls carried by :class:`engine.transport.InProcessTransport` instead of gRPC. The clients compute one at a
time (they share torch's global generator; each step is seeded by its plan), and the coordinator folds their updates
in index order whatever order they arrive in, so a run is the same, bit for bit, as over gRPC.

With a state directory, the coordinator commits the run there after every step (``server.store.Store``), and a run
started again on the same directory, by this engine or by ``lorm-server``, goes on from the last committed step;
without one, the run's state is kept in memory (``server.store.MemoryStore``). Each client's privacy ledger lies in
a scratch folder of the run: a simulated client has no records of its own to account across runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from client.local import LocalSettings
from client.owned import client_files
from client.runtime import ClientRuntime, build_runtime, owned_runtimes, process_settings_kept
from client.session import ClientOptions
from client.splits import DatasetError
from client.worker import ClientWorker
from common.infra.logs import add_logging_arguments, setup_logging
from common.infra.progress import Progress, kind_of
from common.infra.tls import Security
from common.methods import describe, overview
from common.methods.checks import unread_sections, validate
from common.privacy.ledger import privacy_summary
from common.run.arguments import add_config_arguments
from common.run.config import RunConfig
from common.run.metrics import AccuracyMatrix, format_summary
from common.run.partition import describe_tasks
from common.run.schedule import add_schedule_arguments, class_schedule, config_with_schedule
from common.run.settings import DataSettings, SecAggSettings
from common.secagg.primitives import SecAggError
from common.wire.messages import LowRank
from engine.clients import EngineSession, Worker, play
from engine.tokens import count_tokens
from engine.transport import Hub, InProcessTransport
from server.certs import Pki, create_dev_pki
from server.checks import Options
from server.coordinator import Coordinator
from server.run_state import RunMeta, State
from server.secure import require_secure
from server.state_lock import StateDirHeld, held
from server.store import MemoryStore, Store
from server.strategies import Strategy, make_strategy

Log = Callable[[str], None]
OPEN_IN_ONE_PROCESS = (
    "in one process no operator appends tasks while the run lives: it ends after its last task, as a "
    "coordinator's open run ends at lorm-admin finish; give the tasks the operator will add as more --task (or "
    "lines of --schedule), and the adapter and head are the federation's"
)


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
    strategy: Strategy | None = None  # the coordinator's, as the run left it

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


def client_runtimes(config: RunConfig) -> list[tuple[ClientRuntime, LocalSettings]]:
    """Each client's runtime and own settings: one runtime that every client's shard of the dataset shares, or with
    ``data.owned`` each client's own data in the folder ``data.clients_dir`` (``client.owned.client_files``), labelled
    by the configuration's schedule of classes as the coordinator sends it at Join, and named as the client's
    ``--data``/``--test-data``."""
    data = config.section(DataSettings)
    if not data.owned:
        return [(build_runtime(config), LocalSettings())] * config.num_clients
    if not data.clients_dir:
        raise DatasetError(
            "data.owned (what --task and --schedule set): in one process the clients' own data comes from a folder "
            "of every client's files: set data.clients_dir=DIR (DIR/client0.csv, DIR/client1.csv, ...)"
        )
    owns = [client_files(data.clients_dir, i) for i in range(config.num_clients)]
    runtimes = owned_runtimes(config, class_schedule(config), owns)
    return [(rt, LocalSettings(data=own.train, test_data=own.test)) for rt, own in zip(runtimes, owns, strict=True)]


def run_inprocess(
    config: RunConfig,
    log: Log = lambda _: None,
    results_dir: str | Path | None = None,
    wrap: Callable[[int, ClientWorker], Worker] | None = None,
    progress: bool = False,
    state_dir: str | Path | None = None,
    *,
    sessions: Callable[[int], type[EngineSession]] | None = None,
    deadline_s: float = 0.0,
) -> RunResult:
    """Run the whole experiment; with ``results_dir``, leave the same results as the coordinator.

    ``wrap(i, worker)``: what stands in for client ``i`` (e.g. a hostile client of
    ``engine.attacks``); by default the worker itself. ``progress``: show which client step runs,
    its batches and the run's ETA on stderr (``common.infra.progress``). ``state_dir``: commit the run
    after every step, and go on from the last commit found there (a run of another configuration
    there is an error: use a fresh directory; one that another run holds, :class:`server.state_lock.StateDirHeld`).
    ``sessions(i)``: client ``i``'s session class (default :class:`EngineSession`; e.g. a test's client that leaves a
    secure session); ``deadline_s``: how long a step waits for a client that does not answer once enough have
    (``lorm-server --round-deadline``; 0: for ever). The process's torch settings that the run changes
    (threads, deterministic kernels) are put back when it returns.
    """
    clients = Clients(wrap, sessions or (lambda i: EngineSession), deadline_s)
    # no second run on the state directory while this one lasts; the clients' ledgers and certificates in scratch
    with process_settings_kept(), held(state_dir), tempfile.TemporaryDirectory(prefix="lorm-sim-") as scratch:
        return _run(config, log, results_dir, progress, state_dir, clients, Path(scratch))


@dataclass(frozen=True)
class Clients:
    """How the engine's clients run: ``wrap``'s stand-ins, each one's session class, the steps' deadline."""

    wrap: Callable[[int, ClientWorker], Worker] | None
    session: Callable[[int], type[EngineSession]]
    deadline_s: float


def _sessions(
    config: RunConfig,
    hub: Hub,
    clients: Clients,
    own: list[tuple[ClientRuntime, LocalSettings]],
    shown: Progress | None,
    scratch: Path,
    pki: Pki | None,
    joined: Callable[[], None],
) -> list[EngineSession]:
    """Each client's session over ``hub``'s transport, on its runtime and own settings, its ledger in ``scratch``
    (with ``pki``, its certificate there); ``joined()`` once every client has set up (the run has started)."""
    computing, ready = threading.Lock(), []

    def set_up() -> None:  # under the computing lock: one client at a time
        ready.append(1)
        if len(ready) == config.num_clients:
            joined()

    return [
        clients.session(i)(
            InProcessTransport(hub, f"client-{i}"),
            ClientOptions(
                client_id=f"client-{i}",
                index=i,
                local=own[i][1],
                privacy_ledger=scratch / f"client-{i}.json",
                security=_security(pki, f"client-{i}"),
                progress_every_s=math.inf,
                interactive=False,
            ),
            own[i][0],
            computing,
            clients.wrap,
            shown,
            set_up,
        )
        for i in range(config.num_clients)
    ]


def _signing_pki(config: RunConfig, scratch: Path) -> Pki | None:
    """In secure aggregation's signed mode, a CA of the run's and a certificate for each client (in ``scratch``):
    the clients sign their keys and check each other's, the coordinator checks each advertise, as over gRPC."""
    secagg = config.section(SecAggSettings)
    if not (secagg.enabled and secagg.mode == "signed"):
        return None
    return create_dev_pki(scratch / "pki", [f"client-{i}" for i in range(config.num_clients)])


def _security(pki: Pki | None, client_id: str) -> Security:
    if pki is None:
        return Security(insecure=True)
    return Security(ca=str(pki.ca), cert=str(pki.client_cert(client_id)), key=str(pki.client_key(client_id)))


def _refuse_failed(coord: Coordinator, state_dir: str | Path) -> None:
    run = coord.run
    if run.state == State.FAILED:
        raise ValueError(
            f"state directory {state_dir} holds a run that failed at task {run.pointer[0]} step {run.pointer[1]}: "
            "nothing to go on with; use a fresh --state-dir"
        )


def _run(
    config: RunConfig,
    log: Log,
    results_dir: str | Path | None,
    progress: bool,
    state_dir: str | Path | None,
    clients: Clients,
    scratch: Path,
) -> RunResult:
    validate(config)  # what the coordinator would refuse, before any client builds its model
    clients_own = client_runtimes(config)
    spec = clients_own[0][0].spec  # the model every client builds
    if config.section(SecAggSettings).enabled:  # a method that needs individual updates refuses by its own name
        require_secure(config, make_strategy(config, spec))
    store = Store(state_dir) if state_dir is not None else MemoryStore()
    pki = _signing_pki(config, scratch)
    options = Options(
        results_dir=str(results_dir or ""),
        results=results_dir is not None,
        model_spec=spec,
        round_deadline_s=clients.deadline_s,
        secagg_ca=str(pki.ca) if pki is not None else "",
    )
    # What the coordinator says while it resumes and its clients join is the engine's first line; from the first
    # step on, its lines are the run's log.
    say: list[Log] = [lambda line: None]
    coord = Coordinator(config, store, options, on_event=lambda line: say[0](line))
    run, strategy = coord.run, coord.run.strategy  # the run's steps: its tasks' description, the progress line
    assert strategy is not None  # the model is the engine's (Options.model_spec): the coordinator built its strategy
    if state_dir is not None and run.resumes and run.state != State.WAITING:
        _refuse_failed(coord, state_dir)
        task, index = run.pointer
        log(f"resumed from {state_dir}: task {task} step {index} ({len(run.history)} steps committed)")
    else:
        log(describe_tasks(strategy.tasks, chosen=config.num_tasks == 0))
    if config.section(DataSettings).open and not coord.done.is_set():
        coord.finish()  # in one process no operator adds tasks: the run ends after its last one
    shown = None
    if progress:
        kinds = [kind_of(phase.value) for phase in strategy.schedule() for _ in range(config.num_clients)]
        shown = Progress(kinds)
        task, index = run.pointer
        shown.done = (sum(len(strategy.steps(t)) + 1 for t in range(task)) + index) * config.num_clients
    if not coord.done.is_set():
        hub = Hub(coord)
        play(_sessions(config, hub, clients, clients_own, shown, scratch, pki, lambda: say.__setitem__(0, log)), hub)
    if run.state != State.DONE:
        raise RuntimeError(f"the run ended {run.state.value} at task {run.pointer[0]} step {run.pointer[1]}")
    return RunResult(
        config,
        run.matrix,
        strategy.adapter(),
        strategy.head_w,
        strategy.head_b,
        run.seconds,
        run.history,
        run.resumes,
        strategy,
    )


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
