"""The client halves of the continual-learning baselines (``server/strategies/continual.py``).

Both train as :class:`DenseTrainer` does (every backbone weight and the head, ACE) and add a
term to each batch's loss, from what the plan hands out:

- **EWC** (Kirkpatrick et al. 2017): ``strength/2 * sum_k F_k (theta_k - theta*_k)^2`` over
  the backbone parameters, with ``theta* = W0 + plan.anchor`` and ``F = plan.fisher`` (empty
  during the first task: no penalty). At a task's end its ``TASK_GRAM`` step sends the
  diagonal Fisher of the shard at the merged weights (``client.methods.dense.fisher``).
- **LwF** (Li & Hoiem 2017): ``alpha * CE(softmax(t / T), softmax(s / T))`` over the old classes
  ``[0, lo)``, where ``t`` are the logits of the previous task's global model
  (``W0 + plan.anchor`` with that model's head, which the anchor carries: the plan's head moves
  during the task, as the distillation trains its old rows) and ``s`` the model's being trained
  (empty ``anchor``, first task: no term).
  The paper's public code slices both models' logits to the *current* task's classes before
  distilling (``lwf.py``: the teacher's ``[cur_offset : cur_offset + cpt]``, then ``[:, :cur_offset
  + cpt]`` of that), so it distils the old model's outputs on the new classes; this follows the
  original LwF, on the old classes. Softening by ``p^(1/T)`` renormalised, as that code does, is
  ``softmax(z / T)``: the same target.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from client.classifier import ClassifierModel
from client.methods.base import Client, load_dense
from client.methods.dense import DenseTrainer
from common.methods.ewc import EwcSettings
from common.methods.lwf import LwfSettings
from common.wire.messages import ANCHOR_HEAD, RoundPlan
from common.wire.tensors import ANCHOR, FISHER


def ewc_penalty(
    params: Mapping[str, Tensor], centre: Mapping[str, Tensor], fisher: Mapping[str, Tensor], strength: float
) -> Tensor:
    """``strength/2 * sum_k F_k (theta_k - theta*_k)^2`` over the parameters ``fisher`` names."""
    terms = [(fisher[name] * (params[name] - centre[name]).square()).sum() for name in fisher]
    return 0.5 * strength * torch.stack(terms).sum()


def distillation(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """LwF's loss on ``(batch, old classes)`` logits: the cross-entropy of the student's softened
    distribution against the teacher's, ``-mean_x sum_c softmax(t/T)_c log softmax(s/T)_c``."""
    target = F.softmax(teacher / temperature, dim=1)
    return -(target * F.log_softmax(student / temperature, dim=1)).sum(1).mean()


class EwcTrainer(DenseTrainer):
    """:class:`DenseTrainer` with EWC's penalty around ``W0 + anchor``, weighted by the plan's ``fisher/*``."""

    def load(self, client: Client, plan: RoundPlan) -> None:
        super().load(client, plan)
        self.centre: dict[str, Tensor] = {}
        self.weights: dict[str, Tensor] = {}
        fisher, anchor = plan.named(FISHER), plan.named(ANCHOR)
        if fisher:
            w0, device = client.model.pristine(), client.device
            for name, f in fisher.items():
                self.centre[name] = (w0[name] + anchor[name].to(w0[name].dtype)).to(device)
                self.weights[name] = f.to(device=device, dtype=w0[name].dtype)
        self.strength = client.config.section(EwcSettings).strength

    def regulariser(
        self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor], logits: Tensor, labels: Tensor
    ) -> Tensor | None:
        if not self.weights or self.strength == 0.0:
            return None
        return ewc_penalty(client.model.dense_params(), self.centre, self.weights, self.strength)


def previous_model(client: Client, plan: RoundPlan) -> ClassifierModel | None:
    """The global model at the previous task's end, ``W0 + plan.anchor`` with that model's head (the
    anchor's ``ANCHOR_HEAD`` entries), frozen, in eval mode; ``None`` in the first task."""
    anchor = plan.named(ANCHOR)
    if not anchor or plan.class_range[0] == 0:
        return None
    missing = [key for key in ANCHOR_HEAD if key not in anchor]
    if missing:
        raise ValueError(f"the plan's anchor has no {missing}: a teacher needs the previous task's head")
    teacher = copy.deepcopy(client.model)
    load_dense(teacher, anchor)  # the previous task's backbone...
    with torch.no_grad():  # ...and its head
        for p, key in zip((teacher.head.weight, teacher.head.bias), ANCHOR_HEAD):
            p.copy_(anchor[key].to(device=p.device, dtype=p.dtype))
    teacher.eval()  # no dropout: a fixed target
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


class LwfTrainer(DenseTrainer):
    """:class:`DenseTrainer` with distillation on the old classes from the model ``W0 + plan.anchor``."""

    def load(self, client: Client, plan: RoundPlan) -> None:
        super().load(client, plan)
        self.teacher = previous_model(client, plan)
        self.settings = client.config.section(LwfSettings)

    def regulariser(
        self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor], logits: Tensor, labels: Tensor
    ) -> Tensor | None:
        if self.teacher is None or self.settings.alpha == 0.0:
            return None
        lo = plan.class_range[0]
        with torch.no_grad():
            old = self.teacher(inputs)[0][:, :lo]
        return self.settings.alpha * distillation(logits[:, :lo], old, self.settings.temperature)
