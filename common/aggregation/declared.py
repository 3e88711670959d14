"""The tensors a step's update carries, declared once from the plan: what a client sends and a coordinator expects.

:func:`declared_tensors` reads the plan's instruction (its kind: ``LoraStep``, ``DenseStep``, ``PromptStep``,
``FeaturesStep``; and its fields), its class range and prompt pool, or the method's slice's own
declaration (``Method.declare``), the model's shapes
(:class:`~common.wire.messages.ModelSpec`) and the run's settings, and returns ``wire name ->
shape``. The coordinator validates every update against it (``Aggregator.expected``, then
``common.aggregation.validate``), and a client checks its own update against it before
sending (``ClientWorker.update``, :func:`check_declared_shapes`), so both sides derive the
step's tensors from one place.

Shapes (``C`` classes, ``F`` the head's input, ``r`` the rank): LoRA factors ``B: (d_out, r)``,
``A: (r, d_in)``; Grams ``(d_in,)`` or ``(d_in, d_in)``; head ``(C, F)``, ``(C,)``, its Gram
``(F, F)``; dense deltas and Fisher shaped like their parameters (Fisher also for the head, as
``head.weight``, ``head.bias``); feature statistics of the ``C_t`` classes of the task:
``class_sum: (C_t, F')``, ``class_count: (C_t,)``, ``gram_factor: (<= F', F')`` (``UpTo``; ``(K, <= F'/K,
F'/K)`` in ``K`` diagonal blocks), ``class_moment: (C_t, F', F')`` or ``(C_t, F')``, as the method's settings
describe its features step (:class:`FeatureStats`); prompt deltas shaped like the trained components.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from common.adapters.prompts import trained_shapes
from common.methods import method
from common.run.config import RunConfig
from common.wire.instructions import DenseStep, FeaturesStep, GramKind, LoraStep, PromptStep, TrainInstruction
from common.wire.messages import ModelSpec, Phase, RoundPlan
from common.wire.tensors import (
    DELTA,
    FACTOR,
    FISHER,
    GRAM,
    HEAD_BIAS,
    HEAD_GRAM,
    HEAD_WEIGHT,
    PROMPT,
    STAT,
    UpTo,
    shape_fits,
    tensor_name,
)

Shapes = dict[str, tuple[int, ...]]
HEAD_FISHER = ("head.weight", "head.bias")  # the head's entries of ClientUpdate.fisher
GRAM_FACTOR = "_factor"  # suffix of a statistic's Gram sent as its factor R (R^T R = G)
HOLDOUT = "holdout_"  # prefix of the statistics of the held-out samples (FeatureStats.holdout)
HELD_FIT = "heldfit_"  # prefix of the held-out samples' share of the sums, views included (FeatureStats.views)


def held_share(stats: Mapping[str, object]) -> str:
    """The prefix of the held-out samples' share of the sums (a client's statistics or the step's sums), what the
    fit that chooses lambda leaves out: ``heldfit_`` with dropout views (their views in it), else their own
    statistics, ``holdout_``."""
    return HELD_FIT if HELD_FIT + "class_sum" in stats else HOLDOUT


def declared_tensors(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Shapes:
    """Every tensor an update of ``plan`` carries: wire name -> shape. A method's slice declares its own
    (``Method.declare``); the others' follow from their way of training (:func:`trained_tensors`)."""
    own = method(config.method).declare
    return own(plan, spec, config) if own is not None else trained_tensors(plan, spec, config)


def trained_tensors(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Shapes:
    """What a step of a shared way of training sends, read from its instruction: the trained factors, Grams,
    head and head Gram of a ``LoraStep``, the delta (and Fisher) of a ``DenseStep``, the trained prompt
    components' change of a ``PromptStep``, the feature statistics of a ``FeaturesStep``."""
    step = plan.expect(TrainInstruction)
    if isinstance(step, FeaturesStep):
        return stat_shapes(feature_stat_shapes(plan, spec, config))
    shapes = factor_shapes(spec, config.rank, step.train_factors) if isinstance(step, LoraStep) else {}
    if isinstance(step, DenseStep) and plan.phase == Phase.TRAIN:
        shapes |= delta_shapes(spec)
    if isinstance(step, PromptStep) and plan.phase == Phase.TRAIN:  # the trained prompt components' change
        pool = {name: tuple(t.shape) for name, t in plan.named(PROMPT).items()}
        shapes |= {tensor_name(DELTA, name): shape for name, shape in trained_shapes(pool, step.prompt_frozen).items()}
    if step.gram != GramKind.NONE:
        shapes |= gram_shapes(spec, full=step.gram == GramKind.FULL)
    shapes |= step_head_shapes(step, spec)
    if isinstance(step, DenseStep) and step.send_fisher:  # a merge or a penalty weighted by the Fisher
        shapes |= fisher_shapes(spec, HEAD_FISHER)
    return shapes


def class_sum_shapes(plan: RoundPlan, spec: ModelSpec) -> Shapes:
    """The task's per-class feature sums ``(C_t, F)`` and counts ``(C_t,)`` (prototypes, in a slice's declaration)."""
    lo, hi = plan.class_range
    return {"class_sum": (hi - lo, spec.feature_dim), "class_count": (hi - lo,)}


def check_declared_shapes(got: dict[str, tuple[int, ...]], declared: Shapes, who: str) -> None:
    """``ValueError`` unless ``got`` (wire name -> shape) is exactly the declared tensors, shapes fitting."""
    missing, unexpected = sorted(set(declared) - set(got)), sorted(set(got) - set(declared))
    wrong = sorted(n for n in set(got) & set(declared) if not shape_fits(got[n], declared[n]))
    if missing or unexpected or wrong:
        raise ValueError(
            f"{who}: the step declares {len(declared)} tensors; missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}, shapes {[(n, got[n], declared[n]) for n in wrong[:3]]}"
        )


# ------------------------------------------------------------------ a features step's statistics


@dataclass(frozen=True)
class FeatureMap:
    """How a features step turns a sample into the head's ``F'`` features: the backbone's own ``(F,)``, or its
    hidden states ``layers`` (indexed as the backbone's: 0 the embeddings, -1 the last), each pooled by ``pool``
    and normalised per sample by ``norm``, side by side; with ``prior = k > 0`` a public prior's ``(x - m) W`` (its
    tensors in the plan, ``common/privacy/public_prior.py``); then, with ``rp_dim = F' > 0``, ``activation`` of a
    seeded random projection (``client/features.py``), each sample's result clipped to L2 norm ``clip`` (differential
    privacy's bound on one record's contribution, ``common/privacy/``; with ``clip_blocks = K`` each of its ``K``
    blocks to ``clip / sqrt(K)``, which bounds the whole by ``clip`` and a block Gram's part by ``clip^2 /
    sqrt(K)``). The defaults: the backbone's own features."""

    rp_dim: int = 0  # F', every row of the random projection (0: none, F' = F)
    activation: str = "relu"  # of each projected feature: "relu", "gelu", "tanh" or "none"
    layers: tuple[int, ...] = ()  # the hidden states pooled (empty: the backbone's own features)
    pool: str = "mean"  # each hidden state's "mean" over the tokens kept, or its "first" token
    norm: str = "none"  # "layer": each pooled vector to mean 0 and deviation 1 over its dimensions
    clip: float = 0.0  # C > 0: each sample's F' features scaled down to L2 norm at most C (dp.clip); 0: none
    clip_blocks: int = 1  # K > 1: each of the K equal blocks of the F' features clipped to C / sqrt(K) instead
    prior: int = 0  # k > 0: a public prior's (x - m) W takes the F features to k before the projection (0: none)
    prior_digest: str = ""  # with prior: the SHA-256 of its tensors, which the plan's must have

    def feature_width(self, hidden: int) -> int:
        """``F``: the features before the projection, for hidden states of width ``hidden``."""
        return hidden * len(self.layers) if self.layers else hidden

    def projected_width(self, hidden: int) -> int:
        """What the projection (or the head, without one) reads: the public prior's ``k``, else ``F``."""
        return self.prior or self.feature_width(hidden)

    def head_width(self, hidden: int) -> int:
        """``F'``: the head's input width."""
        return self.rp_dim or self.projected_width(hidden)


@dataclass(frozen=True)
class FeatureStats:
    """What a features step (``FeaturesStep``) computes and sends, as its method's settings describe it
    (:class:`DescribesFeatureStats`): the per-class sums and counts of the task's samples over the ``F'``
    features of ``features``; with the step's ``head_gram`` their Gram's factor (in ``blocks`` diagonal blocks),
    and with ``holdout`` the held-out samples' alike; the per-class second ``moments``. With ``views`` every
    sample's clean features and its dropout views enter the sums at weight ``1 / (1 + views)`` each (its share of
    a class sum is their mean, of the Gram the mean of their outer products), and with ``holdout`` the held-out
    samples' share of the sums comes too (``heldfit_*``): the fit that chooses lambda leaves it out, while the
    held-out statistics (``holdout_*``) hold their clean features only."""

    features: FeatureMap = field(default_factory=FeatureMap)
    blocks: int = 1  # K: the factors of the Gram's K diagonal blocks, each F'/K wide (1: the whole Gram)
    holdout: int = 0  # k of the held-out rule i % k == 0 on global training indices (0: none held out)
    average_rule: bool = False  # the held-out Gram factor whole (lambda by the ensemble's own held-out error)
    moments: str = ""  # "full": the sums of x x^T (C_t, F', F'); "diag": of x * x (C_t, F'); "": none
    views: int = 0  # V dropout views per sample beside its clean features, each of the 1 + V at weight 1 / (1 + V)

    @property
    def rows_per_sample(self) -> int:
        """The feature rows a sample puts into the Gram's factor: its clean features and its :attr:`views`."""
        return 1 + self.views

    @property
    def holdout_blocks(self) -> int:
        """The blocks of the held-out samples' Gram factor: :attr:`blocks`, or 1 (the whole width) with
        :attr:`average_rule`."""
        return 1 if self.average_rule else self.blocks


@runtime_checkable
class DescribesFeatureStats(Protocol):
    """The settings of a method with a features step (its slice's ``Method.settings``): what that step computes
    and sends, by the run's configuration."""

    def feature_stats(self, config: RunConfig) -> FeatureStats: ...


def feature_stats_of(config: RunConfig) -> FeatureStats:
    """What the run's features step computes and sends, as its method's settings describe it
    (:class:`DescribesFeatureStats`); settings that describe none: the class sums and counts of the backbone's
    own features."""
    own = method(config.method).settings
    settings = config.section(own) if own is not None else None
    return settings.feature_stats(config) if isinstance(settings, DescribesFeatureStats) else FeatureStats()


def gram_factor_shape(width: int, blocks: int) -> tuple[int, ...]:
    """The Gram factor of ``width`` features: ``(<= F', F')``; with ``K = blocks > 1`` one factor per diagonal
    block of width ``F' / K``, ``(K, <= F'/K, F'/K)``."""
    if blocks == 1:
        return (UpTo(width), width)
    return (blocks, UpTo(width // blocks), width // blocks)


def feature_stat_shapes(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Shapes:
    """A features step's statistics by name (:func:`feature_stats_of`): the sums of the task's ``C_t`` classes
    over ``F'`` features and their second moments if asked, with ``plan.head_gram`` the Gram's factor (its
    diagonal blocks'), and with a held-out rule the held-out samples' alike (by the average rule, their whole
    Gram's)."""
    lo, hi = plan.class_range
    stats = feature_stats_of(config)
    width = stats.features.head_width(spec.feature_dim)  # F'
    shapes: Shapes = {"class_sum": (hi - lo, width), "class_count": (hi - lo,)}
    if stats.moments:
        shapes["class_moment"] = (hi - lo, width, width) if stats.moments == "full" else (hi - lo, width)
    if plan.expect(TrainInstruction).head_gram:
        shapes["gram" + GRAM_FACTOR] = gram_factor_shape(width, stats.blocks)
        if stats.holdout:
            shapes |= {HOLDOUT + name: shape for name, shape in shapes.items()}
            shapes[HOLDOUT + "gram" + GRAM_FACTOR] = gram_factor_shape(width, stats.holdout_blocks)
            if stats.views:  # the held-out samples' share of the sums, their views in it
                shapes |= {
                    HELD_FIT + n: shapes[HOLDOUT + n] for n in ("class_sum", "class_count", "gram" + GRAM_FACTOR)
                }
    return shapes


# ------------------------------------------------------------------ shapes by kind


def factor_shapes(spec: ModelSpec, rank: int, parts: tuple[str, ...] | list[str]) -> Shapes:
    """LoRA factors per layer: ``B: (d_out, r)``, ``A: (r, d_in)``."""
    return {
        tensor_name(FACTOR, name, p): ((d_out, rank) if p == "B" else (rank, d_in))
        for name, (d_out, d_in) in spec.layers.items()
        for p in parts
    }


def gram_shapes(spec: ModelSpec, full: bool) -> Shapes:
    """A Gram per LoRA layer: ``(d_in, d_in)`` when ``full``, else its diagonal ``(d_in,)``."""
    return {tensor_name(GRAM, name): ((d_in, d_in) if full else (d_in,)) for name, (_, d_in) in spec.layers.items()}


def head_shapes(spec: ModelSpec) -> Shapes:
    """The head: weight ``(C, F)`` and bias ``(C,)``."""
    return {HEAD_WEIGHT: (spec.num_classes, spec.feature_dim), HEAD_BIAS: (spec.num_classes,)}


def head_gram_shape(spec: ModelSpec) -> Shapes:
    """The full Gram ``(F, F)`` of the head's input."""
    return {HEAD_GRAM: (spec.feature_dim, spec.feature_dim)}


def step_head_shapes(step: TrainInstruction, spec: ModelSpec) -> Shapes:
    """What a trained step sends of the head: weight and bias with ``send_head``, the Gram of its input with
    ``head_gram``."""
    return (head_shapes(spec) if step.send_head else {}) | (head_gram_shape(spec) if step.head_gram else {})


def delta_shapes(spec: ModelSpec) -> Shapes:
    """A delta per backbone parameter, shaped like it."""
    return {tensor_name(DELTA, name): tuple(shape) for name, shape in spec.params.items()}


def fisher_shapes(spec: ModelSpec, head: tuple[str, str]) -> Shapes:
    """A diagonal Fisher per backbone parameter, and for the head under the names ``head``."""
    shapes = dict(spec.params) | {head[0]: (spec.num_classes, spec.feature_dim), head[1]: (spec.num_classes,)}
    return {tensor_name(FISHER, name): tuple(shape) for name, shape in shapes.items()}


def stat_shapes(shapes: Shapes) -> Shapes:
    """Feature statistics ``name -> shape`` under their wire names."""
    return {tensor_name(STAT, name): tuple(shape) for name, shape in shapes.items()}
