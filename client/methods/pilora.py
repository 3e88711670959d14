"""The client half of PILoRA (Guo et al. 2024): an incremental LoRA classified by learned prototypes.

The model of task ``t`` is ``W0 + extra + s B_t A_t``: ``extra`` holds the earlier tasks' LoRA
modules (``sum_{tau < t} B_tau A_tau``, frozen; its ``A`` factor stacks their ``A_tau``), and
``(B_t, A_t)`` is this task's, trained. Classes are scored by their prototypes ``p_c``
(``proto/mean (C, F)`` and ``proto/count (C,)``, nonzero for the classes seen so far; ``common/methods/pilora.py``),
not by a head: ``logit_c = -d(f(x), p_c) / T`` with ``d(f, p) = ||f - p|| / sqrt(F)``. The loss:

- the distance-based cross-entropy over every seen class (not ACE: old prototypes compete);
- ``pl`` times the mean distance of each sample to its own class's prototype;
- ``ort`` times ``sum_layers sum |A_t A_old^T|`` (entrywise), which pushes this task's ``A_t`` to
  rows orthogonal to the earlier tasks'.

The task's prototypes train at ``lr``, the LoRA factors at ``lora_lr``; old prototypes are
constants. A client sends its factors, its trained prototypes of the task's classes
(``stats["prototype"]``) and the class sums and counts of its features at the trained model
(``class_sum``, ``class_count``: the coordinator's re-weighting needs each client's class means).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from client.features import class_sums
from client.methods.base import Client
from client.methods.lora import LoRATrainer
from common.methods.fedproto import PROTO
from common.methods.pilora import PiLoraSettings
from common.wire.messages import Phase, RoundPlan
from common.wire.tensors import EXTRA, STAT, named_tensors


def scaled_distance(features: Tensor, prototypes: Tensor) -> Tensor:
    """``||f - p|| / sqrt(F)`` for every sample and prototype: ``(batch, F)``, ``(C, F)`` -> ``(batch, C)``."""
    squared = features.square().sum(1, keepdim=True) + prototypes.square().sum(1) - 2 * features @ prototypes.T
    return (squared.clamp_min(0.0) / features.shape[1]).sqrt()


def orthogonality(a_new: Mapping[str, Tensor], a_old: Mapping[str, Tensor]) -> Tensor | None:
    """``sum_layers sum_ij |(A_t A_old^T)_ij|`` over the layers with earlier modules; ``None`` when none has."""
    terms = [(a_new[name] @ old.T).abs().sum() for name, old in a_old.items() if name in a_new]
    return torch.stack(terms).sum() if terms else None


class PiLoraTrainer(LoRATrainer):
    """:class:`LoRATrainer` (``W0 + extra + s B A``) scored by prototypes, with PILoRA's losses."""

    def load(self, client: Client, plan: RoundPlan) -> None:
        super().load(client, plan)
        self.settings = client.config.section(PiLoraSettings)
        device, (lo, hi) = client.device, plan.class_range
        prototypes = plan.named(PROTO)
        mean = prototypes["mean"].to(device=device, dtype=torch.float32)
        self.seen = int((prototypes["count"] > 0).sum())  # classes 0..seen-1 have prototypes
        self.old = mean[:lo]
        self.current = nn.Parameter(mean[lo:hi].clone())
        self.later = mean[hi:]
        self.old_a = {name: f.a.to(device=device, dtype=torch.float32) for name, f in plan.low_rank(EXTRA).items()}

    def prototypes(self) -> Tensor:
        return torch.cat([self.old, self.current, self.later])

    def head_params(self, client: Client, plan: RoundPlan) -> list[nn.Parameter]:
        return [self.current]

    def forward(self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
        _, self.features = client.model(inputs)
        distance = scaled_distance(self.features, self.prototypes()[: self.seen])  # (batch, seen)
        logits = -distance / self.settings.temperature
        unseen = logits.new_full((logits.shape[0], client.model.head.out_features - self.seen), -math.inf)
        return torch.cat([logits, unseen], dim=1)  # (batch, C): classes without a prototype never win

    def loss(self, logits: Tensor, labels: Tensor, plan: RoundPlan) -> Tensor:
        return F.cross_entropy(logits[:, : self.seen], labels)  # every seen class competes

    def regulariser(
        self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor], logits: Tensor, labels: Tensor
    ) -> Tensor | None:
        s = self.settings
        own = -logits.gather(1, labels[:, None]).squeeze(1) * s.temperature  # d(f(x), p_y)
        extra = s.pl * own.mean()
        a_new = {name: layer.lora_A for name, layer in client.model.lora().items()}
        ort = orthogonality(a_new, self.old_a)
        return extra if ort is None or s.ort == 0.0 else extra + s.ort * ort

    def outputs(self, client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
        out = super().outputs(client, plan, shard, seed)
        if plan.phase == Phase.TRAIN:  # LoRATrainer.outputs has set the trained model's view W0 + extra + s B_t A_t
            stats = class_sums(client.model, client.train, shard, client.device, plan.class_range)
            out |= named_tensors(STAT, stats | {"prototype": self.current.detach().cpu().to(torch.float64)})
        return out

    def logits(self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
        return self.forward(client, plan, inputs)
