"""How an open step takes its clients' submissions: the coordinator's shell asks the step's intake, never which kind
of step it has.

An :class:`Intake` answers for one step: the plan a client pulls, whether a push's envelope and its update are what
the step asks for, a secure-aggregation call, when the step may close, and how its updates reach the aggregator when
it closes. A plain step's is :class:`PlainIntake` (one per run): each update checked whole, staged on disk and
handed to the run's fold policy (``server/steps.py``: in index order, or screened by the robust mode); the step
closes when every awaited client has submitted, or once its deadline has passed with a quorum. Secure aggregation
wraps a step in its own (``server/secure/intake.py``): masked inputs, its rounds' state machine, and the survivors'
unmasked sum loaded into the aggregator.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.aggregation.base import Aggregator
from common.aggregation.validate import UpdateRejected, check_declared
from common.infra.faults import fault_point
from common.run.config import RunConfig
from common.run.settings import RobustSettings
from common.secagg.rounds import Keys
from common.wire.messages import ClientUpdate, EvalReport, RoundPlan, Wait
from server.checks import Options, Refused, sample_bounds
from server.robust import screen_and_fold
from server.steps import OpenStep
from server.store import Storage, step_key

Declared = dict[str, tuple[str, tuple[int, ...]]]  # a push's headers: tensor name -> (dtype name, shape)


@dataclass
class StepState(OpenStep):
    """The coordinator's step in progress: the step as it opened, how it takes its clients' submissions, and who
    has submitted."""

    started: float
    intake: Intake  # how it takes its clients' submissions: plain, or wrapped by secure aggregation
    next_fold: int = 0  # every client index below this has been folded (or skipped)
    submitted: set[int] = field(default_factory=set)
    reports: dict[int, EvalReport] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return step_key(self.task, self.index)


@dataclass(frozen=True)
class SecAggCall:
    """A client's secure-aggregation call: ``stage`` of session ``attempt``, and what client ``index`` sends."""

    stage: str
    index: int
    client_id: str
    keys: Keys | None
    shares: dict[int, bytes]
    attempt: int


Load = Callable[[int], ClientUpdate]


class FoldPolicy(Protocol):
    """How the coordinator's staged updates reach a step's aggregator: as they arrive (:meth:`arrived`), and
    when the step closes (:meth:`close`, which returns what the step's history records of it)."""

    def arrived(self, step: StepState, aggregator: Aggregator, load: Load, fresh: ClientUpdate | None) -> None: ...

    def close(self, step: StepState, aggregator: Aggregator, load: Load) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Ordered:
    """Each update folded in client-index order as soon as every lower index is folded: the result is
    bit-identical to the engine's, which folds clients 0..N-1 in order; an update ahead of its turn waits
    on disk. At the close, what a missing (skipped) lower index held back is folded, in order."""

    clients: int

    def arrived(self, step: StepState, aggregator: Aggregator, load: Load, fresh: ClientUpdate | None) -> None:
        while step.next_fold < self.clients and step.next_fold in step.submitted:
            i = step.next_fold
            update = fresh if fresh is not None and fresh.client_index == i else load(i)
            aggregator.fold(update, checked=True)  # checked by submit before it was staged
            fault_point("merge.fold")
            step.next_fold += 1

    def close(self, step: StepState, aggregator: Aggregator, load: Load) -> dict[str, Any]:
        for i in sorted(step.submitted):
            if i >= step.next_fold:
                aggregator.fold(load(i), checked=True)
        step.next_fold = self.clients
        return {}


@dataclass(frozen=True)
class Screened:
    """The robust mode: nothing is folded before the step closes; then the staged updates are screened
    together and what passes is folded (clipped where it went past a bound), in index order."""

    settings: RobustSettings
    clients: int

    def arrived(self, step: StepState, aggregator: Aggregator, load: Load, fresh: ClientUpdate | None) -> None:
        pass

    def close(self, step: StepState, aggregator: Aggregator, load: Load) -> dict[str, Any]:
        step.next_fold = self.clients
        return {"robust": screen_and_fold(self.settings, step.plan, aggregator, sorted(step.submitted), load)}


def fold_policy(robust: RobustSettings, clients: int) -> FoldPolicy:
    """A plain step's fold policy, chosen once per run (a secure step has its own intake)."""
    if robust.enabled:
        return Screened(robust, clients)
    return Ordered(clients)


class Intake(Protocol):
    """What the coordinator asks of an open step's intake (every call under the coordinator's lock)."""

    def resume(self, step: StepState) -> None:
        """After a restart, with the staged submissions listed in ``step.submitted``: fold or re-add them."""

    def plan_for(self, step: StepState, index: int) -> RoundPlan | Wait:
        """What client ``index``, which has not submitted, is answered when it pulls."""

    def precheck(self, step: StepState, declared: Declared | None, declared_bytes: int, attempt: int) -> None:
        """``Refused`` unless a push's envelope (its headers, their bytes, the secure session it names) fits."""

    def accept(self, step: StepState, update: ClientUpdate, idempotency_key: str) -> None:
        """Check ``update`` whole and stage it durably (``Refused`` when it is not what the step asks for)."""

    def call(self, step: StepState, request: SecAggCall) -> dict[str, Any] | None:
        """Client ``index``'s secure-aggregation call: what it asks for, or ``None`` once what it sent is recorded."""

    def may_close(self, step: StepState) -> bool:
        """Whether ``step`` may close now (a secure step first closes what rounds it can)."""

    def close(self, step: StepState, aggregator: Aggregator) -> dict[str, Any]:
        """Bring every update the step takes into ``aggregator``; what the step's history records of it."""


class PlainIntake:
    """The intake of a step without secure aggregation: updates in the clear, the run's fold policy."""

    def __init__(
        self,
        config: RunConfig,
        options: Options,
        store: Storage,
        policy: FoldPolicy,
        awaited: Callable[[], set[int]],
        emit: Callable[[str], None],
    ) -> None:
        self.config, self.options, self.store, self.policy = config, options, store, policy
        self.awaited, self.emit = awaited, emit

    def _load(self, step: StepState) -> Load:
        return functools.partial(self.store.load_update, step.key)

    def resume(self, step: StepState) -> None:
        if step.aggregator is not None:
            self.policy.arrived(step, step.aggregator, self._load(step), None)

    def plan_for(self, step: StepState, index: int) -> RoundPlan | Wait:
        return step.plan

    def precheck(self, step: StepState, declared: Declared | None, declared_bytes: int, attempt: int) -> None:
        if attempt:  # a session of a step that has none: the push is not what this step asked for
            raise Refused(
                "INVALID_ARGUMENT",
                f"the push names secure session {attempt}, but step {step.task}/{step.round} {step.phase.value} has "
                "no secure aggregation",
            )
        if declared is not None and step.aggregator is not None:
            try:
                check_declared(declared, step.aggregator.expected(), declared_bytes)
            except UpdateRejected as err:
                raise Refused("INVALID_ARGUMENT", str(err)) from err

    def accept(self, step: StepState, update: ClientUpdate, idempotency_key: str) -> None:
        assert step.aggregator is not None
        if update.secure_attempt:
            raise Refused("INVALID_ARGUMENT", "the update names a secure session, but the step has none")
        try:
            step.aggregator.check(update, samples=sample_bounds(self.config, self.options, step.plan.class_range))
        except UpdateRejected as err:
            raise Refused("INVALID_ARGUMENT", str(err)) from err
        self.store.stage_update(step.key, update, idempotency_key)
        fault_point("push.staged")
        step.submitted.add(update.client_index)
        self.policy.arrived(step, step.aggregator, self._load(step), update)

    def call(self, step: StepState, request: SecAggCall) -> dict[str, Any] | None:
        raise Refused("FAILED_PRECONDITION", "the open step has no secure aggregation")

    def _deadline_passed(self, step: StepState) -> bool:
        quorum = self.options.quorum or self.config.num_clients
        return (
            self.options.round_deadline_s > 0
            and time.monotonic() - step.started > self.options.round_deadline_s
            and len(step.submitted) >= quorum
        )

    def may_close(self, step: StepState) -> bool:
        everyone = self.awaited() <= step.submitted
        if not everyone and not self._deadline_passed(step):
            return False
        if not everyone:
            missing = sorted(set(range(self.config.num_clients)) - step.submitted)
            self.emit(f"task {step.task} step {step.index} deadline passed: closing without clients {missing}")
        return True

    def close(self, step: StepState, aggregator: Aggregator) -> dict[str, Any]:
        return self.policy.close(step, aggregator, self._load(step))
