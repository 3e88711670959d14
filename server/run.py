"""The coordinator's run: the step lifecycle (``server/steps.py``) driven from the first step to the export,
committed after every step and resumed from the last commit.

A :class:`Run` holds what a state directory holds of the run (``server/run_state.py``: where it stands, the
history and accuracy matrix, the client slots, the model, the strategy's state) and moves it on: it opens
a step (:meth:`Run.open`: under secure aggregation wrapped in its intake, ``server/secure/intake.py``), closes
one through the step's intake (``server/intake.py``) into one history entry and commits
before the next step opens (:meth:`Run.close`), and exports the model (:meth:`Run.export`). The commit
comes first, as the engine's does: the committed pointer names a step nothing of which has happened (at a
task's first step, the task is not begun), so a restarted coordinator resumes by opening it
(:meth:`Run.resume`). The open step's submissions are the coordinator's (``server/coordinator.py``): it
hands them to the step's intake and closes the step when the intake says it may, under its lock; a
Run is not thread-safe. Beside it: the operator's schedule of an open run (``server/run_schedule.py``:
:meth:`Run.add_task`, :meth:`Run.finish`), and what the run leaves, each task's model and the results
(``server/run_results.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from common.infra.faults import fault_point
from common.infra.progress import Progress, kind_of
from common.run.config import RunConfig
from common.run.metrics import AccuracyMatrix
from common.run.schedule import Schedule, class_schedule, with_schedule
from common.run.settings import DataSettings, DpSettings, RobustSettings, SecAggSettings
from common.secagg.signing import Verifier
from common.secagg.terms import declared_layout
from common.wire.messages import ModelSpec, Phase
from server import run_results, run_schedule
from server.checks import Options, Refused, admit_spec
from server.intake import Intake, PlainIntake, StepState, fold_policy
from server.results import RunReporter
from server.roster import Roster
from server.run_state import RunMeta, State, ended_task
from server.secure import SecureStep, SessionFailed, Staging, Timing, require_secure
from server.secure.intake import SecureIntake
from server.steps import NothingToMerge, evaluate, following, merge, open_step, record
from server.steps import schedule as task_steps
from server.store import Storage, step_key
from server.strategies import Strategy, make_strategy

log = logging.getLogger("lorm.coordinator")


class Run:
    def __init__(
        self,
        config: RunConfig,
        store: Storage,
        options: Options,
        emit: Callable[[str], None],
        on_fatal: Callable[[BaseException], None],
        on_merge: Callable[[str, float], None],
    ) -> None:
        self.config, self.store, self.options = config, store, options
        self.emit = emit
        self.on_fatal = on_fatal
        self.on_merge = on_merge  # (phase, seconds) after each merge: metrics
        self.secagg = config.section(SecAggSettings)
        self.roster = Roster(config.num_clients)
        self.spec: ModelSpec | None = None
        self.strategy: Strategy | None = None
        self.matrix = AccuracyMatrix()
        self.history: list[dict] = []
        self.state = State.WAITING
        self.pointer = (0, 0)  # (task, step index) of the step in progress, or the next to open
        self.started = time.time()
        self.clock = time.perf_counter()  # this process's start: seconds run, for the meta
        self.seconds_before = 0.0  # what the run's earlier processes ran
        self.resumes = 0
        self.schedule: Schedule | None = None  # the tasks by class name once the operator appended any
        self.closed = False  # the operator finished this open run: it ends after its last task
        self.progress: Progress | None = None
        results = options.results_dir or (store.root / "results" if store.root is not None else "")
        self.reporter = RunReporter(results) if options.results and results else None  # None: no results written
        signed = self.secagg.enabled and self.secagg.mode == "signed" and options.secagg_ca
        self.verifier = Verifier(options.secagg_ca) if signed else None  # signed mode: advertises checked at once
        # a step's intake without secure aggregation (one per run: it keeps nothing of a step)
        policy = fold_policy(config.section(RobustSettings), config.num_clients)
        self.plain = PlainIntake(config, options, store, policy, self.awaited, self.emit)

    # ---------------------------------------------------------------- persistence

    def _meta(self) -> RunMeta:
        return RunMeta(
            config=self.config,
            state=self.state,
            pointer=self.pointer,
            matrix=self.matrix,
            history=self.history,
            clients=self.roster.clients,
            spec=self.spec,
            started=self.started,
            seconds=self.seconds,
            resumes=self.resumes,
            schedule=self.schedule,
            closed=self.closed,
        )

    @property
    def seconds(self) -> float:
        """What the run's processes ran it, this one's time so far included."""
        return self.seconds_before + time.perf_counter() - self.clock

    @property
    def live_config(self) -> RunConfig:
        """The configuration the run goes by: its own, with the tasks the operator appended
        (``common.run.schedule.with_schedule``); what a client is sent at Join."""
        return self.config if self.schedule is None else with_schedule(self.config, self.schedule)

    def current_schedule(self) -> Schedule | None:
        """The run's tasks by class name (``None``: the configuration names no classes)."""
        return self.schedule if self.schedule is not None else class_schedule(self.config)

    def commit(self, keep: str | None = None) -> None:
        """Commit the run as it stands; the staged submissions of any step but ``keep`` (the open one's key)
        are dropped."""
        try:
            self.store.commit(self._meta().to_json(), self.strategy.state_tensors() if self.strategy else {})
            self.store.drop_staging(keep=keep)
        except BaseException as err:
            # Memory has moved past what is on disk: stop rather than serve a state that a
            # restart would not reproduce. A restart resumes from the last commit.
            log.critical("could not persist the run state (%s); stopping", err)
            self.on_fatal(err)
            raise

    def resume(self) -> StepState | None:
        """Go on from the newest generation (the engine's too); the step it names, opened (the coordinator
        folds again what was staged for it). A state directory with none: the run's first commit."""
        saved = self.store.latest_run(self.config)
        if saved is None:
            self.commit()
            return None
        meta, tensors = saved
        if meta.spec is None and meta.state != State.WAITING and self.options.model_spec is not None:
            meta.spec = self.options.model_spec  # the engine's unversioned meta, the model the engine's runtime's
            meta.started = time.time() if meta.started is None else meta.started
        if meta.spec is None and meta.state != State.WAITING:
            raise ValueError(
                f"state directory {self.store.root} holds a run at {meta.state.value} task {meta.pointer[0]} step "
                f"{meta.pointer[1]} with no model description (the in-process engine's unversioned meta): go on "
                "with lorm-sim --state-dir, which migrates it"
            )
        self.roster = Roster(self.config.num_clients, meta.clients)
        self.spec, self.state, self.pointer = meta.spec, meta.state, meta.pointer
        self.matrix, self.history = meta.matrix, meta.history
        self.started = meta.started if meta.started is not None else self.started
        self.seconds_before, self.resumes = meta.seconds, meta.resumes + 1
        self.schedule, self.closed = meta.schedule, meta.closed
        if self.reporter is not None:
            self.reporter.replay(self.history)
        if self.spec is not None:
            self.strategy = make_strategy(self.live_config, self.spec)
            self.strategy.load_state_tensors(tensors)
            if self.state == State.RUNNING and self.pointer[0] >= len(self.strategy.tasks):  # an unversioned engine
                last = len(self.strategy.tasks) - 1  # meta's pointer past the last task: the run is done
                steps = task_steps(self.strategy, last, self.config.rounds_per_task)
                self.state, self.pointer = State.DONE, (last, len(steps) - 1)
        ended = ended_task(self.state, self.pointer)
        if ended is not None and self.reporter is not None and not self.reporter.task_exported(ended):
            run_results.export_task(self, ended)  # a crash cut its export short
        return self.open(*self.pointer) if self.state == State.RUNNING else None

    # ---------------------------------------------------------------- the model

    def admit_model(self, spec: ModelSpec, what: str) -> None:
        """Make ``spec`` the run's model (``what``: where it was given) and commit: within the caps, and with
        a strategy built for it, else ``Refused`` with nothing changed."""
        admit_spec(spec, self.config, self.options, what)
        try:
            if self.secagg.enabled:  # a method whose merge needs individual updates refuses here
                require_secure(self.config, make_strategy(self.live_config, spec))
            strategy = make_strategy(self.live_config, spec)
        except (ValueError, RuntimeError) as err:
            raise Refused("INVALID_ARGUMENT", f"{what}: no {self.config.method} model of it ({err})") from err
        self.spec, self.strategy = spec, strategy
        self.commit()

    def complete_model(self, spec: ModelSpec, keep: str | None) -> None:
        """The run's model described again with what its description did not know (``ModelSpec.completed_by``:
        an older version's), committed (``keep``: the open step's key, whose staged submissions stay)."""
        assert self.spec is not None and self.spec.completed_by(spec)
        self.spec = spec
        self.commit(keep=keep)

    def fix_model(self, fixed: ModelSpec, keep: str | None) -> None:
        """The operator's model (``--model-spec``): the run's from the start; a resumed run must have it (or one
        its description completes). ``keep``: the open step's key."""
        if self.spec is None:
            self.admit_model(fixed, "--model-spec")
        elif self.spec.completed_by(fixed):
            self.complete_model(fixed, keep=keep)
        elif fixed != self.spec and not fixed.completed_by(self.spec):  # an older file: the state knows more
            raise ValueError(
                f"state directory {self.store.root} holds a run whose model differs from --model-spec: "
                f"{self.spec.difference(fixed)}"
            )

    # ---------------------------------------------------------------- steps

    def start(self) -> StepState:
        """Every client has joined and the model is known: the run's first step, opened."""
        self.state = State.RUNNING
        self.commit()  # at (0, 0), task 0 not begun: opening the step begins it
        return self.open(0, 0)

    def open(self, task: int, index: int) -> StepState:
        """Step ``index`` of task ``task``: its plan, a fresh aggregator, and its secure aggregation when the
        run has it."""
        assert self.strategy is not None
        if self.progress is None:  # the run's steps, for its ETA in the log (timed from this process's start)
            kinds = [kind_of(p.value) for p in self.strategy.schedule()]
            self.progress = Progress(kinds, interactive=False, every_s=math.inf)  # no lines of its own
        self.progress.done = sum(len(self.strategy.steps(t)) + 1 for t in range(task)) + index
        self.progress.begin(f"task {task} step {index}")
        opened = open_step(self.strategy, self.config.rounds_per_task, task, index)
        plan = opened.plan
        self.pointer = (task, index)
        submitted: set[int] = set()
        intake: Intake = self.plain
        if self.secagg.enabled and opened.fold is not None:  # secure aggregation wraps the step
            key = step_key(task, index)
            staging = Staging(self.store, key, submitted)
            secure = SecureStep(
                self.secagg,
                self.config.num_clients,
                plan,
                declared_layout(opened.fold.aggregator),
                staging,
                Timing(self.options.round_deadline_s, self.options.retry_after_s),
                where=f"task {task} step {index} secure aggregation",
                emit=self.emit,
                state=staging.saved(),
                awaited=self.awaited,
                dp=self.config.section(DpSettings),
                verifier=self.verifier,
            )
            intake = SecureIntake(secure, self.options.retry_after_s)
        started = time.monotonic()
        return StepState(
            task, index, opened.phase, opened.round, plan, opened.fold, started, intake, submitted=submitted
        )

    def awaited(self) -> set[int]:
        """The slots a step waits for: every one, or in a ``--start-with`` run that has started, those a client
        has joined (a slot nobody holds has no update to wait for; its client, when it comes, takes the step open
        then). A client that joined and went silent is waited for, up to the deadline."""
        joined = set(self.roster.clients.values())
        start_with = self.options.start_with
        if start_with and len(joined) >= start_with:
            return joined
        return set(range(self.config.num_clients))

    def close(self, step: StepState) -> StepState | None:
        """Close ``step`` through its intake, merge and record it (``server/steps.py``: the lifecycle
        the engine shares), commit and open the next one. Returns the step open after it: ``step`` itself
        while its secure aggregation runs a fresh session, ``None`` once the run is over."""
        assert self.strategy is not None
        eta = ""
        if self.progress is not None:
            self.progress.end()
            eta = f"; {self.progress.run_text()}"
        if step.aggregator is None:
            entry, line = evaluate(step, self.matrix, (step.reports[i] for i in sorted(step.reports)))
        else:
            try:
                extras = step.intake.close(step, step.aggregator)
            except SessionFailed as failed:  # a fresh secure session runs, or the step gave up
                if failed.record is None:
                    return step
                sessions = len(failed.record["failed"])
                why = f"task {step.task} step {step.index} secure aggregation: {sessions} sessions failed"
                return self._end_unmerged(step, why, {"secagg": failed.record}, clients=0)

            def merged(seconds: float) -> None:
                fault_point("merge.aggregated")
                self.on_merge(step.phase.value, seconds)

            try:
                entry, line = merge(self.strategy, step, len(step.submitted), extras, merged)
            except NothingToMerge as empty:  # clients on their own data, none of it this task's
                return self._end_unmerged(step, str(empty), {"empty": str(empty)}, clients=len(step.submitted))
        self.emit(line + eta)
        self.history.append(entry)
        if self.reporter is not None:
            self.reporter.step(len(self.history) - 1, entry)
        return self._advance(step)

    def _end_unmerged(self, step: StepState, why: str, extra: dict, clients: int) -> StepState | None:
        """``step`` cannot merge (``why``, which names the step): its secure aggregation gave up, or its updates
        hold no sample of the task. It ends without a merge, recorded in the history with ``extra`` and the
        ``clients`` that took part. A training round keeps the last merged state; any other step's merge is needed
        by the steps after it, so the run ends, ``failed``. Never raised: one party's failure (or a task nobody
        holds data of) must not stop the coordinator, its ticker or a restart of it."""
        entry = record(step.task, step.round, step.phase, step.plan, clients=clients) | extra
        self.history.append(entry)
        if self.reporter is not None:
            self.reporter.step(len(self.history) - 1, entry)
        if step.phase == Phase.TRAIN:
            self.emit(f"{why}; the round ends without a merge")
            return self._advance(step)
        self.emit(f"{why}; a {step.phase.value} step's merge is needed by the steps after it: the run ends (failed)")
        self.state = State.FAILED
        self.commit()
        return None

    def _advance(self, step: StepState) -> StepState | None:
        """Commit the run past ``step`` (recorded in the history), then open the step after it; after the last
        one the run is ``DONE``."""
        assert self.strategy is not None
        after = following(self.strategy, self.config.rounds_per_task, step.task, step.index)
        if after is not None:
            self.pointer = after
        elif self.config.section(DataSettings).open and not self.closed:
            self.state, self.pointer = State.IDLE, (step.task + 1, 0)
        else:
            self.state = State.DONE
        self.commit()
        if after is None or after[0] != step.task:  # the task's last step: its model, before the next task begins
            run_results.export_task(self, step.task)
        if self.state == State.IDLE:  # said once it is on disk: a restart from here resumes idle
            self.emit(
                f"task {step.task} was the schedule's last: the run is open and waits for the operator's next task "
                "(lorm-admin add-task) or its end (lorm-admin finish)"
            )
        return self.open(*after) if after is not None else None

    # ---------------------------------------------------------------- the operator's schedule (server/run_schedule.py)

    def add_task(self, classes: list[str], keep: str | None) -> StepState | None:
        """The operator's task of ``classes`` appended to an open run, committed (``keep``: the open step's key):
        :func:`server.run_schedule.add_task`. Returns its first step, opened, when the run was idle."""
        return run_schedule.add_task(self, classes, keep)

    def finish(self, keep: str | None) -> None:
        """The operator ends an open run: :func:`server.run_schedule.finish`."""
        run_schedule.finish(self, keep)

    # ---------------------------------------------------------------- the end (server/run_results.py)

    def export(self) -> None:
        """The results of a run ``DONE``: :func:`server.run_results.export`."""
        run_results.export(self)

    def summary(self) -> dict:
        return run_results.summary(self)
