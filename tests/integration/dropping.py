"""An in-process client that leaves a step's secure session after sharing: the reference run of the hostile-client
tests (the clean run's result without the hostile one, the same masks and fixed point)."""

from __future__ import annotations

from collections.abc import Callable

from client.delivery import Masked
from common.wire.messages import RoundPlan
from engine.clients import EngineSession


def drops_after_sharing(index: int, when: Callable[[RoundPlan], bool] = lambda plan: True):
    """``run_inprocess``'s ``sessions``: client ``index`` advertises and shares in every secure session, then, in
    the steps ``when`` names, sends no masked input and sits the rest of the session out (the step closes at its
    deadline with the others' sum); every other client is the engine's own."""

    class DropsAfterSharing(EngineSession):
        def _send(self, plan, result, delivery, start) -> None:
            if not isinstance(delivery, Masked) or not when(plan):
                return super()._send(plan, result, delivery, start)
            self.skipped = (plan.task, plan.round, plan.phase, plan.secure_attempt)

    return lambda i: DropsAfterSharing if i == index else EngineSession
