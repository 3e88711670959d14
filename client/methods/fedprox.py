"""FedProx's client half (``common/methods/fedprox.py``): LoRA training with the proximal term.

Trains as :class:`LoRATrainer` (the plan's factors and the head, ACE) and adds ``mu / 2 ||w - w^t||^2``
to every batch's loss, over the parameters it trains; ``w^t`` is what the step started from, the plan's
global factors and head.
"""

from __future__ import annotations

import torch
from torch import Tensor

from client.methods.base import Client
from client.methods.lora import LoRATrainer
from common.methods.fedprox import FedProxStep
from common.wire.messages import RoundPlan


class FedProxTrainer(LoRATrainer):
    """:class:`LoRATrainer` with FedProx's proximal term around the received parameters."""

    def trainable(self, client: Client, plan: RoundPlan) -> list[torch.nn.Parameter]:
        factors = super().trainable(client, plan)
        self.mu = plan.expect(FedProxStep).mu
        self.trained = factors + self.head_params(client, plan)
        self.start = [p.detach().clone() for p in self.trained]  # w^t: what the plan loaded
        return factors

    def regulariser(
        self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor], logits: Tensor, labels: Tensor
    ) -> Tensor | None:
        if self.mu == 0.0:
            return None
        distance = torch.stack([(p - p0).square().sum() for p, p0 in zip(self.trained, self.start)]).sum()
        return self.mu / 2 * distance
