"""The in-process engine's clients: each is the :class:`~client.session.ClientSession` a ``lorm-client`` runs, over
the in-process transport (``engine/transport.py``), in a thread of its own (:func:`play`).

An :class:`EngineSession` differs from a client process's session in what one process shares: the runtime (one model
and dataset for every client of a shard of a common dataset), torch's global generator (so the clients build and
compute one at a time), the configuration's paths (in one process they are the one party's own), and the run's
progress line; a ``wrap`` stands a hostile client in for the worker's answers (``engine.attacks``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from client.runtime import ClientRuntime
from client.session import ClientOptions, ClientSession
from client.worker import ClientWorker
from common.infra.logs import context_kept, plan_name
from common.infra.progress import Progress
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, EvalReport, RoundPlan
from engine.transport import Hub, InProcessTransport, RunAborted

CLIENT_LOG = logging.getLogger("lorm.client")


class Worker(Protocol):
    """A client as the engine drives it: a plan in, an update or evaluation report out."""

    def handle(self, plan: RoundPlan) -> ClientUpdate | EvalReport: ...


class EngineSession(ClientSession):
    """A client of the in-process engine: the session every client runs (``client.session``), on the engine's runtime
    for it (built once for every client of a shard of a common dataset), one at a time with its peers (they share
    torch's global generator, which each step seeds and draws from), answering through ``stand_in`` (``wrap``'s
    hostile client, or the worker itself) and counting its steps in the run's progress line."""

    def __init__(
        self,
        transport: InProcessTransport,
        options: ClientOptions,
        runtime: ClientRuntime,
        computing: threading.Lock,
        wrap: Callable[[int, ClientWorker], Worker] | None,
        shown: Progress | None,
        set_up: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(transport, options)
        self.hub = transport.hub
        self.shared, self.computing, self.wrap, self.shown = runtime, computing, wrap, shown
        self.set_up = set_up  # called once this client has joined and described its model

    def setup(self) -> None:
        with self.computing:
            super().setup()
            self.set_up()

    def _refuse_coordinator_local(self, config: RunConfig) -> None:
        """Nothing to refuse: in one process the configuration is the one party's, its paths the clients' own."""

    def _runtime(self, config: RunConfig) -> ClientRuntime:
        return self.shared

    def _worker(self) -> ClientWorker:
        worker = super()._worker()
        self.stand_in: Worker = worker if self.wrap is None else self.wrap(self.index, worker)
        return worker

    def _compute(self, plan: RoundPlan) -> ClientUpdate | EvalReport:
        with self.computing:
            self.hub.check()  # a peer failed while this client waited for its turn: nothing more is computed
            if self.shown is None:
                return super()._compute(plan)
            n = self.config.num_clients
            self.shown.begin(f"task {plan.task} round {plan.round} {plan_name(plan)}, client {self.index + 1}/{n}")
            self.worker.on_batch = self.shown.batch
            try:
                return super()._compute(plan)
            finally:
                self.worker.on_batch = None
                self.shown.end()

    def _answer(self, plan: RoundPlan) -> ClientUpdate | EvalReport:
        return self.stand_in.handle(plan)


def play(sessions: list[EngineSession], hub: Hub) -> None:
    """Every session in its own thread until the run is over; the first failure (an exception, or a client's refusal
    of the run) raised here once every thread has stopped."""
    failures: dict[int, BaseException] = {}

    def play(i: int, session: EngineSession) -> None:
        try:
            code = session.run()
        except RunAborted:
            return
        except BaseException as err:  # noqa: BLE001 (raised again in the caller's thread)
            failures[i] = err
            hub.fail(err)
            return
        if code != 0:
            why = session.exit.__cause__ or session.exit if session.exit is not None else None
            failures[i] = why if isinstance(why, Exception) else RuntimeError(f"client {i} exited with code {code}")
            hub.fail(failures[i])

    threads = [
        threading.Thread(target=play, args=(i, s), name=f"client-{i}", daemon=True) for i, s in enumerate(sessions)
    ]
    with context_kept():  # each client sets the process's log context (run, task, round); the caller's comes back
        level = CLIENT_LOG.level  # a client's own lines (each step's samples and loss) are not the run's log: the
        CLIENT_LOG.setLevel(max(logging.WARNING, CLIENT_LOG.getEffectiveLevel()))  # coordinator's step lines are
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException as err:  # Ctrl-C: the clients stop where they wait, and the interrupt goes on
            hub.fail(err)
            raise
        finally:
            CLIENT_LOG.setLevel(level)
    if failures:
        raise failures[min(failures)]
