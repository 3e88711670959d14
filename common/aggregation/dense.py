"""The full fine-tuning baselines' aggregators: FedAvg, RegMean and Fisher averaging of the clients' backbone
deltas and heads (TIES' is its slice's, ``common/methods/ties.py``), and EWC's Fisher at a task's end.

Factories (``Method.aggregator``): :func:`fedavg` (``fedavg``, ``lwf``, ``target``), :func:`regmean`,
:func:`fisheravg`, :func:`ewc`, and :func:`prompts` (``l2p``, ``coda-p``: FedAvg of the trained
prompt components' change).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from common.adapters.prompts import trained_shapes
from common.aggregation.base import Aggregator, Phased, present
from common.aggregation.declared import HEAD_FISHER, Shapes, declared_tensors
from common.merges.dense import FisherMeanAccumulator
from common.merges.grams import decay_gram
from common.merges.regmean import RegMeanAccumulator, WeightedMeanAccumulator
from common.run.config import FISHER_SUMMED, RunConfig
from common.wire.instructions import PromptStep
from common.wire.messages import ClientUpdate, ModelSpec, Phase, RoundPlan
from common.wire.tensors import DELTA, FISHER, GRAM, HEAD_BIAS, HEAD_GRAM, HEAD_WEIGHT, PROMPT


def head_delta(update: ClientUpdate, plan: RoundPlan) -> tuple[Tensor, Tensor]:
    """The client's head change ``(w_i - w_g, b_i - b_g)``, float64.

    Taken against the plan's head cast to the update's dtype (what the client actually started
    from), so that rows the client did not train give exact zeros rather than rounding noise.
    """
    w, b = present(update.get(HEAD_WEIGHT)), present(update.get(HEAD_BIAS))
    w0, b0 = present(plan.get(HEAD_WEIGHT)), present(plan.get(HEAD_BIAS))
    return ((w - w0.to(w.dtype)).to(torch.float64), (b - b0.to(b.dtype)).to(torch.float64))


def weight_param(layer: str) -> str:
    """The backbone parameter holding a LoRA-wrapped linear layer's weight ``W0: (d_out, d_in)``."""
    return f"{layer}.base.weight"


class FedAvgAggregator(Aggregator):
    """Sample-weighted means of the updates' ``delta`` entries (``shapes``: every backbone parameter
    unless given) and of their heads."""

    PARTS: ClassVar[tuple[str, ...]] = ("delta", "head", "bias")  # running sums (common/merges/sums.py)

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


class RegMeanAggregator(Aggregator):
    """RegMean of every linear layer's delta with its decayed Gram, sample-weighted means of the other
    parameters' deltas, RegMean of the head weight with the head Gram and the bias's mean."""

    PARTS = (
        "layers",
        "others",
        "head",
        "bias",
    )  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, config: RunConfig) -> None:
        super().__init__(plan, declared)
        self.spec, self.config = spec, config
        self.layers = {name: RegMeanAccumulator(d_out, d_in) for name, (d_out, d_in) in spec.layers.items()}
        linear = {weight_param(name) for name in spec.layers}
        self.others: dict[str, WeightedMeanAccumulator] = {
            name: WeightedMeanAccumulator(tuple(shape)) for name, shape in spec.params.items() if name not in linear
        }
        self.head = RegMeanAccumulator(spec.num_classes, spec.feature_dim)
        self.bias = WeightedMeanAccumulator((spec.num_classes,))

    def _fold(self, update: ClientUpdate) -> None:
        n, gamma = update.num_samples, self.config.gamma_backbone
        delta, grams = update.named(DELTA), update.named(GRAM)
        for name, layer in self.layers.items():
            layer.fold(delta[weight_param(name)], decay_gram(grams[name], gamma))
        for name, other in self.others.items():
            other.fold(delta[name], n)
        head_gram = decay_gram(present(update.get(HEAD_GRAM)), self.config.gamma_head)
        self.head.fold(present(update.get(HEAD_WEIGHT)), head_gram)
        self.bias.fold(present(update.get(HEAD_BIAS)), n)


class FisherAvgAggregator(Aggregator):
    """Fisher-weighted means of the deltas and of the head's change, per entry (the sample-weighted mean where
    no client's Fisher weighs an entry)."""

    PARTS = ("delta", "head", "bias")  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, summed: bool) -> None:
        super().__init__(plan, declared)
        self.spec = spec
        self.summed = summed  # the estimator sums over samples (``reference``) rather than averaging
        self.delta = {name: FisherMeanAccumulator(tuple(shape)) for name, shape in spec.params.items()}
        self.head = FisherMeanAccumulator((spec.num_classes, spec.feature_dim))
        self.bias = FisherMeanAccumulator((spec.num_classes,))

    def _fold(self, update: ClientUpdate) -> None:
        n = update.num_samples
        scale = 1.0 if self.summed else float(n)  # the Fisher of the shard, not of one sample

        fisher, delta = update.named(FISHER), update.named(DELTA)

        def shard(name: str) -> Tensor:
            return fisher[name] * scale

        for name, acc in self.delta.items():
            acc.fold(delta[name], shard(name), n)
        dw, db = head_delta(update, self.plan)
        self.head.fold(dw, shard(HEAD_FISHER[0]), n)
        self.bias.fold(db, shard(HEAD_FISHER[1]), n)


class FisherAggregator(Aggregator):
    """EWC's step at a task's end: the clients' diagonal Fishers, sample-weighted."""

    PARTS = ("fisher",)  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, summed: bool) -> None:
        super().__init__(plan, declared)
        self.summed = summed  # the estimator sums over samples (``reference``) rather than averaging
        self.fisher = {name: WeightedMeanAccumulator(tuple(shape)) for name, shape in spec.params.items()}

    def _fold(self, update: ClientUpdate) -> None:
        n = update.num_samples
        fisher = update.named(FISHER)
        for name, acc in self.fisher.items():
            f = fisher[name]
            acc.fold(f / n if self.summed else f, n)  # sum_i F_i / sum_i n_i, or sum_i n_i F_i / sum_i n_i


# ----------------------------------------------------------------------------- factories


def fedavg(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> FedAvgAggregator:
    """FedAvg of every backbone delta and the head (``fedavg``, ``lwf``, ``target``)."""
    return FedAvgAggregator(plan, declared_tensors(plan, spec, config), spec)


def regmean(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> RegMeanAggregator:
    """RegMean of the linear layers and the head, FedAvg of the rest."""
    return RegMeanAggregator(plan, declared_tensors(plan, spec, config), spec, config)


def fisheravg(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> FisherAvgAggregator:
    """Fisher averaging of the deltas and the head's change, with the run's Fisher estimator."""
    declared = declared_tensors(plan, spec, config)
    return FisherAvgAggregator(plan, declared, spec, summed=config.fisher in FISHER_SUMMED)


def ewc_fisher(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> FisherAggregator:
    """EWC's step at a task's end (its ``TASK_GRAM`` step): the clients' Fishers, with the run's estimator."""
    declared = declared_tensors(plan, spec, config)
    return FisherAggregator(plan, declared, spec, summed=config.fisher in FISHER_SUMMED)


# EWC: FedAvg in the training rounds, the clients' Fishers at a task's end (its ``TASK_GRAM`` step)
ewc = Phased(Phase.TASK_GRAM, ewc_fisher, fedavg)


def prompts(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> FedAvgAggregator:
    """The prompt learners (``l2p``, ``coda-p``): FedAvg of the change of the pool's components the plan leaves
    trainable (all but its ``prompt_frozen`` leading ones) and of the head."""
    pool = {name: tuple(t.shape) for name, t in plan.named(PROMPT).items()}
    frozen = plan.expect(PromptStep).prompt_frozen
    return FedAvgAggregator(plan, declared_tensors(plan, spec, config), spec, trained_shapes(pool, frozen))
