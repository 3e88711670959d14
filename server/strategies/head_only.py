"""Head only: a toy method that shows what adding a method takes (this module and one registry line).

Clients train only the classifier head, with the ACE loss, on the frozen backbone ``W0`` (no
LoRA factor is trained: the plan lists none, so ``LoRATrainer`` trains the head alone and
sends it); the coordinator averages the heads by sample counts, ``w = sum_i n_i w_i / sum_i n_i``
(``(C, F)``, and the bias ``(C,)`` alike), as FedAvg does. The backbone stays ``W0``.
"""

from __future__ import annotations

from common.declared import Shapes
from common.merge import WeightedMeanAccumulator
from common.messages import ClientUpdate, LoraStep, LowRank, ModelSpec, Phase, RoundPlan
from common.tensors import HEAD_BIAS, HEAD_WEIGHT
from server.strategies.base import Aggregator, Strategy, present


class HeadMeanAggregator(Aggregator):
    """The sample-weighted mean of the clients' heads: weight ``(C, F)``, bias ``(C,)``."""

    PARTS = ("head", "bias")  # its running sums (common/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec) -> None:
        super().__init__(plan, declared)
        self.spec = spec
        self.head = WeightedMeanAccumulator((spec.num_classes, spec.feature_dim))
        self.bias = WeightedMeanAccumulator((spec.num_classes,))

    def _fold(self, update: ClientUpdate) -> None:
        self.head.fold(present(update.get(HEAD_WEIGHT)), update.num_samples)
        self.bias.fold(present(update.get(HEAD_BIAS)), update.num_samples)


class HeadOnly(Strategy):
    name = "head-only"

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase != Phase.TRAIN:
            raise ValueError(f"{self.name} has no {phase} step")
        return self.base_plan(task, round_, phase, LoraStep())  # no factors to train, no Grams: the head alone

    def aggregator(self, plan: RoundPlan) -> Aggregator:
        return HeadMeanAggregator(plan, self.declared(plan), self.spec)

    def aggregate(self, plan: RoundPlan, aggregator: Aggregator) -> None:
        assert isinstance(aggregator, HeadMeanAggregator)
        self.head_w, self.head_b = aggregator.head.result(), aggregator.bias.result()

    def adapter(self) -> dict[str, LowRank]:
        return {}  # the backbone stays W0
