"""The client half of FedProto (Tan et al. 2022), federated with FedAvg of the weights as the paper ran it.

Trains as :class:`DenseTrainer` (every backbone weight and the head, ACE) and adds the prototype
loss ``weight * mean_x ||f(x) - p_y||^2 / F`` over the batch's samples whose class ``y`` has a
global prototype ``p_y`` in the plan (``proto/mean (C, F)``, ``proto/count (C,)``; a
class with count 0 has none yet, e.g. in a task's first round): FedProto's regulariser as its
code computes it, the squared distance of each sample's features to its class's prototype,
averaged. After training the client sends, besides FedAvg's delta and head, its class sums and
counts of the task's classes at the trained weights (``stats``: ``class_sum (C_t, F)``,
``class_count (C_t,)``, features in eval mode), from which the coordinator computes the next
prototypes. With ``fedproto.classify=prototype`` evaluation scores each seen class by
``-||f(x) - p_c||^2`` (FedProto's nearest-prototype rule) instead of by the head.
"""

from __future__ import annotations

import torch
from torch import Tensor

from client.features import class_sums
from client.methods.base import Client
from client.methods.dense import DenseTrainer
from common.methods.fedproto import PROTO, FedProtoSettings
from common.wire.messages import Phase, RoundPlan
from common.wire.tensors import STAT, named_tensors


def prototype_loss(features: Tensor, labels: Tensor, mean: Tensor, count: Tensor) -> Tensor | None:
    """``mean_x ||f(x) - p_y||^2 / F`` over the samples whose class has a prototype (``count > 0``);
    ``None`` when none has. ``features (batch, F)``, ``labels (batch,)``, ``mean (C, F)``, ``count (C,)``."""
    known = count[labels] > 0
    if not bool(known.any()):
        return None
    return (features[known] - mean[labels[known]]).square().mean()


class FedProtoTrainer(DenseTrainer):
    """:class:`DenseTrainer` with the prototype loss; sends the task's class sums too."""

    def load(self, client: Client, plan: RoundPlan) -> None:
        super().load(client, plan)
        self.settings = client.config.section(FedProtoSettings)
        device = client.device
        prototypes = plan.named(PROTO)
        self.mean = prototypes["mean"].to(device=device, dtype=torch.float32) if prototypes else None
        self.count = prototypes["count"].to(device) if prototypes else None
        self.features: Tensor | None = None

    def forward(self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
        logits, self.features = client.model(inputs)
        return logits

    def regulariser(
        self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor], logits: Tensor, labels: Tensor
    ) -> Tensor | None:
        if self.mean is None or self.count is None or self.features is None or self.settings.weight == 0.0:
            return None
        loss = prototype_loss(self.features, labels, self.mean, self.count)
        return None if loss is None else self.settings.weight * loss

    def outputs(self, client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
        out = super().outputs(client, plan, shard, seed)
        if plan.phase == Phase.TRAIN:
            out |= named_tensors(STAT, class_sums(client.model, client.train, shard, client.device, plan.class_range))
        return out

    def logits(self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
        if self.settings.classify == "head" or self.mean is None or self.count is None:
            return super().logits(client, plan, inputs)
        _, features = client.model(inputs)
        distance = torch.cdist(features.float(), self.mean).square()  # (batch, C)
        return torch.where(self.count > 0, -distance, torch.full_like(distance, -torch.inf))
