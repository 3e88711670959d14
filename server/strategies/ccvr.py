"""CCVR (Luo et al. 2021): FedAvg, then the classifier calibrated on virtual representations.

Clients fine-tune every backbone weight and the head with ACE, merged by FedAvg (``fedavg``).
After each task's rounds comes a features step (``FEATURES``, round ``R``, no training) at the
merged weights ``W0 + delta``: every client sends, for each class ``c`` of the task, its count
``n_c``, sum ``S_c = sum x`` and second moment ``M_c = sum x x^T`` (``diag``: ``sum x * x``)
of its features. Sums add up over clients, so the coordinator's per-class Gaussian is exactly the
centralised one (:func:`gaussians`): ``mu_c = S_c / n_c``, ``Sigma_c = (M_c - n_c mu_c mu_c^T) /
(n_c - 1)``. It keeps one Gaussian per class seen so far (an old task's from that task's end:
its data is gone), draws ``ccvr.samples`` virtual features per class and epoch from them
(:func:`virtual_features`), and re-trains the head on all seen classes (:func:`calibrate`;
SGD with momentum, cosine-annealed learning rate, the paper's code's logit normalisation). The
calibrated head is evaluated and is the head the next task starts from.

Memory on the coordinator: one ``(F, F)`` covariance per seen class (``(F,)`` with ``diag``),
independent of the number of clients. The paper's code calibrates after every round, with the
clients' own (unmerged) models' statistics and diagonal variances by default; this follows the
original: once per task, at the merged model, full covariances (``ccvr.covariance``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from common.aggregation.features import CcvrStatsAggregator, ccvr_stats
from common.methods.ccvr import CcvrSettings
from common.run.config import RunConfig
from common.wire.instructions import FeaturesStep
from common.wire.messages import ModelSpec, Phase, RoundPlan
from common.wire.tensors import DELTA, named_tensors
from server.strategies.fedavg import FedAvg
from server.strategies.fold import Fold

DTYPE = torch.float64


def gaussians(class_sum: Tensor, count: Tensor, moment: Tensor) -> tuple[Tensor, Tensor]:
    """Per-class means ``(C, F)`` and covariances ``(C, F, F)`` (``moment (C, F)``: variances ``(C, F)``)
    from the sums ``S (C, F)``, counts ``n (C,)`` and second moments ``M``; unbiased (``n - 1``), zero
    for a class of one sample."""
    n = count.to(DTYPE).clamp_min(1.0)
    mean = class_sum.to(DTYPE) / n[:, None]
    dof = (count.to(DTYPE) - 1.0).clamp_min(1.0)
    if moment.dim() == 3:
        cov = (moment.to(DTYPE) - n[:, None, None] * mean[:, :, None] * mean[:, None, :]) / dof[:, None, None]
        cov = 0.5 * (cov + cov.transpose(1, 2))
    else:
        cov = ((moment.to(DTYPE) - n[:, None] * mean * mean) / dof[:, None]).clamp_min(0.0)
    return mean, cov


def sampling_factor(cov: Tensor) -> Tensor:
    """``L`` with ``L L^T = Sigma`` per class: the Cholesky factor of ``Sigma + eps I``, ``eps`` growing from
    ``1e-10`` of the mean variance until it exists (a covariance of fewer samples than features is singular);
    variances ``(C, F)``: their square roots."""
    if cov.dim() == 2:
        return cov.sqrt()
    eye = torch.eye(cov.shape[-1], dtype=DTYPE)
    out = torch.empty_like(cov)
    for c, sigma in enumerate(cov):
        scale = max(float(sigma.diagonal().mean()), 1e-300)
        for power in range(-10, 1):
            factor, info = torch.linalg.cholesky_ex(sigma + (10.0**power) * scale * eye)
            if int(info) == 0:
                break
        else:
            raise ValueError(f"ccvr: the covariance of class {c} has no Cholesky factor")
        out[c] = factor
    return out


def virtual_features(mean: Tensor, factor: Tensor, per_class: int, generator: torch.Generator) -> Tensor:
    """``per_class`` draws of ``N(mu_c, L_c L_c^T)`` per class: ``(C, per_class, F)``."""
    z = torch.randn(mean.shape[0], per_class, mean.shape[1], dtype=DTYPE, generator=generator)
    noise = torch.einsum("cfg,cng->cnf", factor, z) if factor.dim() == 3 else z * factor[:, None, :]
    return mean[:, None, :] + noise


def calibrate(
    weight: Tensor, bias: Tensor, mean: Tensor, factor: Tensor, settings: CcvrSettings, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """The head rows of the ``C`` seen classes, ``weight (C, F)`` and ``bias (C,)``, re-trained on virtual
    features of every seen class with cross-entropy over all of them (logits divided by their norm and
    by ``logit_norm`` when it is positive); float64."""
    w = torch.nn.Parameter(weight.to(DTYPE).clone())
    b = torch.nn.Parameter(bias.to(DTYPE).clone())
    optimizer = torch.optim.SGD([w, b], lr=settings.lr, momentum=settings.momentum)
    classes = mean.shape[0]
    labels = torch.arange(classes).repeat_interleave(settings.samples)
    batch = settings.samples  # as the paper's code: as many virtual features per batch as per class
    for epoch in range(settings.epochs):
        for group in optimizer.param_groups:  # cosine annealing over the epochs
            group["lr"] = settings.lr * 0.5 * (1.0 + math.cos(math.pi * epoch / settings.epochs))
        x = virtual_features(mean, factor, settings.samples, generator).reshape(-1, mean.shape[1])
        order = torch.randperm(x.shape[0], generator=generator)
        for start in range(0, x.shape[0], batch):
            idx = order[start : start + batch]
            logits = x[idx] @ w.T + b
            if settings.logit_norm > 0:
                logits = (logits + 1e-12) / (logits.norm(dim=1, keepdim=True) + 1e-12) / settings.logit_norm
            loss = F.cross_entropy(logits, labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return w.detach(), b.detach()


class CCVR(FedAvg):
    name = "ccvr"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.settings = config.section(CcvrSettings)
        self.mean = torch.zeros(0, spec.feature_dim, dtype=DTYPE)  # (seen, F)
        self.cov = torch.zeros((0, spec.feature_dim, spec.feature_dim)[: 2 if self.diag else 3], dtype=DTYPE)

    @property
    def diag(self) -> bool:
        return self.settings.covariance == "diag"

    def steps(self, task: int) -> list[tuple[Phase, int]]:
        return super().steps(task) + [(Phase.FEATURES, self.config.rounds_per_task)]

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase == Phase.FEATURES:  # the merged model's features, no training
            return self.base_plan(task, round_, phase, FeaturesStep(), named_tensors(DELTA, self.delta))
        return super().configure(task, round_, phase)

    def open(self, plan: RoundPlan) -> Fold:
        if plan.phase == Phase.FEATURES:
            return Fold(plan, ccvr_stats(plan, self.spec, self.config), self.calibrate)
        return super().open(plan)

    def calibrate(self, plan: RoundPlan, aggregator: CcvrStatsAggregator) -> None:
        """The task's class Gaussians, and the head calibrated on samples drawn from every class's so far."""
        sums = aggregator.sums.value()
        mean, cov = gaussians(sums["class_sum"], sums["class_count"], sums["class_moment"])
        self.mean, self.cov = torch.cat([self.mean, mean]), torch.cat([self.cov, cov])
        seen = self.mean.shape[0]
        gen = torch.Generator().manual_seed((self.config.seed * 1_000_003 + 37) * 1_000_003 + plan.task)
        w, b = calibrate(
            self.head_w[:seen], self.head_b[:seen], self.mean, sampling_factor(self.cov), self.settings, gen
        )
        self.head_w = torch.cat([w, self.head_w[seen:].to(DTYPE)])
        self.head_b = torch.cat([b, self.head_b[seen:].to(DTYPE)])

    def step_report(self, plan: RoundPlan) -> dict[str, Any]:
        if plan.phase != Phase.FEATURES:
            return super().step_report(plan)
        return {"calibrated_classes": int(self.mean.shape[0])}

    def state_tensors(self) -> dict[str, Tensor]:
        return super().state_tensors() | {"ccvr/mean": self.mean, "ccvr/cov": self.cov}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        self.mean, self.cov = tensors["ccvr/mean"], tensors["ccvr/cov"]
