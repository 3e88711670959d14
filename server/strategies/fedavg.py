"""FedAvg with full fine-tuning: the sample-weighted mean of the clients' deltas and heads.

``delta <- delta + sum_i n_i delta_i / sum_i n_i``, head weight and bias
``sum_i n_i w_i / sum_i n_i``. Clients send their delta and head only.
"""

from __future__ import annotations

from typing import ClassVar

from common.declared import Shapes
from common.merge import WeightedMeanAccumulator
from common.messages import ClientUpdate, ModelSpec, RoundPlan
from common.tensors import DELTA, HEAD_BIAS, HEAD_WEIGHT
from server.strategies.base import Aggregator, present
from server.strategies.dense import DenseStrategy


class FedAvgAggregator(Aggregator):
    """Sample-weighted means of the updates' ``delta`` entries (``shapes``: every backbone parameter
    unless given) and of their heads."""

    PARTS: ClassVar[tuple[str, ...]] = ("delta", "head", "bias")  # running sums (common/sums.py)

    def __init__(
        self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, shapes: dict[str, tuple[int, ...]] | None = None
    ) -> None:
        super().__init__(plan, declared)
        self.spec = spec
        shapes = spec.params if shapes is None else shapes
        self.delta = {name: WeightedMeanAccumulator(tuple(shape)) for name, shape in shapes.items()}
        self.head = WeightedMeanAccumulator((spec.num_classes, spec.feature_dim))
        self.bias = WeightedMeanAccumulator((spec.num_classes,))

    def _fold(self, update: ClientUpdate) -> None:
        n = update.num_samples
        delta = update.named(DELTA)
        for name, acc in self.delta.items():
            acc.fold(delta[name], n)
        self.head.fold(present(update.get(HEAD_WEIGHT)), n)
        self.bias.fold(present(update.get(HEAD_BIAS)), n)


class FedAvg(DenseStrategy):
    name = "fedavg"

    def aggregator(self, plan: RoundPlan) -> Aggregator:
        return FedAvgAggregator(plan, self.declared(plan), self.spec)

    def aggregate(self, plan: RoundPlan, aggregator: Aggregator) -> None:
        assert isinstance(aggregator, FedAvgAggregator)
        self.add_to_delta({name: acc.result() for name, acc in aggregator.delta.items()})
        self.head_w = aggregator.head.result()
        self.head_b = aggregator.bias.result()
