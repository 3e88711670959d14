"""FedProx's server half (``common/methods/fedprox.py``): FedAvg-LoRA, whose plans carry ``mu``."""

from __future__ import annotations

import dataclasses

from common.methods.fedprox import FedProxSettings, FedProxStep
from common.wire.messages import Phase, RoundPlan
from server.strategies.fedavg_lora import FedAvgLoRA


class FedProx(FedAvgLoRA):
    name = "fedprox"

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        plan = super().configure(task, round_, phase)
        mu = self.config.section(FedProxSettings).mu
        return dataclasses.replace(plan, instruction=FedProxStep(train_factors=("B", "A"), mu=mu))
