"""Secure aggregation as a step's intake (``server/intake.py``): the wrapper that makes a step's submissions masked
inputs of its rounds (``server/secure/step.py``) and its close the survivors' unmasked sum.

No update is ever folded alone: a client pulls the plan naming the session it takes part in, pushes masked sums
checked for form only, and calls the rounds' stages; the step may close once the unmask answers suffice, and then
the sum of the survivors' terms is loaded into the aggregator (``SessionFailed`` when it cannot be: the step's
session restarts).
"""

from __future__ import annotations

from typing import Any

from common.aggregation.base import Aggregator
from common.wire.messages import ClientUpdate, RoundPlan, Wait
from server.intake import Declared, SecAggCall, StepState
from server.secure.step import SecureStep


class SecureIntake:
    """The intake of a step with secure aggregation: its :class:`SecureStep`'s rounds (:attr:`secure`)."""

    def __init__(self, secure: SecureStep, retry_after_s: float) -> None:
        self.secure = secure
        self.retry_after_s = retry_after_s

    def resume(self, step: StepState) -> None:
        self.secure.resume()

    def plan_for(self, step: StepState, index: int) -> RoundPlan | Wait:
        if not self.secure.may_join(index):
            return Wait(self.retry_after_s, "this step's secure aggregation went on without this client")
        return self.secure.plan_for_clients()

    def precheck(self, step: StepState, declared: Declared | None, declared_bytes: int, attempt: int) -> None:
        self.secure.check_push(attempt, declared, declared_bytes)

    def accept(self, step: StepState, update: ClientUpdate, idempotency_key: str) -> None:
        self.secure.submit(update, idempotency_key)

    def call(self, step: StepState, request: SecAggCall) -> dict[str, Any] | None:
        r = request
        return self.secure.call(r.stage, r.index, r.client_id, r.keys, r.shares, r.attempt)

    def may_close(self, step: StepState) -> bool:
        return self.secure.advance()

    def close(self, step: StepState, aggregator: Aggregator) -> dict[str, Any]:
        record = self.secure.unmask_into(aggregator)
        step.next_fold = self.secure.clients
        return {"secagg": record}
