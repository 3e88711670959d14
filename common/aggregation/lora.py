"""The LoRA family's aggregators: LoRM's rounds and task Gram step (with VeRA's and (IA)^3's variants),
FedAvg of the factors, and the head alone.

Factories (``Method.aggregator``): :func:`lorm` (``lorm``, ``lorm-b-only``, ``lorm-avg-tasks``, ``lorm-seq``),
:func:`vera` (``lorm-vera``), :func:`ia3` (``lorm-ia3``), :func:`fedavg_lora` (``fedavg-lora``, ``fedprox``) and
:func:`head_only` (``head-only``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from common.adapters.vera import frozen_matrices
from common.aggregation.base import Aggregator, present
from common.aggregation.declared import Shapes, declared_tensors
from common.merges.grams import GramSum, decay_gram
from common.merges.regmean import (
    LoraAAccumulator,
    LoraBAccumulator,
    RegMeanAccumulator,
    WeightedMeanAccumulator,
)
from common.merges.vectors import ia3_accumulator, vera_accumulator
from common.methods.ia3 import Ia3Settings
from common.methods.vera import VeraSettings
from common.run.config import RunConfig
from common.wire.instructions import GramKind, LoraStep
from common.wire.messages import ClientUpdate, ModelSpec, Phase, RoundPlan
from common.wire.tensors import FACTOR, GRAM, HEAD_BIAS, HEAD_GRAM, HEAD_WEIGHT, LORA, VECTOR

F64 = torch.float64


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


class VeRARoundAggregator(RoundAggregator):
    """One VeRA round: the trained vector per layer, from the clients' Gram statistics (already decayed)."""

    def __init__(
        self,
        plan: RoundPlan,
        declared: Shapes,
        spec: ModelSpec,
        config: RunConfig,
        frozen: dict[str, tuple[Tensor, Tensor]],
    ) -> None:
        (active,) = plan.expect(LoraStep).train_factors
        form = config.section(VeraSettings).form
        # the shared vectors as published: the ones the clients trained against and computed with
        vectors = plan.by_layer(VECTOR)
        layers = {
            name: vera_accumulator(active, form, *frozen[name], vectors[name]["B"], vectors[name]["A"])
            for name in spec.layers
        }
        super().__init__(plan, declared, spec, config, layers)


def vera_frozen(spec: ModelSpec, config: RunConfig) -> dict[str, tuple[Tensor, Tensor]]:
    """VeRA's frozen ``B (d_out, r)``, ``A (r, d_in)`` per layer, float64: drawn from the run's seed and the
    layer's name alone (``common.adapters.vera.frozen_matrices``), as every client draws them."""
    rank = config.section(VeraSettings).rank
    frozen = {}
    for name, (d_out, d_in) in spec.layers.items():
        b, a = frozen_matrices(config.seed, name, d_out, d_in, rank)
        frozen[name] = (b.to(F64), a.to(F64))
    return frozen


class IA3RoundAggregator(RoundAggregator):
    """One (IA)^3 round: the vector per layer, from the clients' statistics (already decayed)."""

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, config: RunConfig) -> None:
        step = plan.expect(LoraStep)
        (side,) = step.train_factors
        form, full = config.section(Ia3Settings).form, step.gram == GramKind.FULL
        layers = {name: ia3_accumulator(side, form, d_out, d_in, full) for name, (d_out, d_in) in spec.layers.items()}
        super().__init__(plan, declared, spec, config, layers)


class IA3TaskAggregator(Aggregator):
    """End of task: each layer's statistic summed over clients (the task's weights in the task merge)."""

    PARTS = ("stats",)  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec) -> None:
        super().__init__(plan, declared)
        self.stats = {name: GramSum(declared[f"gram/{name}"][0]) for name in spec.layers}

    def _fold(self, update: ClientUpdate) -> None:
        grams = update.named(GRAM)
        for name, acc in self.stats.items():
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


def lorm(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Aggregator:
    """LoRM's steps: a training round's closed-form merge of the active factor, a task Gram step's Grams."""
    declared = declared_tensors(plan, spec, config)
    if plan.phase == Phase.TRAIN:
        return LoRMRoundAggregator(plan, declared, spec, config)
    return TaskGramAggregator(plan, declared, spec)


def vera(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Aggregator:
    """LoRM with VeRA: a training round's closed-form merge of the trained vector, LoRM's task Gram step."""
    if plan.phase != Phase.TRAIN:
        return lorm(plan, spec, config)
    return VeRARoundAggregator(plan, declared_tensors(plan, spec, config), spec, config, vera_frozen(spec, config))


def ia3(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Aggregator:
    """LoRM with (IA)^3: a training round's closed-form merge of the vector, a task step's summed statistics."""
    declared = declared_tensors(plan, spec, config)
    if plan.phase == Phase.TRAIN:
        return IA3RoundAggregator(plan, declared, spec, config)
    return IA3TaskAggregator(plan, declared, spec)


def fedavg_lora(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Aggregator:
    """FedAvg of the LoRA factors and the head (``fedavg-lora``, ``fedprox``)."""
    return MeanAggregator(plan, declared_tensors(plan, spec, config), spec, config.rank)


def head_only(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Aggregator:
    """The heads' sample-weighted mean (``head-only``)."""
    return HeadMeanAggregator(plan, declared_tensors(plan, spec, config), spec)
