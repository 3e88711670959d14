"""Head only: a toy method that shows what adding a method takes (this module and one registry line).

Clients train only the classifier head, with the ACE loss, on the frozen backbone ``W0`` (no
LoRA factor is trained: the plan lists none, so ``LoRATrainer`` trains the head alone and
sends it); the coordinator averages the heads by sample counts, ``w = sum_i n_i w_i / sum_i n_i``
(``(C, F)``, and the bias ``(C,)`` alike), as FedAvg does. The backbone stays ``W0``.
"""

from __future__ import annotations

from common.aggregation.lora import HeadMeanAggregator, head_only
from common.wire.instructions import LoraStep
from common.wire.messages import LowRank, Phase, RoundPlan
from server.strategies.base import Strategy
from server.strategies.fold import Fold


class HeadOnly(Strategy):
    name = "head-only"

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase != Phase.TRAIN:
            raise ValueError(f"{self.name} has no {phase} step")
        return self.base_plan(task, round_, phase, LoraStep())  # no factors to train, no Grams: the head alone

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, head_only(plan, self.spec, self.config), self.merge)

    def merge(self, plan: RoundPlan, aggregator: HeadMeanAggregator) -> None:
        self.head_w, self.head_b = aggregator.head.result(), aggregator.bias.result()

    def adapter(self) -> dict[str, LowRank]:
        return {}  # the backbone stays W0
