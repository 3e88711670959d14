"""The feature-statistics steps' aggregators: the clients' sums of their frozen features, summed.

A features step (``FeaturesStep``: no training) sends per-class sums and counts of the current task's
classes and, where the solve needs it, the Gram of the features as its factor ``R`` (``R^T R = X^T X``;
wire suffix ``_factor``), and CCVR's per-class second moments. Sums do not care how the samples were
split, so the coordinator's sums are the centralised ones. Shapes: ``C`` classes, ``C_t`` of the task,
``F'`` the head's input width (``FeatureMap.head_width``), all as the method's settings describe its features
step (``common.aggregation.declared.feature_stats_of``).

Factories (``Method.aggregator``): :func:`ncm`, :func:`ridge` (the closed-form heads on ``W0``),
:func:`lorm_ncm` and :func:`lorm_ridge` (``lorm-ridge``, ``lorm-ridge-first``: LoRM's steps, then the closed-form
head's features step), and :func:`ccvr` (FedAvg, then its features step).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from common.aggregation.base import Aggregator, Phased
from common.aggregation.declared import GRAM_FACTOR as FACTOR  # clients send a Gram as R: R^T R = G
from common.aggregation.declared import (
    HELD_FIT,
    HOLDOUT,
    Shapes,
    declared_tensors,
    feature_stat_shapes,
    feature_stats_of,
    held_share,
)
from common.aggregation.dense import fedavg
from common.aggregation.lora import lorm
from common.aggregation.validate import UpdateRejected
from common.merges.grams import BlockGramSum, GramRows, GramSum
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, ModelSpec, Phase, RoundPlan
from common.wire.tensors import STAT

DTYPE = torch.float64


def check_sums_fit_gram(field: str, class_sum: Tensor, count: Tensor, factor: Tensor) -> None:
    """Class sums ``S: (C, F')`` and counts ``n: (C,)`` that the Gram ``G = R^T R = X^T X`` can have come with
    (``factor``: ``R``, or the diagonal blocks' ``(K, r, F'/K)``).

    By Cauchy-Schwarz, for every direction ``u``, ``(u^T S_c)^2 <= n_c sum_{i in c} (u^T x_i)^2``, so
    ``M^T M = sum_c S_c S_c^T / n_c <= G`` in the order of positive semi-definite matrices (``M`` the rows
    ``S_c / sqrt(n_c)``, classes with ``n_c > 0``; with dropout views a sample's features are the mean of rows whose
    weighted Gram is at least their mean's, by Jensen: the same bound). First its trace, ``sum_c |S_c|^2 / n_c <=
    tr(G) = |R|_F^2`` (``1e-6`` relative slack for float64's rounding), then the whole order on each block
    (:func:`check_share_within_gram`): sums within the trace but turned where the Gram holds little, which would
    put the head's weight where the client's samples have none, no features give.
    """
    seen = count > 0
    lhs = float((class_sum[seen].to(DTYPE).pow(2).sum(1) / count[seen].to(DTYPE)).sum())
    trace = float(factor.to(DTYPE).pow(2).sum())
    if lhs > trace * (1 + 1e-6) + 1e-12:
        raise UpdateRejected(
            field,
            f"inconsistent with the Gram: sum_c |S_c|^2 / n_c = {lhs:.6g} exceeds "
            f"trace(G) = {trace:.6g}, which no set of features allows",
        )
    means = class_sum[seen].to(DTYPE) / count[seen].to(DTYPE).sqrt().unsqueeze(1)
    what = "inconsistent with the Gram: sum_c S_c S_c^T / n_c exceeds the Gram"
    check_share_within_gram(field, factor, means, what, "no set of features allows it (Cauchy-Schwarz)")


def check_moments_above_means(field: str, class_sum: Tensor, count: Tensor, moment: Tensor) -> None:
    """Per-class second moments ``M_c = sum_{i in c} x_i x_i^T`` (``(C, F', F')``, or their diagonals ``(C, F')``)
    at least what the class sums imply, ``S_c S_c^T / n_c`` (Cauchy-Schwarz; their difference is ``n_c - 1`` times
    the class's covariance), up to ``32 (n_c + F') eps tr(M_c)`` for float64's rounding: below it, the covariance
    CCVR samples its virtual features from would be negative, which no samples give (full: no Cholesky factor at
    any shift, and the merge fails; diagonal: clamped to zero). ``UpdateRejected`` naming the first such class."""
    eps = torch.finfo(DTYPE).eps
    width = class_sum.shape[-1]
    for c in torch.nonzero(count > 0).flatten().tolist():
        n, s, m = float(count[c]), class_sum[c].to(DTYPE), moment[c].to(DTYPE)
        slack = 32 * (n + width) * eps * float(m.diagonal().sum() if m.dim() == 2 else m.sum())
        if m.dim() == 2:
            diff = m - torch.outer(s, s) / n + slack * torch.eye(width, dtype=DTYPE)
            below = int(torch.linalg.cholesky_ex(0.5 * (diff + diff.T)).info) != 0
        else:
            below = bool((m - s * s / n < -slack).any())
        if below:
            raise UpdateRejected(
                field,
                f"class {c}'s second moments are below what its sum implies (S S^T / n): its covariance would be "
                "negative, which no samples give",
            )


KEPT_PSD = "their difference, the Gram of the samples the lambda fit keeps, must be positive semi-definite"


def check_share_within_gram(
    field: str,
    total: Tensor,
    share: Tensor,
    what: str = "the held-out samples' Gram exceeds the client's whole Gram",
    why: str = KEPT_PSD,
) -> None:
    """``UpdateRejected`` unless the held-out samples' share of the Gram, ``S^T S``, is at most the client's whole
    Gram ``R^T R`` in the order of positive semi-definite matrices, on each diagonal block the whole one comes in
    (``total``: ``(r, F')`` or the blocks' ``(K, r, F'/K)``; ``share``: the same blocks, or whole ``(s, F')``).
    Their difference is the Gram of the samples that the fit choosing lambda keeps: an honest client's is positive
    semi-definite, and one made indefinite would steer that fit (and so the run's lambda) with no sample behind it.
    ``what`` and ``why`` word the refusal (the same test bounds the held-out samples' clean Gram by their share's,
    :meth:`FeatureStatsAggregator._check`).

    Each block's least eigenvalue of ``D = R^T R - S^T S`` must be at least ``-tol tr(R^T R)``, ``tol`` float64's
    rounding over the rows and the width (the clients' factors and this test): with ``m = r + s`` rows below the
    width ``d``, ``D = W^T J W`` (``W = [R; S]``, ``J = diag(I_r, -I_s)``) has the nonzero eigenvalues of
    ``T J T^T``, ``T`` the triangle of ``W^T = Q T`` (``2 d m^2`` operations); with as many rows as the width or
    more, ``D + tol tr(R^T R) I`` must have a Cholesky factor (``m d^2 + d^3 / 3``).
    """
    eps = torch.finfo(DTYPE).eps
    blocks = total.to(DTYPE) if total.dim() == 3 else total.to(DTYPE).unsqueeze(0)
    width = blocks.shape[-1]
    held = share.to(DTYPE)
    for k, r in enumerate(blocks):
        s = held[k] if held.dim() == 3 else held[:, k * width : (k + 1) * width]
        if s.shape[0] == 0:
            continue
        m = r.shape[0] + s.shape[0]
        slack = 32 * (m + width) * eps * float(r.pow(2).sum())
        if m < width:
            t = torch.linalg.qr(torch.cat([r, s]).T, mode="r").R  # (m, m): W^T = Q T
            tr, ts = t[:, : r.shape[0]], t[:, r.shape[0] :]
            least = float(torch.linalg.eigvalsh(tr @ tr.T - ts @ ts.T)[0])
            shown, fits = f" (its least eigenvalue {least:.6g}, against a slack of {slack:.3g})", least >= -slack
        else:
            diff = r.T @ r - s.T @ s + slack * torch.eye(width, dtype=DTYPE)
            shown, fits = "", bool(torch.linalg.cholesky_ex(diff).info == 0)
        if not fits:
            where = f" in diagonal block {k}" if len(blocks) > 1 else ""
            raise UpdateRejected(
                field,
                f"{what}{where}: {why}{shown}",
            )


# ----------------------------------------------------------------------------- running sums


class StatSums:
    """Running sums of named statistics ``name -> shape``: Grams (``*gram``) in :class:`GramSum` (shape
    ``(F', F')``), their diagonal blocks in :class:`BlockGramSum` (``(K, d, d)``), or their factor's rows in
    :class:`GramRows` (``(F',)``: :meth:`value` gives it as ``name + FACTOR``)."""

    SUMS = ("plain",)  # running sums (common/merges/sums.py)
    PARTS = ("grams",)

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.shapes = shapes
        self.grams: dict[str, GramSum | BlockGramSum | GramRows] = {
            n: GramRows(s[0]) if len(s) == 1 else GramSum(s[0]) if len(s) == 2 else BlockGramSum(s[0], s[1])
            for n, s in shapes.items()
            if n.endswith("gram")
        }
        self.plain = {n: torch.zeros(s, dtype=DTYPE) for n, s in shapes.items() if not n.endswith("gram")}
        self.count = 0

    def fold(self, stats: dict[str, Tensor], rows: slice = slice(None)) -> None:
        """Add ``stats``; a Gram may come as itself or as its factor (``name + FACTOR``), and the
        per-class sums may be the rows ``rows`` of the sums only (the rest being zero)."""
        for name, acc in self.grams.items():
            if name in stats:
                acc.fold(stats[name])
            else:
                acc.fold_factor(stats[name + FACTOR])
        for name in self.plain:
            self.plain[name][rows] += stats[name].to(DTYPE)
        self.count += 1

    def value(self) -> dict[str, Tensor]:
        grams = {name + (FACTOR if isinstance(acc, GramRows) else ""): acc.value() for name, acc in self.grams.items()}
        return self.plain | grams

    def absorb(self, other: StatSums) -> None:
        """``fold(other.value())``, then empty ``other``'s Grams: a Gram this holds none of yet is taken over,
        not copied (a step's Grams are gigabytes at ``F' = 10,000``, 6.4 GB with ``ridge.blocks = 4`` and the
        held-out ones: held once, not twice). The same sums, bit for bit, as ``fold``."""
        for name, acc in self.grams.items():
            theirs = other.grams[name]
            if acc.total is None:
                acc.total, acc.count = theirs.value(), acc.count + 1
            elif isinstance(acc, GramRows):
                acc.fold_factor(theirs.value())
            else:
                acc.fold(theirs.value())
            theirs.total = None
        for name, total in self.plain.items():
            total += other.plain[name]
        self.count += 1


def check_class_counts(update: ClientUpdate) -> None:
    """``UpdateRejected`` unless the update's class counts sum to its ``num_samples`` and a class with
    no samples has a zero sum (every method that sends ``class_count`` and ``class_sum``)."""
    stats = update.named(STAT)
    counts, class_sum = stats["class_count"], stats["class_sum"]
    if float(counts.sum()) != update.num_samples:
        raise UpdateRejected(
            "stat/class_count",
            f"expected the counts of the task's classes to sum to num_samples={update.num_samples}; "
            f"got {float(counts.sum())}",
        )
    if bool((class_sum[counts == 0] != 0).any()):
        raise UpdateRejected("stat/class_sum", "a class with no samples must have a zero sum")


def check_clipped(field: str, class_sum: Tensor, count: Tensor, factor: Tensor | None, clip: float) -> None:
    """``UpdateRejected`` unless the statistics can come from features clipped to norm ``clip`` (``dp.clip``): each
    class sum ``|S_c| <= n_c C`` and, with the Gram's factor, ``tr(G) = |R|_F^2 = sum_i |x_i|^2 <= n C^2``
    (``1e-9`` relative slack). A client that skips the clip voids the privacy of its own records; this stops it
    from passing for one that clipped."""
    limit = count.to(DTYPE) * clip * (1 + 1e-9)
    norms = class_sum.to(DTYPE).norm(dim=-1)
    if bool((norms > limit).any()):
        worst = int((norms - limit).argmax())
        raise UpdateRejected(
            f"{field}class_sum",
            f"not from features clipped to dp.clip = {clip:g}: class {worst}'s sum has norm {float(norms[worst]):.6g} "
            f"over its {int(count[worst])} samples x {clip:g}",
        )
    if factor is not None:
        trace, bound = float(factor.to(DTYPE).pow(2).sum()), float(count.sum()) * clip * clip * (1 + 1e-9)
        if trace > bound:
            raise UpdateRejected(
                f"{field}gram{FACTOR}",
                f"not from features clipped to dp.clip = {clip:g}: trace(G) = {trace:.6g} exceeds samples x "
                f"clip^2 = {bound:.6g}",
            )


class FeatureStatsAggregator(Aggregator):
    """One features step: the clients' statistics, summed; with ``clip > 0`` (a privacy budget's ``dp.clip``) only
    statistics that features clipped to it can give (:func:`check_clipped`)."""

    PARTS = ("sums",)  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(
        self,
        plan: RoundPlan,
        declared: Shapes,
        shapes: dict[str, tuple[int, ...]],
        clip: float = 0.0,
        rows_per_sample: int = 1,
    ) -> None:
        super().__init__(plan, declared)
        self.sums = StatSums(shapes)
        self.clip = clip
        self.rows_per_sample = rows_per_sample  # FeatureStats.rows_per_sample: a sample's clean features and views

    def _check(self, update: ClientUpdate) -> None:
        """The statistics of ``num_samples`` samples of the current task's classes (and a subset held out, and that
        subset's share of the sums, views included)."""
        stats = update.named(STAT)
        counts = stats["class_count"]
        check_class_counts(update)
        prefixes = [p for p in (HOLDOUT, HELD_FIT) if p + "class_count" in stats]
        for prefix in ("", *prefixes):
            count, class_sum = stats[prefix + "class_count"], stats[prefix + "class_sum"]
            if bool((class_sum[count == 0] != 0).any()):
                raise UpdateRejected(f"stat/{prefix}class_sum", "a class with no samples must have a zero sum")
            factor = stats.get(prefix + "gram" + FACTOR)
            if factor is not None:
                samples = int(count.sum())
                rows = samples * (self.rows_per_sample if prefix != HOLDOUT else 1)  # the held-out: clean only
                if factor.shape[-2] > rows:  # rank X^T X <= rows: more is no factor of it
                    raise UpdateRejected(
                        f"stat/{prefix}gram{FACTOR}",
                        f"expected at most min(rows, width) = {min(rows, factor.shape[-1])} rows "
                        f"({samples} samples), got {factor.shape[-2]}",
                    )
                check_sums_fit_gram(f"stat/{prefix}class_sum", class_sum, count, factor)
            if self.clip > 0:
                check_clipped(f"stat/{prefix}", class_sum, count, factor, self.clip)
        if HOLDOUT + "class_count" in stats and bool((stats[HOLDOUT + "class_count"] > counts).any()):
            raise UpdateRejected(
                f"stat/{HOLDOUT}class_count",
                "held-out samples must be a subset: no class may hold out more samples than it has",
            )
        if HELD_FIT + "class_count" in stats and not torch.equal(
            stats[HELD_FIT + "class_count"], stats[HOLDOUT + "class_count"]
        ):
            raise UpdateRejected(
                f"stat/{HELD_FIT}class_count", "the held-out samples' share must count the held-out samples"
            )
        share = held_share(stats)  # the held-out samples' share of the Gram, which the lambda fit leaves out
        whole, held = stats.get("gram" + FACTOR), stats.get(share + "gram" + FACTOR)
        if whole is not None and held is not None:
            check_share_within_gram(f"stat/{share}gram{FACTOR}", whole, held)
        clean = stats.get(HOLDOUT + "gram" + FACTOR)
        if share == HELD_FIT and held is not None and clean is not None:
            # The held-out samples' clean rows are among their share's 1 + V rows, which carry weight 1 / (1 + V):
            # their clean Gram, which scores lambda, is at most (1 + V) times the share's.
            check_share_within_gram(
                f"stat/{HOLDOUT}gram{FACTOR}",
                math.sqrt(self.rows_per_sample) * held,
                clean,
                f"the held-out samples' clean Gram exceeds {self.rows_per_sample} times their share of the Gram",
                "their clean rows are among the share's rows, each at weight 1 / (1 + views)",
            )

    def _fold(self, update: ClientUpdate) -> None:
        lo, hi = self.plan.class_range
        self.sums.fold(update.named(STAT), rows=slice(lo, hi))  # the current task's rows of the per-class sums


class CcvrStatsAggregator(FeatureStatsAggregator):
    """The features step: the clients' per-class sums and second moments of the task's classes, summed."""

    def _check(self, update: ClientUpdate) -> None:
        super()._check(update)
        stats = update.named(STAT)
        count, moment = stats["class_count"], stats["class_moment"]
        if bool((moment[count == 0] != 0).any()):
            raise UpdateRejected("stat/class_moment", "a class with no samples must have zero second moments")
        check_moments_above_means("stat/class_moment", stats["class_sum"], count, moment)

    def _fold(self, update: ClientUpdate) -> None:
        self.sums.fold(update.named(STAT))  # the task's classes only: rows (C_t, ...)


# ----------------------------------------------------------------------------- what a closed-form head sums


def head_sum_shapes(spec: ModelSpec, config: RunConfig) -> Shapes:
    """A closed-form head's sums over clients and tasks: ``class_sum (C, F')`` and ``class_count (C,)``, ``F'``
    the width of the run's features step (:func:`~common.aggregation.declared.feature_stats_of`)."""
    width = feature_stats_of(config).features.head_width(spec.feature_dim)
    return {"class_sum": (spec.num_classes, width), "class_count": (spec.num_classes,)}


def ridge_sum_shapes(spec: ModelSpec, config: RunConfig) -> Shapes:
    """Ridge's sums: the class sums and counts, the Gram ``(F', F')`` (in ``K`` diagonal blocks ``(K, F'/K,
    F'/K)``), and with a held-out rule the held-out samples' alike (by the average rule: their whole Gram, as its
    factor's rows ``(F',)``), as the run's features step sends them (``feature_stats_of``)."""
    stats = feature_stats_of(config)
    dim = stats.features.head_width(spec.feature_dim)
    d = dim // stats.blocks
    shapes = head_sum_shapes(spec, config) | {"gram": (dim, dim) if stats.blocks == 1 else (stats.blocks, d, d)}
    if stats.holdout:
        shapes |= {HOLDOUT + name: shape for name, shape in shapes.items()}
        if stats.average_rule:  # the held-out Gram whole, as its factor's rows
            shapes[HOLDOUT + "gram"] = (dim,)
        if stats.views:  # the held-out samples' share of the sums, views included
            shapes |= {HELD_FIT + name: shapes[HOLDOUT + name] for name in ("class_sum", "class_count", "gram")}
    return shapes


# ----------------------------------------------------------------------------- factories


def ncm(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> FeatureStatsAggregator:
    """The cosine nearest-class-mean head's features step: class sums and counts (clipped, with a budget)."""
    clip = feature_stats_of(config).features.clip
    return FeatureStatsAggregator(plan, declared_tensors(plan, spec, config), head_sum_shapes(spec, config), clip)


def ridge(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> FeatureStatsAggregator:
    """The ridge head's features step: class sums and counts, the Gram, and the held-out samples' alike (clipped,
    with a budget)."""
    stats = feature_stats_of(config)
    return FeatureStatsAggregator(
        plan,
        declared_tensors(plan, spec, config),
        ridge_sum_shapes(spec, config),
        stats.features.clip,
        stats.rows_per_sample,
    )


# LoRM's steps, then the NCM head's features step (``lorm-ncm``)
lorm_ncm = Phased(Phase.FEATURES, ncm, lorm)


# LoRM's steps, then the ridge head's features step (``lorm-ridge``, ``lorm-ridge-first``)
lorm_ridge = Phased(Phase.FEATURES, ridge, lorm)


def ccvr_stats(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> CcvrStatsAggregator:
    """CCVR's features step: the per-class sums, counts and second moments."""
    return CcvrStatsAggregator(plan, declared_tensors(plan, spec, config), feature_stat_shapes(plan, spec, config))


# CCVR: FedAvg in the training rounds; the features step's per-class sums, counts and second moments
ccvr = Phased(Phase.FEATURES, ccvr_stats, fedavg)
