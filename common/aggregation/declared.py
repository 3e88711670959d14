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
F'/K)`` with ``ridge.blocks = K``), CCVR's
``class_moment: (C_t, F, F)`` or ``(C_t, F)``; prompt deltas shaped like the trained components.
"""

from __future__ import annotations

from common.adapters.prompts import trained_shapes
from common.methods import method
from common.methods.ccvr import CcvrSettings
from common.methods.closed_form import NcmSettings, RidgeSettings
from common.run.config import RunConfig
from common.run.settings import SecAggSettings
from common.wire.messages import (
    DenseStep,
    FeaturesStep,
    GramKind,
    LoraStep,
    ModelSpec,
    Phase,
    PromptStep,
    RoundPlan,
    TrainInstruction,
)
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
HOLDOUT = "holdout_"  # prefix of the statistics of the held-out samples (ridge's lambda)


def declared_tensors(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Shapes:
    """Every tensor an update of ``plan`` carries: wire name -> shape. A method's slice declares its own
    (``Method.declare``); the others' follow from their way of training (:func:`trained_tensors`)."""
    own = method(config.strategy).declare
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
    if isinstance(step, DenseStep) and step.send_fisher:  # FisherAvg's rounds, EWC's step at a task's end
        shapes |= fisher_shapes(spec, HEAD_FISHER)
    return shapes


def class_sum_shapes(plan: RoundPlan, spec: ModelSpec) -> Shapes:
    """The task's per-class feature sums ``(C_t, F)`` and counts ``(C_t,)`` (FedProto, PILoRA: their prototypes)."""
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


# ------------------------------------------------------------------ closed-form heads' statistics


def closed_form_settings(config: RunConfig) -> NcmSettings:
    """The run's closed-form head settings (``ridge`` or ``ncm``; a method with neither: NCM's defaults)."""
    own = method(config.strategy).settings
    return config.section(own if own is not None and issubclass(own, NcmSettings) else NcmSettings)


def class_moments(config: RunConfig) -> str:
    """Which per-class second moments a features step sends: ``"full"`` (``class_moment: (C_t, F, F)``,
    the sums of ``x x^T``), ``"diag"`` (``(C_t, F)``, of ``x * x``), or ``""`` (none: the closed-form heads)."""
    own = method(config.strategy).settings
    return config.section(CcvrSettings).covariance if own is CcvrSettings else ""


def holdout_every(config: RunConfig) -> int:
    """``k`` of the held-out rule ``i % k == 0``; 0 holds nothing out (and NCM, which needs no lambda)."""
    settings = closed_form_settings(config)
    return settings.holdout if isinstance(settings, RidgeSettings) else 0


def gram_blocks(config: RunConfig) -> int:
    """``K`` of ``ridge.blocks``: the Gram's diagonal blocks a features step sends (1: the whole Gram)."""
    settings = closed_form_settings(config)
    return settings.blocks if isinstance(settings, RidgeSettings) else 1


def average_rule(config: RunConfig) -> bool:
    """Whether ridge chooses lambda by the ensemble's own held-out error (``RidgeSettings.average_rule``)."""
    settings = closed_form_settings(config)
    secure = config.section(SecAggSettings).enabled
    return isinstance(settings, RidgeSettings) and settings.average_rule(secure)


def holdout_blocks(config: RunConfig) -> int:
    """The blocks of the held-out samples' Gram factor: :func:`gram_blocks`, or 1 (the whole width) when the
    ensemble's own held-out error (:func:`average_rule`) needs the held-out Gram's off-diagonal blocks too."""
    return 1 if average_rule(config) else gram_blocks(config)


def gram_factor_shape(width: int, blocks: int) -> tuple[int, ...]:
    """The Gram factor of ``width`` features: ``(<= F', F')``; with ``K = blocks > 1`` one factor per diagonal
    block of width ``F' / K``, ``(K, <= F'/K, F'/K)``."""
    if blocks == 1:
        return (UpTo(width), width)
    return (blocks, UpTo(width // blocks), width // blocks)


def feature_stat_shapes(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Shapes:
    """A features step's statistics by name: the sums of the task's ``C_t`` classes over ``F'`` features,
    with ``plan.head_gram`` the Gram's factor (with ``ridge.blocks``, its diagonal blocks'), and (ridge,
    ``holdout > 0``) the held-out samples' alike (with :func:`average_rule`, their whole Gram's)."""
    lo, hi = plan.class_range
    width = closed_form_settings(config).head_width(spec.feature_dim)  # F' (K members' side by side)
    shapes: Shapes = {"class_sum": (hi - lo, width), "class_count": (hi - lo,)}
    moments = class_moments(config)
    if moments:  # CCVR's Gaussians
        shapes["class_moment"] = (hi - lo, width, width) if moments == "full" else (hi - lo, width)
    if plan.expect(TrainInstruction).head_gram:
        shapes["gram" + GRAM_FACTOR] = gram_factor_shape(width, gram_blocks(config))
        if holdout_every(config):
            shapes |= {HOLDOUT + name: shape for name, shape in shapes.items()}
            shapes[HOLDOUT + "gram" + GRAM_FACTOR] = gram_factor_shape(width, holdout_blocks(config))
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
