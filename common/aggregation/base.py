"""The aggregator interface: how a step's updates are checked and folded into running sums.

For each step the driver (the coordinator, or the in-process engine) opens an :class:`Aggregator`
for the step's plan, folds every client's :class:`ClientUpdate` into it as it arrives, and finishes the
step's fold (``server/strategies/fold.py``: the method's server half merges the aggregator it opened).
Aggregators hold running sums only, so memory does not depend on how many clients fold into them. A
method's factory (:data:`AggregatorFactory`, named by its registry entry) builds them from the plan, the
model and the run's configuration alone, so that a client can build the very aggregator the coordinator
folds into (:func:`make_aggregator`); a method with two kinds of steps names a :class:`Phased` of two
typed factories."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from common.aggregation.declared import Shapes
from common.aggregation.validate import UpdateRejected, check_scalars, check_tensors
from common.methods import load_half, method
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, ModelSpec, Phase, RoundPlan


class Aggregator(ABC):
    """Folds the updates of one step; validates each before touching any running sum.

    An aggregator whose state is running sums of per-client terms names its accumulators in
    ``PARTS`` (``common/merges/sums.py``); only such an aggregator supports secure aggregation, where
    the coordinator loads the unmasked sum of the clients' terms instead of folding updates.
    """

    SUMS: ClassVar[tuple[str, ...]] = ("num_samples", "loss_sum", "loss_samples")
    PARTS: ClassVar[tuple[str, ...]]  # not set here: each summable subclass names its own

    def __init__(self, plan: RoundPlan, declared: Shapes) -> None:
        self.plan = plan
        self.declared = (
            declared  # every tensor an update of this step carries (common.aggregation.declared.declared_tensors)
        )
        self.count = 0
        self.num_samples = 0
        self.loss_sum = 0.0
        self.loss_samples = 0
        self.payload_bytes = 0  # tensor bytes of every update folded

    def fold(self, update: ClientUpdate, *, checked: bool = False) -> None:
        """Add ``update`` to the running sums; ``checked``: :meth:`check` has passed it already."""
        if not checked:
            self.check(update)
        self._fold(update)
        self.count += 1
        self.payload_bytes += update.nbytes
        self.num_samples += update.num_samples
        if math.isfinite(update.train_loss):
            self.loss_sum += update.train_loss * update.num_samples
            self.loss_samples += update.num_samples

    def check(self, update: ClientUpdate, *, samples: tuple[int, int] | None = None) -> None:
        """Raise :class:`UpdateRejected` unless ``update`` answers this step; changes nothing.

        The step's fields, ``num_samples`` (within ``samples = (lo, hi)`` when given) and the
        loss, then every tensor against :meth:`expected` (``common.aggregation.validate``), then
        what only this method knows (:meth:`_check`).
        """
        plan = self.plan
        for field in ("run_id", "task", "round", "phase"):
            want, got = getattr(plan, field), getattr(update, field)
            if want != got:
                raise UpdateRejected(field, f"this step expects {want!r}, the update has {got!r}")
        check_scalars(update.num_samples, update.train_loss, samples)
        check_tensors(update.tensors, self.expected())
        self._check(update)

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.loss_samples if self.loss_samples else float("nan")

    def expected(self) -> Shapes:
        """Every tensor an update of this step carries: wire name -> shape, as the plan declares it
        (``common.aggregation.declared.declared_tensors``, the declaration the clients' updates are built to)."""
        return self.declared

    def _check(self, update: ClientUpdate) -> None:  # noqa: B027 (an optional hook: most methods need none)
        """What this method alone requires of an update whose tensors passed :meth:`expected`."""

    @abstractmethod
    def _fold(self, update: ClientUpdate) -> None: ...


# A method's aggregator factory (``Method.aggregator``): (plan, model spec, run config) -> a fresh aggregator of
# the plan's step. Pure: what it needs comes from its arguments, so a client builds the coordinator's aggregator.
AggregatorFactory = Callable[[RoundPlan, ModelSpec, RunConfig], Aggregator]


@dataclass(frozen=True)
class Phased:
    """A factory of a method with two kinds of steps: ``then``'s aggregator for a step of ``phase``, ``otherwise``'s
    for any other (each a typed factory, which the method's server half pairs with its merge)."""

    phase: Phase
    then: AggregatorFactory
    otherwise: AggregatorFactory

    def __call__(self, plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Aggregator:
        return (self.then if plan.phase == self.phase else self.otherwise)(plan, spec, config)


def make_aggregator(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Aggregator:
    """A fresh aggregator of ``plan``'s step: the run's method's factory (``Method.aggregator``) called with the
    plan, the model and the run's configuration, on the coordinator and on a client alike."""
    factory = load_half(method(config.method).aggregator, "common")
    aggregator: Aggregator = factory(plan, spec, config)
    return aggregator


def present(t: Tensor | None) -> Tensor:
    """A tensor the step's declaration requires: validation has checked that the update carries it."""
    assert t is not None, "a declared tensor is missing: the update was folded without being checked"
    return t
