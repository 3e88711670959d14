"""Frozen-feature statistics for closed-form heads (a ``FeaturesStep``).

A client does no training in this mode. It runs the backbone in the plan's view
(``W0 + delta + extra``, eval mode, no gradients; the backbone's masked mean pooling leaves padding
out) over the current task's shard and sends sums that add up over clients and tasks, so a
head solved from them is the same for every split of the data:

- ``class_sum: (C_t, F')``, the per-class feature sums, i.e. ``(X^T Y)^T`` with ``Y: (n, C_t)``
  one-hot over the current task's ``C_t`` classes ``[lo, hi)`` (the only ones its data has), and
  ``class_count: (C_t,)``;
- with ``FeatureStats.moments`` (CCVR's): ``class_moment``, the per-class sums of ``x x^T`` ``(C_t, F', F')``,
  or of ``x * x`` ``(C_t, F')`` with ``ccvr.covariance=diag``;
- with ``FeaturesStep.head_gram``: the Gram ``X^T X`` as its factor ``gram_factor: (min(n, F'), F')``
  with ``R^T R = X^T X`` (``common.merges.grams.gram_factor``: n F' numbers instead of F'^2; with the setting
  ``ridge.blocks = K``, ``(K, min(n, F'/K), F'/K)``, the factors of the Gram's K diagonal blocks, all an
  ensemble of K ridge heads on the K projections needs); and,
  when the setting ``ridge.holdout = k > 0`` (default 5), the same three statistics of the
  held-out samples, those whose *global* training index ``i`` has ``i % k == 0``, as
  ``holdout_class_sum``, ``holdout_class_count`` and ``holdout_gram_factor`` (with ``ridge.lambda_rule =
  'average'`` the whole width's factor ``(min(n_held, F'), F')``, not the blocks'). A global rule makes the union
  of the clients' held-out samples the same set for every Dirichlet split;
- with the setting ``ridge.views = V > 0`` (``FeatureStats.views``): ``V`` dropout views of every sample (the
  backbone's dropout on, :func:`dropout_on`, seeded per view and shard, :func:`view_seed`) beside its clean
  features, each of its ``1 + V`` rows at weight ``1 / (1 + V)`` in the class sums and the Gram (:func:`sums`); the
  held-out statistics stay clean, and their samples' share of the sums, views included, comes as
  ``heldfit_class_sum``, ``heldfit_class_count`` and ``heldfit_gram_factor``, which the fit that chooses lambda
  leaves out. The views depend on the draws, so the head is the same for every split only without them.

``X: (n, F')`` are the backbone features ``(n, F)`` (with the setting ``layers``: the pooled hidden
states of those layers side by side, ``F = len(layers) d``, each optionally normalised per sample,
:func:`backbone_features`), or with the setting ``rp_dim = F' > 0``
the random features ``f(X P^T)`` (``f`` the setting ``activation``, ``max(0, .)`` by default) with
``P: (F', F)``, ``N(0, 1)`` entries seeded by
``config.seed`` alone (every client and every evaluation draws the same ``P``); in a run with a privacy budget each
sample's ``F'`` features are then scaled down to L2 norm ``dp.clip`` (``FeatureMap.clip``, ``common/privacy/``),
so one record's share of every sum is bounded. Statistics are float64.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch
from torch import Tensor

from client.classifier import ClassifierModel
from client.plans import PlanRefused
from common.aggregation.declared import GRAM_FACTOR, HELD_FIT, HOLDOUT, FeatureMap, feature_stats_of
from common.aggregation.projection import draw
from common.merges.grams import block_gram_factor, gram_factor
from common.privacy.gaussian import clip_blocks
from common.privacy.public_prior import PublicPrior, received_prior
from common.run.config import RunConfig
from common.wire.messages import RoundPlan
from common.wire.tensors import HEAD_BIAS, HEAD_WEIGHT

FEATURE_BATCH = 64  # no gradients: larger batches than training, same features


class Batches(Protocol):
    """The part of ``client.worker.SampleData`` used here."""

    labels: Tensor

    def batch(self, idx: Tensor, device: torch.device) -> tuple[dict[str, Tensor], Tensor]: ...


def backbone_features(model: ClassifierModel, inputs: dict[str, Tensor], settings: FeatureMap | None) -> Tensor:
    """The head's features before the projection, ``(batch, F)``: the backbone's own (no ``settings``, or
    ``layers`` empty), or its pooled hidden states ``layers`` side by side, each scaled to mean 0 and
    deviation 1 over its dimensions with ``norm=layer``."""
    if settings is None or not settings.layers:
        _, features = model(inputs)
        return features
    states = model.backbone.layer_states(settings.layers, settings.pool, **inputs)  # (batch, layers, d)
    return (normalise_layers(states) if settings.norm == "layer" else states).flatten(1)


def normalise_layers(states: Tensor) -> Tensor:
    """``norm=layer``: each pooled vector ``states[..., :]`` to mean 0 and deviation 1 over its dimensions."""
    return torch.nn.functional.layer_norm(states, states.shape[-1:], eps=torch.finfo(states.dtype).eps)


def plan_prior(plan: RoundPlan | None, config: RunConfig, hidden: int) -> PublicPrior | None:
    """The public prior of a run whose features step names one (``ncm.prior_digest``, ``prior_k``): the plan's, once
    it is the run's (``common.privacy.public_prior.received_prior``: shapes and digest; ``PlanRefused`` otherwise);
    ``None`` in a run without one (whatever the plan holds: nothing of it is applied)."""
    mapped = feature_stats_of(config).features
    if not mapped.prior:
        return None
    tensors = plan.tensors if plan is not None else {}
    try:
        return received_prior(tensors, mapped.feature_width(hidden), mapped.prior, mapped.prior_digest)
    except ValueError as err:
        raise PlanRefused(str(err)) from err


def random_projection(config: RunConfig, d_in: int) -> Tensor | None:
    """The seeded ``P: (F', F)``, float64 (``common.aggregation.projection``), or ``None`` without ``rp_dim``: the
    run's features step's (``FeatureMap.rp_dim``; with ``ridge.blocks = K`` the ``K`` members' projections of
    ``ridge.rp_dim`` rows each, side by side, the rows of one ``P``)."""
    dim = feature_stats_of(config).features.rp_dim
    return draw(config.seed, dim, d_in) if dim else None


# The function of each setting ``activation`` (its names: ``common.methods.closed_form.ACTIVATIONS``).
ACTIVATION_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "tanh": torch.tanh,
    "none": lambda z: z,
}


def feature_map(
    features: Tensor,
    projection: Tensor | None,
    activation: str = "relu",
    clip: float = 0.0,
    blocks: int = 1,
    prior: PublicPrior | None = None,
) -> Tensor:
    """``(n, F)`` backbone features -> ``(n, F')`` float64: with a public ``prior`` first ``(X - m) W`` (``(n, k)``),
    then ``f(X P^T)`` with ``f`` the setting ``activation`` (``max(0, .)`` by default), or ``X`` itself without a
    projection; with ``clip = C > 0`` each row scaled down to L2 norm at most ``C`` (``dp.clip``: what enters the
    statistics is what the privacy's sensitivity bounds), and with ``blocks = K > 1`` each of a row's ``K`` equal
    blocks to ``C / sqrt(K)`` (``FeatureMap.clip_blocks``)."""
    x = features.detach().to(torch.float64).cpu()
    if prior is not None:
        x = prior.apply(x)
    mapped = x if projection is None else ACTIVATION_FUNCTIONS[activation](x @ projection.T)
    return clip_blocks(mapped, clip, blocks) if clip > 0 else mapped


@torch.no_grad()
def extract(
    model: ClassifierModel,
    data: Batches,
    idx: Tensor,
    device: torch.device,
    settings: FeatureMap | None = None,
    dropout_seed: int | None = None,
) -> Tensor:
    """The head's features ``(n, F)`` of the samples ``idx`` (:func:`backbone_features`), in the model's
    current view, float64; with ``dropout_seed`` a dropout view of them (:func:`dropout_on`)."""
    model.eval()
    out = []
    with dropout_on(model.backbone, dropout_seed, device) if dropout_seed is not None else contextlib.nullcontext():
        for start in range(0, idx.numel(), FEATURE_BATCH):
            inputs, _ = data.batch(idx[start : start + FEATURE_BATCH], device)
            out.append(backbone_features(model, inputs, settings).to(torch.float64).cpu())  # (batch, F)
    width = settings.feature_width(model.head.in_features) if settings else model.head.in_features
    return torch.cat(out) if out else torch.zeros(0, width, dtype=torch.float64)


@contextlib.contextmanager
def dropout_on(backbone: torch.nn.Module, seed: int, device: torch.device) -> Iterator[None]:
    """The backbone in training mode (its dropout on; batch norm's statistics left as they are, in eval mode)
    with the random generators seeded by ``seed``, and as it was afterwards, the generators too: a dropout view
    (``ridge.views``). ``ValueError`` for a backbone without dropout, whose views would be its clean features."""
    if not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in backbone.modules()):
        raise ValueError(
            f"ridge.views: the backbone ({type(backbone).__name__}) has no dropout, so its views would be its "
            "clean features"
        )
    modes = {m: m.training for m in backbone.modules()}
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        backbone.train()
        for m in backbone.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.eval()
        try:
            yield
        finally:
            for m, training in modes.items():
                m.training = training  # each module's own flag (train() would set its children's too)


def view_seed(config: RunConfig, view: int, shard: Tensor) -> int:
    """The seed of dropout view ``view`` (0-based) of ``shard``: the run's seed, the view and the shard's first
    global training index (clients and tasks draw apart)."""
    first = int(shard[0]) if shard.numel() else 0
    return (config.seed * 1_000_003 + 7919 * (view + 1) + first) % (2**63 - 1)


def sums(
    x: Tensor,
    labels: Tensor,
    classes: tuple[int, int],
    gram: bool,
    moments: str = "",
    blocks: int = 1,
    views: Sequence[Tensor] = (),
) -> dict[str, Tensor]:
    """``class_sum: (C_t, F') = (X^T Y)^T``, ``class_count: (C_t,)`` over the classes ``[lo, hi)``,
    optionally ``gram_factor`` with ``R^T R = X^T X`` (``blocks = K > 1``: the factors ``(K, m, F'/K)`` of the
    Gram's ``K`` diagonal blocks only), and with ``moments`` ("full" or "diag": ``FeatureStats.moments``)
    ``class_moment``, the per-class sums of ``x x^T`` or of ``x * x``. ``views``: ``V`` more ``(n, F')`` rows of
    the same samples (dropout views): each of a sample's ``1 + V`` rows at weight ``1 / (1 + V)`` (its share of
    ``S`` their mean, of ``X^T X`` the mean of their outer products: the factor's rows are all ``(1 + V) n`` rows
    over ``sqrt(1 + V)``), the counts the samples'."""
    lo, hi = classes
    if labels.numel() and not (lo <= int(labels.min()) and int(labels.max()) < hi):
        raise ValueError(
            f"features step of classes [{lo}, {hi}): the shard has labels {int(labels.min())}..{int(labels.max())}"
        )
    if views and moments:
        raise ValueError("dropout views enter the class sums and the Gram only, not per-class moments")
    one_hot = torch.nn.functional.one_hot(labels - lo, hi - lo).to(torch.float64)  # (n, C_t)
    rows = torch.cat([x, *views]) / math.sqrt(1 + len(views)) if views else x  # ((1 + V) n, F')
    out = {"class_sum": one_hot.T @ (torch.stack([x, *views]).mean(0) if views else x), "class_count": one_hot.sum(0)}
    if gram:
        out["gram" + GRAM_FACTOR] = gram_factor(rows) if blocks == 1 else block_gram_factor(rows, blocks)
    if moments:
        out["class_moment"] = torch.einsum("nc,nf,ng->cfg", one_hot, x, x) if moments == "full" else one_hot.T @ (x * x)
    return out


def feature_stats(
    model: ClassifierModel,
    data: Batches,
    shard: Tensor,
    config: RunConfig,
    device: torch.device,
    classes: tuple[int, int],
    gram: bool,
    plan: RoundPlan | None = None,
) -> dict[str, Tensor]:
    """The statistics of ``shard`` (global training indices, of the classes ``[lo, hi)``) sent in a features step,
    as the run's method describes them (``common.aggregation.declared.feature_stats_of``); ``plan`` the step's,
    which brings the public prior of a run that names one (:func:`plan_prior`)."""
    wanted = feature_stats_of(config)
    mapped = wanted.features
    prior = plan_prior(plan, config, model.head.in_features)

    def mapped_features(dropout_seed: int | None) -> Tensor:  # (n, F')
        features = extract(model, data, shard, device, mapped, dropout_seed)  # (n, F)
        projection = random_projection(config, mapped.projected_width(model.head.in_features))
        return feature_map(features, projection, mapped.activation, mapped.clip, mapped.clip_blocks, prior)

    x = mapped_features(None)
    views = [mapped_features(view_seed(config, v, shard)) for v in range(wanted.views)] if gram else []
    labels = data.labels[shard]
    stats = sums(x, labels, classes, gram, wanted.moments, wanted.blocks, views)
    if gram and wanted.holdout:
        held = shard % wanted.holdout == 0
        held_stats = sums(x[held], labels[held], classes, gram, blocks=wanted.holdout_blocks)
        stats |= {HOLDOUT + name: t for name, t in held_stats.items()}
        if views:  # the held-out samples' share of the sums above, which the fit that chooses lambda leaves out
            share = sums(
                x[held], labels[held], classes, gram, blocks=wanted.holdout_blocks, views=[v[held] for v in views]
            )
            stats |= {HELD_FIT + name: t for name, t in share.items()}
    return stats


def class_sums(
    model: ClassifierModel, data: Batches, shard: Tensor, device: torch.device, classes: tuple[int, int]
) -> dict[str, Tensor]:
    """``class_sum`` and ``class_count`` of the model's features (as it is now, eval mode) over ``shard``:
    what FedProto and PILoRA send after training, for their prototypes."""
    return sums(extract(model, data, shard, device), data.labels[shard], classes, gram=False)


def feature_logits(model: ClassifierModel, inputs: dict[str, Tensor], plan: RoundPlan, config: RunConfig) -> Tensor:
    """Scores ``(batch, C)`` of the plan's head ``(C, F')`` on the mapped features (evaluation)."""
    mapped = feature_stats_of(config).features
    prior = plan_prior(plan, config, model.head.in_features)
    features = backbone_features(model, inputs, mapped)  # (batch, F)
    projection = random_projection(config, mapped.projected_width(model.head.in_features))
    x = feature_map(features, projection, mapped.activation, mapped.clip, mapped.clip_blocks, prior)  # (b, F')
    weight, bias = plan.get(HEAD_WEIGHT), plan.get(HEAD_BIAS)
    assert weight is not None and bias is not None
    logits = x @ weight.to(torch.float64).T + bias.to(torch.float64)
    return logits.to(features.device)
