"""One client's part in a run, over any transport: :class:`ClientSession` (``setup`` / ``step`` / ``close``).

The session joins, refuses a run below this client's own floor or beyond its caps, builds the model on the client's
own data, keeps the client's privacy ledger, and then answers each plan the coordinator hands out: it trains or
computes, takes part in the step's secure session when there is one (keeping the result across the session's
restarts), and pushes or reports. It never sees how the calls travel: a :class:`Transport` carries them
(``client.transport.CoordinatorClient`` over gRPC), and its refusals arrive as outcomes of the run
(:class:`~client.transport.Restarted`, :class:`~client.transport.Stale`), not a wire's status codes.

A refusal of the run is :class:`Exit` with the process's exit code: 3 for a run this client will not take part in
(named in the log), 2 for this client's own data that cannot be read.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from client.delivery import Delivery, Masked, Pushed
from client.floor import Floor, FloorError, check_floor, pinned
from client.ledger import ClientLedger, budget_line
from client.ledger_file import LedgerRefused, data_digest, ledger_path
from client.local import LocalSettingError, LocalSettings, applied, check_own_data, refuse_coordinator_local
from client.owned import OwnData
from client.plans import Caps, PlanRefused, check_caps
from client.runtime import ClientRuntime, build_runtime, with_tasks
from client.secure import SecureRounds
from client.splits import DatasetError
from client.telemetry import ClientMetrics
from client.transport import Backoff, Restarted, Stale, Transport
from client.worker import ClientWorker
from common.infra.faults import fault_point
from common.infra.logs import plan_name, set_context, step_loss
from common.infra.progress import Progress
from common.infra.tls import Security
from common.methods.checks import validate
from common.privacy.ledger import BudgetExceeded
from common.run.config import RunConfig
from common.run.schedule import same_but_schedule
from common.secagg.primitives import SecAggError
from common.wire.messages import ClientUpdate, EvalReport, Phase, RoundPlan, Wait
from common.wire.tensors import WireError

log = logging.getLogger("lorm.client")


class Exit(Exception):
    """The session ends here: ``code`` is the process's exit code (0 the run is over, 2 this client's data, 3 a run
    refused)."""

    def __init__(self, code: int, why: object = "") -> None:
        super().__init__(str(why))
        self.code = code


@dataclass(frozen=True)
class ClientOptions:
    """What this client decides for itself, from its own flags and environment."""

    client_id: str
    index: int | None = None  # the shard asked for (None: the coordinator assigns one)
    local: LocalSettings = LocalSettings()
    floor: Floor = Floor()
    caps: Caps = Caps()
    security: Security = Security(insecure=True)
    privacy_ledger: Path | None = None
    lifetime_epsilon: float | None = None
    progress_every_s: float = 30.0  # math.inf: no progress lines
    interactive: bool | None = None  # a redrawn status line (None: when stderr is a terminal)


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


class ClientSession:
    """Client ``options.client_id``'s run over ``transport``: :meth:`setup`, then :meth:`step` per plan (or
    :meth:`run` for both and the loop), then :meth:`close`."""

    def __init__(
        self,
        transport: Transport,
        options: ClientOptions,
        metrics: ClientMetrics | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.transport, self.options = transport, options
        self.metrics = metrics or ClientMetrics()
        self.backoff = backoff or Backoff()
        self.skipped: tuple | None = None  # a secure session (step, attempt) that goes on without this client
        self.kept: tuple | None = None  # (step, result) of a secure step: kept, not recomputed, if its session restarts
        self.exit: Exit | None = None  # how :meth:`run` ended, when it ended by a refusal

    # ---------------------------------------------------------------- setup

    def refuse(self, why: object) -> Exit:
        """Refuse the run, naming ``why``: nothing more is sent."""
        log.error("refusing run %s: %s", self.config.run_id, why)
        return Exit(3, why)

    def setup(self) -> None:
        """Join, check the run against this client's floor, caps and local settings before anything more is sent,
        build the model on the client's own data, open its ledger, and describe the model. :class:`Exit` when the
        run is refused or the data cannot be read."""
        o = self.options
        try:
            config, self.index = self.transport.join(o.index)
            validate(config)  # the registry's checks of its settings: what the coordinator itself would refuse
        except WireError as err:  # the coordinator speaks another wire contract: nothing it sends can be read
            log.error("refusing the run: %s", err)
            raise Exit(3, err) from err
        except ValueError as err:  # the Join reply's configuration does not parse: nothing of it is used
            log.error("refusing the run: the coordinator's configuration is invalid: %s", err)
            raise Exit(3, err) from err
        self.joined = self.config = config  # as sent: a later Join must send the same run, its schedule aside
        set_context(run=config.run_id)
        log.info("joined run %s as client %d of %d", config.run_id, self.index, config.num_clients)
        try:  # what this client accepts is its own decision, not the coordinator's
            if not 0 <= self.index < config.num_clients:
                raise LocalSettingError(
                    f"the coordinator gave this client index {self.index} of {config.num_clients} clients"
                )
            self._refuse_coordinator_local(config)
            check_own_data(config, o.local)
            check_caps(config, o.caps)
            self.accepted = check_floor(config, o.floor)
        except (LocalSettingError, FloorError, PlanRefused) as err:
            raise self.refuse(err) from err
        log.info("accepted %s", self.accepted.describe())
        self.config = config = applied(pinned(config, self.accepted), o.local)  # masks with the threshold it checked
        try:
            self.runtime = self._runtime(config)
        except (DatasetError, FileNotFoundError) as err:  # this client's data as configured: say what, and stop
            log.error("cannot load this client's data: %s", err)
            raise Exit(2, err) from err
        self.ledger = self._ledger(o.local.own())
        self.worker = self._worker()
        self.metrics.watch_device(self.runtime.device)
        self.transport.describe(self.runtime.spec)
        log.info(
            "model: %d LoRA layers, device %s; shard sizes per task %s",
            len(self.runtime.spec.layers),
            self.runtime.device,
            [int(s.numel()) for s in self.worker.shards],
        )

    def _refuse_coordinator_local(self, config: RunConfig) -> None:
        """Refuse a configuration that sets what only this client may choose (its data paths, weights, model
        source): :class:`~client.local.LocalSettingError` naming it."""
        refuse_coordinator_local(config, self.options.local)

    def _runtime(self, config: RunConfig) -> ClientRuntime:
        """The model and this client's data for ``config`` (the run as this client accepted it)."""
        return build_runtime(config, self.options.local.own(), self.transport.schedule)

    def _ledger(self, own: OwnData | None) -> ClientLedger | None:
        """This client's privacy ledger when the run has releases to account for (its data's own file)."""
        if not ClientLedger.wanted(self.config):
            return None
        try:  # only now is the training file read again, for its digest
            data = data_digest(self.config, own.train if own is not None else "", self.index)
            ledger = ClientLedger(self.config, self.options.privacy_ledger or ledger_path(data), data)
            ledger.admit(self.options.lifetime_epsilon)
        except (LedgerRefused, OSError) as err:  # another site's file, unreadable, or over the lifetime budget
            raise self.refuse(err) from err
        log.info("privacy ledger %s: %s", ledger.path, budget_line(ledger))
        return ledger

    def _worker(self) -> ClientWorker:
        """The runtime's worker for this client's shard, with the session's ledger and a progress line of its
        step's batches (the coordinator's log has the run's ETA)."""
        worker = self.runtime.worker(self.index, self.options.client_id)
        worker.ledger = self.ledger  # the same account: the run's records do not start afresh
        self.progress = Progress(
            [], interactive=self.options.interactive, every_s=self.options.progress_every_s, emit=log.info
        )
        worker.on_batch = self.progress.batch
        return worker

    def refreshed(self) -> None:
        """The run's schedule as it now stands, learnt by joining again (the same slot): the same model, this
        client's own data read against the longer schedule. :class:`Exit` when the coordinator now states another
        run than the one joined (anything but its schedule changed), or this client has no own data."""
        own = self.options.local.own()
        try:
            config, again = self.transport.join(self.index)
            validate(config)
            if again != self.index or not same_but_schedule(config, self.joined):
                raise LocalSettingError(
                    f"joined again for the run's next tasks, the coordinator sent index {again} (this client's is "
                    f"{self.index}) or another configuration than the run's besides its schedule"
                )
            if own is None or self.transport.schedule is None:
                raise LocalSettingError("the run's schedule grew, but this client has no own data (--data) to match it")
            schedule = self.transport.schedule
            log.info("the run's schedule now has %d tasks: %s", len(schedule), schedule[-1])
            self.runtime = with_tasks(self.runtime, schedule, own)
        except (DatasetError, FileNotFoundError, LocalSettingError) as err:
            log.error("refusing the run's longer schedule: %s", err)
            raise Exit(3, err) from err
        self.worker = self._worker()
        log.info("shard sizes per task %s", [int(s.numel()) for s in self.worker.shards])

    # ---------------------------------------------------------------- the loop

    def run(self) -> int:
        """Set up, then pull and answer plans until the run is over: the exit code (0, or :class:`Exit`'s)."""
        try:
            self.setup()
            waits = 0  # Wait answers in a row: a long idle is polled ever more slowly, up to a bound
            while True:
                try:
                    answer = self.transport.pull()
                except (ValueError, RecursionError) as err:  # a plan that does not decode: nothing of it is used
                    raise self.refuse(f"the coordinator's plan is malformed: {err}") from err
                if isinstance(answer, Wait):
                    waits += 1
                    self.transport.pause(self.backoff.wait_s(answer.retry_after_s, waits))
                    continue
                waits = 0
                if answer.phase == Phase.DONE:
                    log.info("run %s is over", self.config.run_id)
                    return 0
                self.step(answer)
        except Exit as done:
            self.exit = done
            return done.code
        finally:
            self.close()

    def step(self, plan: RoundPlan) -> None:
        """Answer one plan: check it, take part in its secure session when it has one, compute (or take the result
        kept across the session's restarts), push or report. Returns when the client should pull again (also when
        the step went on without it); :class:`Exit` when the run is refused."""
        if plan.task >= len(self.worker.tasks):  # the operator appended tasks since this client joined
            self.refreshed()
        step = (plan.task, plan.round, plan.phase)
        if (*step, plan.secure_attempt) == self.skipped:
            self.transport.pause(1.0)
            return
        set_context(task=plan.task, round=plan.round)
        if plan.phase != Phase.EVALUATE:  # before any key is advertised for it (evaluations: counted by handle)
            try:
                self.worker.check(plan)
            except PlanRefused as err:
                raise self.refuse(err) from err
        delivery = self._delivery(plan)
        if delivery is None:  # this client sits the step's secure session out
            self.skipped = (*step, plan.secure_attempt)
            return
        start = time.perf_counter()
        if self.kept is not None and self.kept[0] == step:
            result = self.kept[1]  # computed before the step's secure session restarted: the same plan, the same result
        else:
            result = self._compute(plan)
            _record(self.metrics, self.config, plan, result, time.perf_counter() - start)
            self.kept = (step, result) if delivery.keeps else None
        try:
            self._send(plan, result, delivery, start)
        except SecAggError as err:  # an unmask request or peer this client will not answer: nothing more revealed
            log.warning("sitting out the rest of secure session %d of this step: %s", plan.secure_attempt, err)
            self.skipped = (*step, plan.secure_attempt)
        except Restarted as err:  # the step's secure session restarted: mask the kept result anew
            log.info("secure aggregation of this step restarted (%s); joining its new session", err)
        except Stale as err:  # a stale step (closed at its deadline without us): drop it and pull the next one
            log.info("update refused (%s); moving on", err)

    def _delivery(self, plan: RoundPlan) -> Delivery | None:
        """How this step's answer is sent: pushed, or, when the run has secure aggregation, masked in the step's
        session (``None``: this client sits that session out)."""
        if not self.accepted.enabled or plan.phase == Phase.EVALUATE:
            return Pushed(self.transport)
        rounds = self._secure_rounds(plan)
        if rounds is None:
            return None
        unmasking = functools.partial(self.ledger.unmasking, plan) if self.ledger is not None else None
        return Masked(rounds, unmasking)

    def _secure_rounds(self, plan: RoundPlan) -> SecureRounds | None:
        """The step's secure session, its keys and sealed shares sent (the others need them to mask); ``None`` when
        this client sits the session out: over inputs a session already unmasked, or a roster that fails its checks,
        or a session that went on without it."""
        if self.ledger is not None and not self.ledger.may_mask(plan):
            log.warning(
                "task %d round %d %s (session %d): a secure session over the same inputs reached an unmask request "
                "that counted this client before: sitting it out (two sums over the same inputs can be differenced, "
                "and fresh noise averaged away)",
                plan.task,
                plan.round,
                plan.phase.value,
                plan.secure_attempt,
            )
            return None
        answered = self.ledger.restart_survivors(plan) if self.ledger is not None else None
        security = self.options.security
        rounds = SecureRounds(self.transport, self.config, self.runtime.spec, self.index, plan, security, answered)
        try:
            rounds.begin()
        except SecAggError as err:  # a roster a hostile peer or coordinator spoilt: this session goes on without us
            log.warning("sitting out secure session %d of this step: %s", plan.secure_attempt, err)
            return None
        except Restarted as err:
            log.info("secure aggregation of this step restarted (%s); joining its new session", err)
            return None
        except Stale as err:
            log.info("secure aggregation of this step goes on without this client (%s); waiting for the next", err)
            return None
        return rounds

    def _compute(self, plan: RoundPlan) -> ClientUpdate | EvalReport:
        """The worker's answer to ``plan``; :class:`Exit` for a plan beyond this client's account or unreadable."""
        self.progress.begin(f"task {plan.task} round {plan.round} {plan_name(plan)}")
        try:
            return self._answer(plan)
        except (BudgetExceeded, LedgerRefused, PlanRefused) as err:  # a plan beyond the account: nothing is sent
            raise self.refuse(err) from err
        except ValueError as err:  # a plan the method's client half cannot read (another mode, a half pair)
            raise self.refuse(f"the coordinator's plan is malformed: {err}") from err
        finally:
            self.progress.end()

    def _answer(self, plan: RoundPlan) -> ClientUpdate | EvalReport:
        """What this client computes for ``plan``: its worker's update or evaluation report."""
        return self.worker.handle(plan)

    def _send(self, plan: RoundPlan, result: ClientUpdate | EvalReport, delivery: Delivery, start: float) -> None:
        """Send ``result`` by ``delivery`` (masked in the step's session when it is secure), or report it."""
        key = idempotency_key(self.config.run_id, plan, self.index)
        if isinstance(result, EvalReport):
            self.transport.report(result, key)
            acc = [100.0 * c / t if t else float("nan") for c, t in zip(result.correct, result.total)]
            log.info("task %d evaluated on my test share: %s", plan.task, " ".join(f"{a:.1f}" for a in acc))
            return
        fault_point("client.push")
        delivery.send(result, key)
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

    def close(self) -> None:
        self.transport.close()


def progress_settings(no_progress: bool, log_format: str) -> tuple[float, bool | None]:
    """``(every_s, interactive)`` of the progress line: a status line on a terminal, else a plain line every 30 s;
    none with ``--no-progress``, and no redrawn line under JSON logs (it is not a JSON record)."""
    quiet = no_progress or log_format == "json"
    return (math.inf if no_progress else 30.0), (False if quiet else None)
