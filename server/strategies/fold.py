"""A step's fold: the aggregator its updates fold into and the strategy's merge of it, typed together.

A strategy opens a step's fold (``Strategy.open``) with the aggregator of the step's phase and the merge that
reads it: ``Fold(plan, lorm_round(...), self.merge_round)`` binds a ``LoRMRoundAggregator`` to a merge that takes
one, and the type checker holds the two to each other where they meet (the constructor is generic). The driver
folds the clients' updates into :attr:`Fold.aggregator` and calls :meth:`Fold.finish`; it never hands an
aggregator back to a strategy that would have to ask what it got. A wrapper (the privacy account,
``server/strategies/private.py``) makes a new fold of an old one: another aggregator to fold into, whose merge
finishes the old fold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from common.aggregation.base import Aggregator
from common.wire.messages import RoundPlan

A = TypeVar("A", bound=Aggregator)


class Fold:
    """One step's ``aggregator`` and the ``merge`` that finishes the step with it (and updates the strategy)."""

    __slots__ = ("plan", "aggregator", "_merge")

    def __init__(self, plan: RoundPlan, aggregator: A, merge: Callable[[RoundPlan, A], None]) -> None:
        self.plan = plan
        self.aggregator: Aggregator = aggregator
        self._merge: Callable[[RoundPlan, Any], None] = merge  # checked against the aggregator above

    def finish(self) -> None:
        """Merge the folded step: the strategy's state moves on."""
        self._merge(self.plan, self.aggregator)

    def around(self, before: Callable[[], None], after: Callable[[], None]) -> Fold:
        """This fold, its merge between ``before()`` and ``after()``."""

        def merged(plan: RoundPlan, aggregator: Aggregator) -> None:
            before()
            self.finish()
            after()

        return Fold(self.plan, self.aggregator, merged)

    def then(self, after: Callable[[], None]) -> Fold:
        """This fold, ``after()`` once its merge is done."""
        return self.around(lambda: None, after)
