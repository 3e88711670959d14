"""The run state machine: waiting for clients -> task t, step k -> ... -> evaluation -> done.

Transport-agnostic and thread-safe; the gRPC servicer is a thin layer over it. Each task's
steps are the strategy's (``TRAIN`` rounds, then e.g. ``TASK_GRAM``) followed by ``EVALUATE``.

Submissions are staged on disk (durable before they are acknowledged) and folded into the
strategy's running sums in client-index order as soon as every lower index has been folded,
so the result is bit-identical to the in-process engine, which folds clients 0..N-1 in
order; an update that arrives ahead of its turn waits on disk, not in memory. A step ends
when every client has submitted, or once its deadline has passed with a quorum; the
missing clients are then skipped and their late updates refused. In robust mode
(``robust.enabled``, ``server.robust``) nothing is folded until the step closes: the staged
updates are then screened together and what passes is folded, in index order.

After every step the state is committed atomically (``server.store``), before the next step
opens, in the meta schema the in-process engine writes too (``server.run_state``); a restarted
coordinator resumes from the last commit, opens the step it names and re-folds the submissions
staged for it.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.aggregation.validate import UpdateRejected, check_declared
from common.infra.faults import fault_point
from common.infra.progress import Progress, kind_of
from common.run.config import RunConfig
from common.run.metrics import AccuracyMatrix
from common.run.partition import describe_tasks
from common.run.settings import RobustSettings, SecAggSettings
from common.secagg.rounds import Keys
from common.secagg.terms import declared_layout
from common.wire.messages import ClientUpdate, EvalReport, ModelSpec, Phase, RoundPlan, Wait
from server.checks import (
    Options,
    Refused,
    admit_spec,
    check_counts,
    check_run_id,
    check_same_spec,
    check_step,
    sample_bounds,
)
from server.results import RunReporter
from server.roster import Roster
from server.run_state import RunMeta, State
from server.secure import SecureStep, SessionFailed, Staging, Timing, require_secure
from server.steps import OpenStep, StepState, evaluate, fold_policy, following, merge, open_step, record
from server.store import Store
from server.strategies import Strategy, make_strategy

log = logging.getLogger("lorm.coordinator")


class Coordinator:
    def __init__(
        self,
        config: RunConfig,
        state_dir: str | Path,
        options: Options | None = None,
        on_event: Callable[[str], None] | None = None,
        on_fatal: Callable[[BaseException], None] = lambda err: None,
        on_merge: Callable[[str, float], None] = lambda phase, seconds: None,
    ) -> None:
        self.options = options or Options()
        self.store = Store(state_dir)
        self.lock = threading.RLock()
        self.done = threading.Event()
        self.emit = on_event or log.info
        self.on_fatal = on_fatal
        self.on_merge = on_merge  # (phase, seconds) after each merge: metrics
        self.config = config
        self.robust = config.section(RobustSettings)
        self.folding = fold_policy(self.robust, config.section(SecAggSettings).enabled, config.num_clients)
        self.secagg_settings = config.section(SecAggSettings)
        self.progress: Progress | None = None
        self.roster = Roster(config.num_clients)  # the client slots, committed in the meta
        self.spec: ModelSpec | None = None
        self.strategy: Strategy | None = None
        self.matrix = AccuracyMatrix()
        self.history: list[dict] = []
        self.state = State.WAITING
        self.step: StepState | None = None
        self.pointer = (0, 0)  # (task, step index) of the step in progress, or the next to open
        self.started = time.time()
        self.clock = time.perf_counter()  # this process's start: seconds run, for the meta
        self.seconds_before = 0.0  # what the run's earlier processes ran
        self.resumes = 0
        self.released: set[str] = set()  # clients told that the run is over
        self.reporter = RunReporter(self.options.results_dir or self.store.root / "results")
        self._resume()
        fixed = self.options.model_spec
        if fixed is not None and self.spec is None:
            admit_spec(fixed, self.config, self.options, "--model-spec")
            self.spec, self.strategy = fixed, self._strategy_for(fixed, "--model-spec")
            self._commit()
        elif fixed is not None and fixed != self.spec:
            raise ValueError(
                f"state directory {self.store.root} holds a run whose model differs from --model-spec: "
                f"{self.spec.difference(fixed) if self.spec else ''}"
            )

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
            seconds=self.seconds_before + time.perf_counter() - self.clock,
            resumes=self.resumes,
        )

    def _commit(self) -> None:
        try:
            self.store.commit(self._meta().to_json(), self.strategy.state_tensors() if self.strategy else {})
            self.store.drop_staging(keep=self.step.key if self.step else None)
        except BaseException as err:
            # Memory has moved past what is on disk: stop rather than serve a state that a
            # restart would not reproduce. A restart resumes from the last commit.
            log.critical("could not persist the run state (%s); stopping", err)
            self.on_fatal(err)
            raise

    def _resume(self) -> None:
        """Go on from the newest generation (the engine's too): open the step it names and fold again what
        was staged for it."""
        saved = self.store.latest_run(self.config)
        if saved is None:
            self._commit()
            return
        meta, tensors = saved
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
        self.reporter.replay(self.history)
        if self.spec is not None:
            self.strategy = make_strategy(self.config, self.spec)
            self.strategy.load_state_tensors(tensors)
        if self.state == State.RUNNING:
            self._open_step(*self.pointer)
            self._refold_staged()
        elif self.state == State.DONE:
            self._export()  # again: a crash may have cut the export short; it is a pure function of the state
            self.done.set()
        elif self.state == State.FAILED:
            self.done.set()
        self.emit(
            f"resumed run {self.config.run_id} at {self.state.value} task {self.pointer[0]} step {self.pointer[1]}"
        )

    # ---------------------------------------------------------------- steps

    def _open_step(self, task: int, index: int) -> None:
        assert self.strategy is not None
        if self.progress is None:  # the run's steps, for its ETA in the log (timed from this process's start)
            kinds = [kind_of(p.value) for p in self.strategy.schedule()]
            self.progress = Progress(kinds, interactive=False, every_s=math.inf)  # no lines of its own
        self.progress.done = sum(len(self.strategy.steps(t)) + 1 for t in range(task)) + index
        self.progress.begin(f"task {task} step {index}")
        opened = open_step(self.strategy, self.config.rounds_per_task, task, index)
        plan = opened.plan
        self.pointer = (task, index)
        self.step = StepState(task, index, opened.phase, opened.round, plan, opened.aggregator, time.monotonic())
        if self.secagg_settings.enabled and opened.phase != Phase.EVALUATE:
            step = self.step
            step.secure = SecureStep(
                self.secagg_settings,
                self.config.num_clients,
                plan,
                declared_layout(self.strategy.aggregator(plan)),
                Staging(self.store, step.key, step.submitted),
                Timing(self.options.round_deadline_s, self.options.retry_after_s),
                where=f"task {task} step {index} secure aggregation",
                emit=self.emit,
                state=self.store.load_secagg(step.key),
            )

    def _refold_staged(self) -> None:
        step = self.step
        assert step is not None
        for index in self.store.staged_indices(step.key):
            if step.phase == Phase.EVALUATE:
                step.reports[index] = self.store.load_eval(step.key, index)
            step.submitted.add(index)
        if step.secure is not None:
            step.secure.resume()
        self._fold_ready()
        self._maybe_finish()

    def _fold_ready(self, fresh: ClientUpdate | None = None) -> None:
        """Fold what the run's fold policy folds as updates arrive (``fresh``: the one just staged)."""
        step = self.step
        assert step is not None
        if step.aggregator is not None:
            self.folding.arrived(step, step.aggregator, self._loader(step), fresh)

    def _loader(self, step: StepState) -> Callable[[int], ClientUpdate]:
        """Client ``i``'s staged update of ``step``, read from disk."""
        return functools.partial(self.store.load_update, step.key)

    def _deadline_passed(self) -> bool:
        step = self.step
        assert step is not None
        quorum = self.options.quorum or self.config.num_clients
        return (
            self.options.round_deadline_s > 0
            and time.monotonic() - step.started > self.options.round_deadline_s
            and len(step.submitted) >= quorum
        )

    def _maybe_finish(self) -> None:
        step = self.step
        if step is None or self.state != State.RUNNING:
            return
        if step.secure is not None:
            self._secure_advance()
            return
        everyone = len(step.submitted) == self.config.num_clients
        if not everyone and not self._deadline_passed():
            return
        if not everyone:
            missing = sorted(set(range(self.config.num_clients)) - step.submitted)
            self.emit(f"task {step.task} step {step.index} deadline passed: closing without clients {missing}")
        self._finish_step()

    def _finish_step(self) -> None:
        """Close the open step through this run's fold policy, merge and record it (``server/steps.py``: the
        lifecycle the engine shares), commit and open the next one."""
        step = self.step
        assert step is not None and self.strategy is not None
        eta = ""
        if self.progress is not None:
            self.progress.end()
            eta = f"; {self.progress.run_text()}"
        opened = OpenStep(step.task, step.index, step.phase, step.round, step.plan, step.aggregator)
        if step.aggregator is None:
            entry, line = evaluate(opened, self.matrix, (step.reports[i] for i in sorted(step.reports)))
        else:
            try:
                extras = self.folding.close(step, step.aggregator, self._loader(step))
            except SessionFailed as failed:  # a fresh secure session runs, or the step gave up
                if failed.record is not None:
                    self._end_unmerged(step, failed.record)
                return

            def merged(seconds: float) -> None:
                fault_point("merge.aggregated")
                self.on_merge(step.phase.value, seconds)

            entry, line = merge(self.strategy, opened, len(step.submitted), extras, merged)
        self.emit(line + eta)
        self.history.append(entry)
        self.reporter.step(len(self.history) - 1, entry)
        self._advance(step)
        if self.state == State.DONE:
            self._export()
            self.done.set()

    def _end_unmerged(self, step: StepState, failed: dict) -> None:
        """``step``'s secure aggregation gave up (``failed``: why each session failed, whom it excluded): the
        step ends without a merge, recorded in the history. A training round keeps the last merged state;
        any other step's merge is needed by the steps after it, so the run ends, ``failed``. Never raised:
        one party's failure must not stop the coordinator, its ticker or a restart of it."""
        where = f"task {step.task} step {step.index} secure aggregation"
        entry = record(step.task, step.round, step.phase, step.plan, clients=0) | {"secagg": failed}
        self.history.append(entry)
        self.reporter.step(len(self.history) - 1, entry)
        if step.phase == Phase.TRAIN:
            self.emit(f"{where}: {len(failed['failed'])} sessions failed; the round ends without a merge")
            self._advance(step)
        else:
            self.emit(
                f"{where}: {len(failed['failed'])} sessions failed; a {step.phase.value} step's merge is needed by "
                "the steps after it: the run ends (failed)"
            )
            self.step, self.state = None, State.FAILED
            self._commit()
        if self.state == State.FAILED:
            self.done.set()

    def _advance(self, step: StepState) -> None:
        """Commit the run past ``step`` (recorded in the history), then open the step after it; after the last
        one the run is ``DONE``. The commit comes first, as the engine's does: the committed pointer names a
        step nothing of which has happened (at a task's first step, the task is not begun; ``server/run_state.py``)."""
        assert self.strategy is not None
        after = following(self.strategy, self.config.rounds_per_task, step.task, step.index)
        self.step = None
        if after is None:
            self.state = State.DONE
        else:
            self.pointer = after
        self._commit()
        if after is not None:
            self._open_step(*after)

    def _export(self) -> None:
        assert self.strategy is not None and self.spec is not None
        out = self.reporter.finish(
            self.config,
            self.spec,
            self.strategy.adapter(),
            self.strategy.head_w,
            self.strategy.head_b,
            self.summary(),
            self.strategy.dense_delta(),
            self.strategy.exports(),
        )
        self.emit(
            f"run {self.config.run_id} done: FAA {self.matrix.faa():.2f} "
            f"(sample-weighted {self.matrix.faa_weighted():.2f}), results in {out}"
        )

    def summary(self) -> dict:
        return {
            "run_id": self.config.run_id,
            "config": json.loads(self.config.to_json()),
            "seconds": time.time() - self.started,
            "history": self.history,
            **self.matrix.summary(),
        }

    # ---------------------------------------------------------------- client calls

    def join(self, client_id: str, requested_index: int | None = None) -> int:
        """The client slot ``client_id`` holds (``server/roster.py``), committed before it is answered."""
        with self.lock:
            index, new = self.roster.join(client_id, requested_index)
            if new:
                self._commit()
                fault_point("join.committed")
                self.emit(f"client {client_id} joined as index {index} ({len(self.roster.clients)}/{self.roster.size})")
            return index

    def describe(self, client_id: str, spec: ModelSpec) -> None:
        """A client's model: it must be the run's (fixed by --model-spec or by the first Describe)."""
        with self.lock:
            self.roster.index_of(client_id)
            if self.spec is None:
                admit_spec(spec, self.config, self.options, "model_spec_json")
                self.spec, self.strategy = spec, self._strategy_for(spec, "model_spec_json")
                self._commit()
            else:
                check_same_spec(self.spec, spec, client_id)
            self._maybe_start()

    def _strategy_for(self, spec: ModelSpec, what: str) -> Strategy:
        try:  # before anything is assigned: a spec no strategy can be built for changes nothing
            if self.secagg_settings.enabled:  # a method whose merge needs individual updates refuses here
                require_secure(self.config, make_strategy(self.config, spec))
            return make_strategy(self.config, spec)
        except (ValueError, RuntimeError) as err:
            raise Refused("INVALID_ARGUMENT", f"{what}: no {self.config.strategy} model of it ({err})") from err

    def _maybe_start(self) -> None:
        if self.state == State.WAITING and self.strategy is not None and self.roster.full:
            self.state = State.RUNNING
            self._commit()  # at (0, 0), task 0 not begun: opening the step begins it
            self._open_step(0, 0)
            self.emit(f"all {self.config.num_clients} clients joined: task 0 starts")
            self.emit(describe_tasks(self.strategy.tasks, chosen=self.config.num_tasks == 0))

    def check_run_id(self, run_id: str) -> None:
        check_run_id(self.config, run_id)

    def pull(self, client_id: str) -> RoundPlan | Wait:
        with self.lock:
            index = self.roster.index_of(client_id)
            self._tick()
            if self.state in (State.DONE, State.FAILED):  # over either way: the client stops
                self.released.add(client_id)
                return RoundPlan(
                    run_id=self.config.run_id,
                    phase=Phase.DONE,
                    task=len(self.strategy.tasks) - 1 if self.strategy is not None else 0,
                    round=0,
                    class_range=(0, 0),
                    seen_classes=0,
                )
            if self.state == State.WAITING:
                return Wait(self.options.retry_after_s, f"{len(self.roster.clients)}/{self.roster.size} clients joined")
            step = self.step
            assert step is not None
            if index in step.submitted:
                return Wait(
                    self.options.retry_after_s,
                    f"waiting for {self.config.num_clients - len(step.submitted)} other clients",
                )
            if step.secure is not None:
                if not step.secure.may_join(index):
                    why = "this step's secure aggregation went on without this client"
                    return Wait(self.options.retry_after_s, why)
                return step.secure.plan_for_clients()
            return step.plan

    def _check_step(
        self, client_id: str, client_index: int, run_id: str, task: int, round_: int, phase: Phase
    ) -> StepState:
        index = self.roster.index_of(client_id)
        if client_index != index:
            raise Refused("PERMISSION_DENIED", f"client {client_id!r} holds index {index}, not {client_index}")
        check_run_id(self.config, run_id)
        step = self.step
        if self.state != State.RUNNING or step is None:
            raise Refused("FAILED_PRECONDITION", f"no step is open (state {self.state.value})")
        check_step((step.task, step.round, step.phase), task, round_, phase)
        return step

    def precheck(
        self,
        client_id: str,
        client_index: int,
        run_id: str,
        task: int,
        round_: int,
        phase: Phase,
        idempotency_key: str,
        declared: dict[str, tuple[str, tuple[int, ...]]] | None = None,
        declared_bytes: int = 0,
        secure_attempt: int = 0,
    ) -> bool:
        """Check a push's envelope before its tensors are received; ``True`` if it is a duplicate.

        ``declared`` (tensor name -> (dtype name, shape), ``declared_bytes`` in all): the push's
        headers, held to the names, shapes, dtypes and size the step expects, so that a wrong
        or oversized push is refused before any of its bytes is buffered (a secure step: its
        declared masked sums, and ``secure_attempt`` its open session's).
        """
        with self.lock:
            step = self._check_step(client_id, client_index, run_id, task, round_, phase)
            if step.aggregator is None:
                raise Refused("FAILED_PRECONDITION", "the open step is an evaluation: send an eval report")
            if client_index in step.submitted:
                return True
            if step.secure is not None:
                step.secure.check_push(secure_attempt, declared, declared_bytes)
                return False
            if declared is not None:
                try:
                    check_declared(declared, step.aggregator.expected(), declared_bytes)
                except UpdateRejected as err:
                    raise Refused("INVALID_ARGUMENT", str(err)) from err
            return False

    def submit(self, update: ClientUpdate, idempotency_key: str) -> bool:
        """Validate, stage durably, and fold when its turn comes. Returns ``False`` for a duplicate."""
        with self.lock:
            step = self._check_step(
                update.client_id, update.client_index, update.run_id, update.task, update.round, update.phase
            )
            if step.phase == Phase.EVALUATE:
                raise Refused("FAILED_PRECONDITION", "the open step is an evaluation: send an eval report")
            if update.client_index in step.submitted:
                return False
            assert step.aggregator is not None
            if step.secure is not None:
                step.secure.submit(update, idempotency_key)
                self._secure_advance()
                return True
            try:
                step.aggregator.check(update, samples=sample_bounds(self.config, self.options, step.plan.class_range))
            except UpdateRejected as err:
                raise Refused("INVALID_ARGUMENT", str(err)) from err
            self.store.stage_update(step.key, update, idempotency_key)
            fault_point("push.staged")
            step.submitted.add(update.client_index)
            self._fold_ready(update)
            self._maybe_finish()
            return True

    def _secure_advance(self) -> None:
        """Let the open step's secure aggregation close what it can, and finish the step once it may."""
        step = self.step
        assert step is not None and step.secure is not None
        if step.secure.advance():
            self._finish_step()

    def secagg(
        self,
        client_id: str,
        client_index: int,
        run_id: str,
        step_ref: tuple[int, int, Phase],
        stage: str,
        keys: Keys | None = None,
        shares: dict[int, bytes] | None = None,
        attempt: int = 0,
    ) -> dict[str, Any]:
        """One secure-aggregation call (``stage``: advertise, roster, share, inbox, unmask, confirm,
        confirmations, reveal) in the step's session ``attempt`` (the plan's ``secure_attempt``).

        Returns ``{"ready": False, "message": ...}`` while what is asked for is not fixed yet, else what it
        holds; refuses with ``ABORTED`` a call of another session than the open one (the step restarted:
        pull the plan again)."""
        with self.lock:
            step = self._check_step(client_id, client_index, run_id, *step_ref)
            if step.secure is None:
                raise Refused("FAILED_PRECONDITION", "the open step has no secure aggregation")
            self._secure_advance()
            if self.step is not step:  # the call above finished the step
                raise Refused("FAILED_PRECONDITION", "the step is over")
            reply = step.secure.call(stage, client_index, client_id, keys, shares or {}, attempt)
            if reply is not None:
                return reply
            self._secure_advance()
            return {"ready": True}

    def report_eval(self, report: EvalReport, idempotency_key: str) -> bool:
        with self.lock:
            step = self._check_step(
                report.client_id,
                report.client_index,
                report.run_id,
                report.task,
                self.config.rounds_per_task,
                Phase.EVALUATE,
            )
            if report.client_index in step.submitted:
                return False
            assert self.strategy is not None
            check_counts(report, self.config, self.options, self.strategy.tasks)
            self.store.stage_eval(step.key, report, idempotency_key)
            fault_point("eval.staged")
            step.submitted.add(report.client_index)
            step.reports[report.client_index] = report
            self._maybe_finish()
            return True

    def _tick(self) -> None:
        if self.state != State.RUNNING or self.step is None:
            return
        if self.step.secure is not None:
            self._secure_advance()
        elif self._deadline_passed():
            self._maybe_finish()

    def all_clients_released(self) -> bool:
        with self.lock:
            return self.state in (State.DONE, State.FAILED) and set(self.roster.clients) <= self.released

    def tick(self) -> None:
        """Close a step whose deadline has passed with a quorum (called periodically)."""
        with self.lock:
            self._tick()

    def status(self, client_id: str | None = None, *, operator: bool = False) -> dict:
        """Where the run stands: its progress and the accuracy matrix, for any caller of Status. The
        matrix is the run's published result, summed over every client's test counts, of models each
        client is sent anyway. ``client_id``: with that client's own figures (its index, and whether the
        open step holds its submission). ``operator``: with the last five history entries, which hold
        per-step sample counts, dropped clients and the robust mode's per-client cosines and ratios:
        one client differencing two steps would learn another's shard size, or calibrate a poisoned
        update just under the bounds, so only the operator may read them (issue 41, M2)."""
        with self.lock:
            step = self.step
            metrics: dict[str, Any] = {"accuracy": self.matrix.accuracy()}
            index = self.roster.clients.get(client_id) if client_id is not None else None
            if index is not None:
                metrics["client"] = {
                    "client_id": client_id,
                    "index": index,
                    "submitted": step is not None and index in step.submitted,
                }
            if operator:
                metrics["history"] = self.history[-5:]
            return {
                "run_id": self.config.run_id,
                "state": self.state.value,
                "task": step.task if step else self.pointer[0],
                "round": step.round if step else 0,
                "phase": (
                    step.phase if step else Phase.DONE if self.state in (State.DONE, State.FAILED) else Phase.TRAIN
                ),
                "clients_joined": len(self.roster.clients),
                "clients_done": len(step.submitted) if step else 0,
                "metrics": metrics,
            }
