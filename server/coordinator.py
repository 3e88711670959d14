"""The coordinator: the run (``server/run.py``) served to concurrent clients, over any transport.

Thread-safe; the gRPC servicer is a thin layer over it. It keeps the shell around the step lifecycle:
one lock over every call; each call held to the client's slot (``server/roster.py``) and the open step;
each submission handed to the open step's intake (``server/intake.py``), which checks it and stages it on
disk (durable before it is acknowledged) and folds it by the run's fold policy. By default that folds it
into the strategy's running sums in client-index order as soon as every lower index has been folded, so
the result is bit-identical to the in-process engine, which folds clients 0..N-1 in order; an update that
arrives ahead of its turn waits on disk, not in memory. In robust mode (``robust.enabled``,
``server.robust``) nothing is folded until the step closes: the staged updates are then screened together
and what passes is folded, in index order. A step closes when every client has submitted (in a
``--start-with`` run: every client that has joined), or once its deadline has passed with a quorum; the
missing clients are then skipped and their late updates refused. Secure aggregation wraps a step in its
own intake (``server/secure/intake.py``): its rounds are their own state machine (``server/secure/``),
and the coordinator asks the intake, never which kind of step it has.

After a restart the run resumes from its last commit and opens the step it names; the submissions
staged for that step are folded again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from common.infra.faults import fault_point
from common.methods.checks import validate
from common.run.config import RunConfig
from common.run.partition import describe_tasks
from common.run.schedule import Schedule
from common.secagg.rounds import Keys
from common.wire.messages import ClientUpdate, EvalReport, ModelSpec, Phase, PushEnvelope, RoundPlan, Wait
from server.checks import Options, Refused, check_counts, check_run_id, check_same_spec, check_step
from server.intake import SecAggCall, StepState
from server.run import Run
from server.run_state import State
from server.status import run_status
from server.store import MemoryStore, Storage, Store

log = logging.getLogger("lorm.coordinator")


def use_run_threads(config: RunConfig) -> None:
    """Run this process's merges on the run's ``threads`` (if set), as a host of the coordinator must: the merges'
    float sums depend on how BLAS splits them over threads, and the in-process engine runs them with
    ``config.threads``, so a coordinator that matches it bit for bit does too."""
    if config.threads:
        torch.set_num_threads(config.threads)


class Coordinator:
    def __init__(
        self,
        config: RunConfig,
        state_dir: str | Path | Storage,
        options: Options | None = None,
        on_event: Callable[[str], None] | None = None,
        on_fatal: Callable[[BaseException], None] = lambda err: None,
        on_merge: Callable[[str, float], None] = lambda phase, seconds: None,
    ) -> None:
        self.config = validate(config)  # ValueError: a configuration this coordinator cannot run
        self.options = options or Options()
        self.store = state_dir if isinstance(state_dir, Store | MemoryStore) else Store(state_dir)
        self.lock = threading.RLock()
        self.done = threading.Event()
        self.emit = on_event or log.info
        self.released: set[str] = set()  # clients told that the run is over
        self.run = Run(config, self.store, self.options, self.emit, on_fatal, on_merge)
        self.step: StepState | None = self.run.resume()  # the open step, whose submissions the calls stage
        if self.step is not None:
            self._replay_staged()
        else:
            self._if_over()  # resumed done: exported again, since a crash may have cut the export short
        if self.run.resumes:
            self.emit(
                f"resumed run {config.run_id} at {self.run.state.value} task {self.run.pointer[0]} "
                f"step {self.run.pointer[1]}"
            )
        if self.options.model_spec is not None:
            self.run.fix_model(self.options.model_spec, keep=self.step.key if self.step else None)

    # ---------------------------------------------------------------- staging and deadlines

    def _replay_staged(self) -> None:
        """After a restart: the submissions staged for the open step count as received, and are folded again."""
        step = self.step
        assert step is not None
        for index in self.store.staged_indices(step.key):
            if step.phase == Phase.EVALUATE:
                step.reports[index] = self.store.load_eval(step.key, index)
            step.submitted.add(index)
        step.intake.resume(step)
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        """Close the open step once its intake says it may (``server/intake.py``)."""
        step = self.step
        if step is not None and self.run.state == State.RUNNING and step.intake.may_close(step):
            self._finish_step()

    def _finish_step(self) -> None:
        """Close the open step (``Run.close``) and take the one open after it."""
        assert self.step is not None
        self.step = self.run.close(self.step)
        self._if_over()

    def _if_over(self) -> None:
        """A run done is exported; done or failed, whoever waits for its end is told."""
        if self.run.state == State.DONE:
            self.run.export()
        if self.run.state in (State.DONE, State.FAILED):
            self.done.set()

    # ---------------------------------------------------------------- client calls

    def join(self, client_id: str, requested_index: int | None = None) -> int:
        """The client slot ``client_id`` holds (``server/roster.py``), committed before it is answered."""
        with self.lock:
            roster = self.run.roster
            index, new = roster.join(client_id, requested_index)
            if new:
                self.run.commit(keep=self.step.key if self.step else None)
                fault_point("join.committed")
                self.emit(f"client {client_id} joined as index {index} ({len(roster.clients)}/{roster.size})")
            return index

    def describe(self, client_id: str, spec: ModelSpec) -> None:
        """A client's model: it must be the run's (fixed by --model-spec or by the first Describe). Where the run's
        description leaves the class names or max_length unknown (an older version's), a client that knows them
        is admitted but changes nothing: no later Describe alters the run; a current --model-spec completes it."""
        with self.lock:
            run = self.run
            run.roster.index_of(client_id)
            if run.spec is None:
                run.admit_model(spec, "model_spec_json")
            elif not run.spec.completed_by(spec):
                check_same_spec(run.spec, spec, client_id)
            if run.state == State.WAITING and run.strategy is not None and self._enough_joined():
                self.step = run.start()
                joined = len(run.roster.clients)
                self.emit(
                    f"all {joined} clients joined: task 0 starts"
                    if run.roster.full
                    else f"{joined} of {self.config.num_clients} clients joined (--start-with): task 0 starts; "
                    "the others may join at any step"
                )
                self.emit(describe_tasks(run.strategy.tasks, chosen=self.config.num_tasks == 0))

    def _enough_joined(self) -> bool:
        wanted = self.options.start_with or self.config.num_clients
        return self.run.roster.full or len(self.run.roster.clients) >= wanted

    def joined(self) -> tuple[RunConfig, Schedule | None]:
        """What a Join reply carries of the run: its configuration and schedule as they stand, the tasks the
        operator appended included."""
        with self.lock:
            return self.run.live_config, self.run.current_schedule()

    def check_run_id(self, run_id: str) -> None:
        check_run_id(self.config, run_id)

    def pull(self, client_id: str) -> RoundPlan | Wait:
        with self.lock:
            run = self.run
            index = run.roster.index_of(client_id)
            self._maybe_finish()  # a step past its deadline, or a secure round late, closes here
            if run.state in (State.DONE, State.FAILED):  # over either way: the client stops
                self.released.add(client_id)
                return RoundPlan(
                    run_id=self.config.run_id,
                    phase=Phase.DONE,
                    task=len(run.strategy.tasks) - 1 if run.strategy is not None else 0,
                    round=0,
                    class_range=(0, 0),
                    seen_classes=0,
                )
            if run.state == State.WAITING:
                return Wait(self.options.retry_after_s, f"{len(run.roster.clients)}/{run.roster.size} clients joined")
            if run.state == State.IDLE:
                why = f"task {run.pointer[0]} is not scheduled yet: the run waits for the operator's next task"
                return Wait(self.options.idle_retry_s, why)
            step = self.step
            assert step is not None
            if index in step.submitted:
                return Wait(
                    self.options.retry_after_s,
                    f"waiting for {self.config.num_clients - len(step.submitted)} other clients",
                )
            return step.intake.plan_for(step, index)

    def _check_step(
        self, client_id: str, client_index: int, run_id: str, task: int, round_: int, phase: Phase
    ) -> StepState:
        index = self.run.roster.index_of(client_id)
        if client_index != index:
            raise Refused("PERMISSION_DENIED", f"client {client_id!r} holds index {index}, not {client_index}")
        check_run_id(self.config, run_id)
        step = self.step
        if self.run.state != State.RUNNING or step is None:
            raise Refused("FAILED_PRECONDITION", f"no step is open (state {self.run.state.value})")
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
            step.intake.precheck(step, declared, declared_bytes, secure_attempt)
            return False

    def precheck_push(self, env: PushEnvelope) -> bool:
        """:meth:`precheck` of a decoded push envelope; ``True`` if it is a duplicate."""
        return self.precheck(
            env.client_id,
            env.client_index,
            env.run_id,
            env.task,
            env.round,
            env.phase,
            env.idempotency_key,
            declared=env.declared,
            declared_bytes=env.total_bytes,
            secure_attempt=env.secure_attempt,
        )

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
            step.intake.accept(step, update, idempotency_key)  # staged durably: it counts from here
            self._maybe_finish()
            return True

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
        confirmations, reveal, blame) in the step's session ``attempt`` (the plan's ``secure_attempt``).

        Returns ``{"ready": False, "message": ...}`` while what is asked for is not fixed yet, else what it
        holds; refuses with ``ABORTED`` a call of another session than the open one (the step restarted:
        pull the plan again)."""
        with self.lock:
            step = self._check_step(client_id, client_index, run_id, *step_ref)
            self._maybe_finish()  # a secure step first closes what rounds it can
            if self.step is not step:  # the call above finished the step
                raise Refused("FAILED_PRECONDITION", "the step is over")
            reply = step.intake.call(step, SecAggCall(stage, client_index, client_id, keys, shares or {}, attempt))
            if reply is not None:
                return reply
            self._maybe_finish()
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
            assert self.run.strategy is not None
            check_counts(report, self.config, self.options, self.run.strategy.tasks)
            self.store.stage_eval(step.key, report, idempotency_key)
            fault_point("eval.staged")
            step.submitted.add(report.client_index)
            step.reports[report.client_index] = report
            self._maybe_finish()
            return True

    def add_task(self, classes: list[str]) -> int:
        """The operator appends a task of ``classes`` to the open run's schedule (``Run.add_task``, committed
        before it is answered); an idle run opens its first step. Returns the task's number."""
        with self.lock:
            opened = self.run.add_task(classes, keep=self.step.key if self.step else None)
            if opened is not None:
                self.step = opened
            schedule = self.run.current_schedule()
            assert schedule is not None
            return len(schedule) - 1

    def finish(self) -> None:
        """The operator ends the open run: at once when it is idle, else after its last scheduled task."""
        with self.lock:
            self.run.finish(keep=self.step.key if self.step else None)
            self._if_over()

    def all_clients_released(self) -> bool:
        with self.lock:
            return self.run.state in (State.DONE, State.FAILED) and set(self.run.roster.clients) <= self.released

    def tick(self) -> None:
        """Close a step whose deadline has passed with a quorum (called periodically)."""
        with self.lock:
            self._maybe_finish()  # a step past its deadline, or a secure round late, closes here

    def status(self, client_id: str | None = None, *, operator: bool = False) -> dict:
        """Where the run stands, as Status tells ``client_id`` or the ``operator`` (``server/status.py``)."""
        with self.lock:
            return run_status(self.run, self.step, client_id, operator=operator)
