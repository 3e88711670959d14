"""In-process clients that leave a step's secure session after sharing: the dropouts of a simulated federation
(``bench/secagg_federation.py``), and the reference run of the hostile-client tests (the clean run's result without
the hostile one, the same masks and fixed point)."""

from __future__ import annotations

from collections.abc import Callable, Collection

from client.delivery import Delivery, Masked
from common.wire.messages import ClientUpdate, EvalReport, RoundPlan
from engine.clients import EngineSession


def drops_after_sharing(
    index: int | Collection[int], when: Callable[[RoundPlan], bool] = lambda plan: True
) -> Callable[[int], type[EngineSession]]:
    """``run_inprocess``'s ``sessions``: client ``index`` (or each of several) advertises and shares in every secure
    session, then, in the steps ``when`` names, sends no masked input and sits the rest of the session out (the step
    closes at its deadline with the others' sum); every other client is the engine's own."""

    class DropsAfterSharing(EngineSession):
        def _send(self, plan: RoundPlan, result: ClientUpdate | EvalReport, delivery: Delivery, start: float) -> None:
            if not isinstance(delivery, Masked) or not when(plan):
                return super()._send(plan, result, delivery, start)
            self.skipped = (plan.task, plan.round, plan.phase, plan.secure_attempt)

    dropping = {index} if isinstance(index, int) else set(index)
    return lambda i: DropsAfterSharing if i in dropping else EngineSession
