"""The LoRA family's aggregators: LoRM's rounds and task Gram step (whose round, :class:`RoundAggregator`, the
VeRA and (IA)^3 slices specialise), FedAvg of the factors, and the head alone.

Factories (``Method.aggregator``): :func:`lorm` (``lorm``, ``lorm-b-only``, ``lorm-avg-tasks``, ``lorm-seq``; per
phase :func:`lorm_round` and :func:`task_gram`), :func:`fedavg_lora` (``fedavg-lora``, ``fedprox``) and
:func:`head_only` (``head-only``).
"""

from __future__ import annotations

from torch import Tensor

from common.aggregation.base import Aggregator, Phased, present
from common.aggregation.declared import Shapes, declared_tensors
from common.merges.grams import GramSum, decay_gram
from common.merges.regmean import (
    LoraAAccumulator,
    LoraBAccumulator,
    RegMeanAccumulator,
    WeightedMeanAccumulator,
)
from common.run.config import RunConfig
from common.wire.instructions import LoraStep
from common.wire.messages import ClientUpdate, ModelSpec, Phase, RoundPlan
from common.wire.tensors import FACTOR, GRAM, HEAD_BIAS, HEAD_GRAM, HEAD_WEIGHT, LORA


class RoundAggregator(Aggregator):
    """A training round of a LoRM-style method: the trained part of every layer (``layers``, one accumulator
    each, fed the update's trained tensor and its Gram statistic), the head by RegMean, the bias by samples."""

    PARTS = ("layers", "head", "bias")  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, config: RunConfig, layers: dict) -> None:
        super().__init__(plan, declared)
        self.spec, self.config = spec, config
        (self.active,) = plan.expect(LoraStep).train_factors
        self.layers = layers
        self.head = RegMeanAccumulator(spec.num_classes, spec.feature_dim)
        self.bias = WeightedMeanAccumulator((spec.num_classes,))

    def statistic(self, gram: Tensor) -> Tensor:
        """What a layer's accumulator takes of the update's ``gram/<layer>``: as sent (by default)."""
        return gram

    def _fold(self, update: ClientUpdate) -> None:
        factors, grams = update.by_layer(FACTOR), update.named(GRAM)
        for name, acc in self.layers.items():
            acc.fold(factors[name][self.active], self.statistic(grams[name]))
        head_gram = decay_gram(present(update.get(HEAD_GRAM)), self.config.gamma_head)
        self.head.fold(present(update.get(HEAD_WEIGHT)), head_gram)
        self.bias.fold(present(update.get(HEAD_BIAS)), update.num_samples)


class LoRMRoundAggregator(RoundAggregator):
    """One LoRM round: the active factor per layer (B with the shared A, or A), from the clients' Grams."""

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, config: RunConfig) -> None:
        (active,) = plan.expect(LoraStep).train_factors
        shared = plan.low_rank(LORA)
        layers: dict[str, LoraBAccumulator | LoraAAccumulator] = (
            {name: LoraBAccumulator(shared[name].a, d_out) for name, (d_out, _) in spec.layers.items()}
            if active == "B"
            else {name: LoraAAccumulator(config.rank, d_in) for name, (_, d_in) in spec.layers.items()}
        )
        super().__init__(plan, declared, spec, config, layers)

    def statistic(self, gram: Tensor) -> Tensor:
        return decay_gram(gram, self.config.gamma_backbone)


class TaskGramAggregator(Aggregator):
    """End of task: the global Gram ``G^t = sum_i G_i^t`` per layer."""

    PARTS = ("grams",)  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec) -> None:
        super().__init__(plan, declared)
        self.spec = spec
        self.grams = {name: GramSum(d_in) for name, (_, d_in) in spec.layers.items()}

    def _fold(self, update: ClientUpdate) -> None:
        grams = update.named(GRAM)
        for name, acc in self.grams.items():
            acc.fold(grams[name])


class MeanAggregator(Aggregator):
    """FedAvg of LoRA factors: sample-weighted means of both factors of every layer and of the head."""

    PARTS = ("b", "a", "head", "bias")  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, rank: int) -> None:
        super().__init__(plan, declared)
        self.spec, self.rank = spec, rank
        shared = plan.low_rank(LORA)
        self.b = {name: WeightedMeanAccumulator(tuple(f.b.shape)) for name, f in shared.items()}
        self.a = {name: WeightedMeanAccumulator(tuple(f.a.shape)) for name, f in shared.items()}
        self.head = WeightedMeanAccumulator((spec.num_classes, spec.feature_dim))
        self.bias = WeightedMeanAccumulator((spec.num_classes,))

    def _fold(self, update: ClientUpdate) -> None:
        n = update.num_samples
        for name, f in update.by_layer(FACTOR).items():
            self.b[name].fold(f["B"], n)
            self.a[name].fold(f["A"], n)
        self.head.fold(present(update.get(HEAD_WEIGHT)), n)
        self.bias.fold(present(update.get(HEAD_BIAS)), n)


class HeadMeanAggregator(Aggregator):
    """The sample-weighted mean of the clients' heads: weight ``(C, F)``, bias ``(C,)``."""

    PARTS = ("head", "bias")  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec) -> None:
        super().__init__(plan, declared)
        self.spec = spec
        self.head = WeightedMeanAccumulator((spec.num_classes, spec.feature_dim))
        self.bias = WeightedMeanAccumulator((spec.num_classes,))

    def _fold(self, update: ClientUpdate) -> None:
        self.head.fold(present(update.get(HEAD_WEIGHT)), update.num_samples)
        self.bias.fold(present(update.get(HEAD_BIAS)), update.num_samples)


# ----------------------------------------------------------------------------- factories


def lorm_round(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> LoRMRoundAggregator:
    """A LoRM training round: the closed-form merge of the active factor, from the clients' Grams."""
    return LoRMRoundAggregator(plan, declared_tensors(plan, spec, config), spec, config)


def task_gram(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> TaskGramAggregator:
    """A task Gram step of LoRM's family: the Grams of the layers' inputs, summed."""
    return TaskGramAggregator(plan, declared_tensors(plan, spec, config), spec)


# LoRM's steps: a training round's closed-form merge of the active factor, a task Gram step's Grams
lorm = Phased(Phase.TRAIN, lorm_round, task_gram)


def fedavg_lora(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> MeanAggregator:
    """FedAvg of the LoRA factors and the head (``fedavg-lora``, ``fedprox``)."""
    return MeanAggregator(plan, declared_tensors(plan, spec, config), spec, config.rank)


def head_only(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> HeadMeanAggregator:
    """The heads' sample-weighted mean (``head-only``)."""
    return HeadMeanAggregator(plan, declared_tensors(plan, spec, config), spec)
