"""FedAvg with LoRA: both factors trained every round, each averaged by sample counts.

The LoRA factors continue across tasks (no task-level merge), so this is the plain-averaging
baseline LoRM's closed-form merges are measured against.
"""

from __future__ import annotations

import torch

from common.adapters.lora import init_lora_a
from common.aggregation.lora import MeanAggregator, fedavg_lora
from common.run.config import RunConfig
from common.wire.instructions import LoraStep
from common.wire.messages import LowRank, ModelSpec, Phase, RoundPlan
from common.wire.tensors import LORA, low_rank_tensors
from server.strategies.base import Strategy, factors_from_tensors, factors_to_tensors, published
from server.strategies.fold import Fold


class FedAvgLoRA(Strategy):
    name = "fedavg-lora"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        gen = torch.Generator().manual_seed(config.seed * 7919)
        r = config.rank
        self.shared = {
            name: LowRank(torch.zeros(d_out, r, dtype=torch.float64), init_lora_a(r, d_in, gen).to(torch.float64))
            for name, (d_out, d_in) in spec.layers.items()
        }

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase != Phase.TRAIN:
            raise ValueError(f"FedAvg with LoRA has no {phase} step")
        return self.base_plan(
            task,
            round_,
            phase,
            LoraStep(train_factors=("B", "A")),
            low_rank_tensors(LORA, {name: published(f.b, f.a) for name, f in self.shared.items()}),
        )

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, fedavg_lora(plan, self.spec, self.config), self.merge)

    def merge(self, plan: RoundPlan, aggregator: MeanAggregator) -> None:
        self.shared = {name: LowRank(aggregator.b[name].result(), aggregator.a[name].result()) for name in self.shared}
        self.head_w = aggregator.head.result()
        self.head_b = aggregator.bias.result()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return super().state_tensors() | factors_to_tensors("shared", self.shared)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        super().load_state_tensors(tensors)
        self.shared = factors_from_tensors("shared", self.spec.layers, tensors)

    def adapter(self) -> dict[str, LowRank]:
        return self.shared
