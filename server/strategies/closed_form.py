"""Closed-form heads on frozen features: cosine nearest class mean and ridge regression.

Each task is one step in features mode: clients train nothing and send sums of their
current task's features (``client/features.py``), and the head is solved from those sums
accumulated over clients *and* tasks. Sums do not care how the samples were split, so the
head (up to float64 summation order) is the same for every Dirichlet ``beta``, and, as
classes of different tasks are disjoint, for every task order.

Shapes: ``C`` classes of all tasks, ``F'`` the head's input width (the backbone's
``feature_dim``, or the setting ``rp_dim`` with the random projection + ReLU);
``S: (C, F')`` class sums ``(X^T Y)^T``, ``n: (C,)`` class counts, ``G: (F', F')`` the Gram
``X^T X``. Memory grows with ``F'`` and ``C`` only. A client sends each Gram as its factor
``R: (min(n, F'), F')`` with ``R^T R = X^T X`` (``common.merges.grams.gram_factor``; wire name
``*gram_factor``): the same information in ``n F'`` numbers instead of ``F'^2``, and positive
semidefinite by construction; the coordinator folds ``R^T R`` into its one ``(F', F')`` sum.
Class sums and counts come as the rows of the current task's classes only (the others' are
zero for that task's data), ``(C_t, F')`` and ``(C_t,)``.

- ``ncm``: ``W = [m_c / |m_c|]_c`` with ``m_c = S_c / n_c``, bias 0. Since ``|x|`` is common to
  all classes, ``argmax_c x . m_c / |m_c| = argmax_c cos(x, m_c)``: this linear head *is*
  cosine nearest class mean.
- ``ridge``: ``W = S (G + lam I)^-1``, i.e. ``W^T = (G + lam I)^-1 X^T Y``, bias 0. ``lam`` is
  the setting ``ridge.fixed_lambda`` if set, else the value of ``ridge.lambdas`` (default
  :data:`~common.methods.closed_form.DEFAULT_LAMBDAS`) with the least squared error on the clients' held-out
  training samples (global training index ``i % k == 0``, ``k = ridge.holdout``, default 5)
  of the head fitted on the rest; the squared error comes from the held-out sums
  alone (:func:`squared_error`), and the final head uses every sample. No test data is used. With dropout views
  (``ridge.views``, ``client/features.py``) the sums weigh each sample's clean features and views ``1 / (1 + V)``
  each; the fit that chooses ``lam`` leaves out the held-out samples' share of them (``heldfit_*``), and the
  held-out samples are scored on their clean features (``holdout_*``).
- ``ridge`` with ``ridge.blocks = K > 1``: an ensemble of ``K`` ridge heads, member ``k`` on the
  ``k``-th ``rp_dim`` columns of the projection (its own random projection), scores averaged:
  ``W = [W_1 .. W_K] / K``, ``W_k = S_k (G_k + lam I)^-1`` with ``G_k`` the ``k``-th diagonal block of
  the Gram, the only part of it that clients send (``(K, min(n, d), d)`` factors, ``d = rp_dim``) and
  the coordinator keeps (``K d^2`` numbers instead of ``K^2 d^2``); ``K`` solves of width ``d``
  instead of one of ``K d``. It is the ridge of the ``K d`` features with the Gram's off-diagonal
  blocks dropped. ``lam`` is shared and minimises, by ``ridge.lambda_rule``, the members' held-out
  squared errors summed (``members``, from the held-out Gram's diagonal blocks), or the ensemble's own
  (``average``, and ``auto`` without secure aggregation: ``sum_i |W x_i - y_i|^2`` with the averaged head
  ``W``; clients then send the held-out
  samples' whole-width factor, kept stacked as :class:`~common.merges.grams.GramRows`, ``min(n_held, K d)``
  rows, since ``tr(W G W^T) = |R W^T|^2`` needs every block of ``G = R^T R``).

With a privacy budget (the ``dp`` section, ``common/privacy/``; ``ncm`` and ``ridge``): clients clip each sample's
features to ``dp.clip``, and each step's summed statistics get the Gaussian noise its calibration asks
(:class:`~server.strategies.closed_form_dp.PrivateRelease`: the task's rows of the class sums and, for the ridge,
the Gram) before they join the totals, here on the coordinator and in the in-process engine alike (central DP: the
coordinator sees the un-noised sums). With ``dp.mode = distributed`` the clients add the noise in shares before
masking (``common/secagg/distributed_dp.py``) and the coordinator adds none: it states what the survivors' sum
carried. The ridge's lambda is then ``ridge.fixed_lambda``, or the noise floor
(:func:`~common.privacy.gaussian.noise_floor_lambda` of the Gram's noise summed over the tasks so far): no held-out
statistics are sent.
"""

from __future__ import annotations

import dataclasses
import json
from abc import abstractmethod
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from common.aggregation.declared import GRAM_FACTOR as FACTOR  # clients send a Gram as R: R^T R = G
from common.aggregation.declared import HOLDOUT, feature_stats_of, held_share
from common.aggregation.features import (
    FeatureStatsAggregator,
    StatSums,
    head_sum_shapes,
    ncm,
    ridge,
    ridge_sum_shapes,
)
from common.merges.solve import right_solve
from common.methods.closed_form import NcmSettings, RidgeSettings
from common.privacy.public_prior import PRIOR_BASIS, PRIOR_MEAN, PublicPrior, check_prior, read_prior, received_prior
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.terms import run_encoding
from common.wire.instructions import FeaturesStep
from common.wire.messages import LowRank, ModelSpec, Phase, RoundPlan
from common.wire.tensors import without_head
from server.strategies.base import Strategy
from server.strategies.closed_form_dp import PrivateRelease
from server.strategies.fold import Fold

DTYPE = torch.float64
PRIOR_STATEMENT = "prior/statement"  # the state's copy of the prior's statement: UTF-8 JSON bytes


# ----------------------------------------------------------------------------- pure math


def ncm_head(class_sum: Tensor, class_count: Tensor) -> Tensor:
    """Cosine NCM weights ``(C, F')``: ``m_c / |m_c|`` with ``m_c = S_c / n_c``; rows of unseen classes are 0."""
    means = class_sum.to(DTYPE) / class_count.to(DTYPE).clamp_min(1.0)[:, None]
    norms = means.norm(dim=1, keepdim=True)
    return torch.where(norms > 0, means / norms.clamp_min(torch.finfo(DTYPE).tiny), torch.zeros_like(means))


def ridge_head(gram: Tensor, class_sum: Tensor, lam: float) -> Tensor:
    """``W = S (G + lam I)^-1``: ``(C, F')`` for ``G: (F', F')``, ``S: (C, F')``, ``lam > 0``.

    ``G: (K, d, d)``, the diagonal blocks of a Gram of ``F' = K d`` features (``ridge.blocks``): the ensemble's
    head ``[W_1 .. W_K] / K`` with ``W_k = S_k (G_k + lam I)^-1`` on the columns ``S_k`` of block ``k``, whose
    scores are the average of the ``K`` members' scores.
    """
    if not lam > 0:
        raise ValueError(f"ridge lambda must be positive, got {lam}")
    if gram.dim() == 3:
        members = [ridge_head(g, part, lam) for g, part in zip(gram, class_sum.chunk(gram.shape[0], 1), strict=True)]
        return torch.cat(members, 1) / gram.shape[0]
    return right_solve(class_sum, gram, shift=lam)  # G + lam I inside the solve: no (F', F') copy of G


def squared_error(head: Tensor, gram: Tensor, class_sum: Tensor, count: Tensor) -> float:
    """``sum_i |W x_i - y_i|^2 = tr(W G W^T) - 2 tr(W S^T) + n`` over samples with sums ``G, S, n``.

    ``W: (C, F')``; ``y_i`` one-hot, so ``sum_i |y_i|^2`` is the number of samples.
    """
    head = head.to(DTYPE)
    return float(
        ((head @ gram.to(DTYPE)) * head).sum() - 2.0 * (head * class_sum.to(DTYPE)).sum() + count.to(DTYPE).sum()
    )


def select_lambda(sums: dict[str, Tensor], grid: tuple[float, ...]) -> tuple[float, list[float]]:
    """The ``lam`` of ``grid`` whose head fitted without the held-out samples errs least on them.

    ``sums``: ``gram``, ``class_sum`` over all samples and ``holdout_*`` over the held-out ones (their clean
    features); with dropout views (``ridge.views``) ``heldfit_*``, the held-out samples' share of the sums (views
    included), is what the fit leaves out. Returns ``lam`` and the held-out squared error of every grid value (the
    first minimum wins).
    """
    errors = heldout_errors(sums, grid)
    best = min(range(len(grid)), key=errors.__getitem__)
    return grid[best], errors


def heldout_errors(sums: dict[str, Tensor], grid: tuple[float, ...]) -> list[float]:
    """Per value of ``grid``, the held-out samples' squared error of the head fitted on the others.

    With the Gram's blocks ``(K, d, d)`` (:func:`ridge_head`'s ensemble): the ``K`` members' errors summed,
    ``sum_k sum_i |W_k x_ik - y_i|^2``, one block at a time (no Gram entry outside the blocks, and the
    memory of one block's fitting Gram); the ensemble's own error would need the off-diagonal blocks.
    """
    gram = sums["gram"]
    if HOLDOUT + "gram" + FACTOR in sums:
        return ensemble_heldout_errors(sums, grid)
    if gram.dim() == 3:
        k = gram.shape[0]
        members = [heldout_errors(_block(sums, i, k), grid) for i in range(k)]
        return [sum(member) for member in zip(*members, strict=True)]
    share = held_share(sums)
    gram_fit = gram - sums[share + "gram"]
    sum_fit = sums["class_sum"] - sums[share + "class_sum"]
    held = (sums[HOLDOUT + "gram"], sums[HOLDOUT + "class_sum"], sums[HOLDOUT + "class_count"])
    return [squared_error(ridge_head(gram_fit, sum_fit, lam), *held) for lam in grid]


def ensemble_heldout_errors(sums: dict[str, Tensor], grid: tuple[float, ...]) -> list[float]:
    """Per value of ``grid``, the held-out squared error of the ensemble itself (``ridge.lambda_rule =
    'average'``): ``|R W^T|^2 - 2 tr(W S_v^T) + n_v`` with ``W = [W_1 .. W_K] / K`` fitted without the held-out
    samples, ``R: (m, K d)`` their Gram's factor (``holdout_gram_factor``), ``S_v``, ``n_v`` their sums.

    One member at a time: its fitting Gram ``G_k - R_k^T R_k`` (``R_k`` the ``k``-th ``d`` columns of ``R``), then
    per value its head's share ``R_k W_k^T / K`` of the scores ``(m, C)`` and of the cross term.
    """
    gram, rows = sums["gram"], sums[HOLDOUT + "gram" + FACTOR].to(DTYPE)
    share = held_share(sums)
    share_rows = sums[share + "gram" + FACTOR].to(DTYPE)
    k, d = gram.shape[0], gram.shape[1]
    held_sum = sums[HOLDOUT + "class_sum"].to(DTYPE)
    fit_sum = sums["class_sum"].to(DTYPE) - sums[share + "class_sum"].to(DTYPE)
    scores = [torch.zeros(rows.shape[0], fit_sum.shape[0], dtype=DTYPE) for _ in grid]  # R W^T per value
    cross = [0.0 for _ in grid]  # tr(W S_v^T) per value
    for i in range(k):
        cols = slice(i * d, (i + 1) * d)
        part, share_part = rows[:, cols], share_rows[:, cols]
        gram_fit = share_part.T @ share_part
        torch.sub(gram[i].to(DTYPE), gram_fit, out=gram_fit)  # G_k - R_k^T R_k over the product: one (d, d) matrix
        for j, lam in enumerate(grid):
            head = ridge_head(gram_fit, fit_sum[:, cols], lam) / k  # (C, d): member i's share of W
            scores[j] += part @ head.T
            cross[j] += float((head * held_sum[:, cols]).sum())
    n = float(sums[HOLDOUT + "class_count"].to(DTYPE).sum())
    return [float(s.pow(2).sum()) - 2.0 * c + n for s, c in zip(scores, cross, strict=True)]


def _block(sums: dict[str, Tensor], i: int, k: int) -> dict[str, Tensor]:
    """Member ``i`` of ``k``'s sums: its Gram blocks, its columns of the class sums, the counts."""
    out = {}
    for name, t in sums.items():
        if name.endswith("gram"):
            out[name] = t[i]
        elif name.endswith("class_sum"):
            out[name] = t.chunk(k, 1)[i]
        else:
            out[name] = t
    return out


# ----------------------------------------------------------------------------- strategies


class ClosedFormHead(Strategy):
    """One features step per task; sums over clients and tasks; the head is solved after each task."""

    use_gram = False  # the solve needs the feature Gram (and clients send it)
    settings_class: type[NcmSettings] = NcmSettings

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.settings = config.section(self.settings_class)  # client/features.py reads the same
        self.dim = self.settings.head_width(spec.feature_dim)  # the head's input width F'
        self.head_w = torch.zeros(spec.num_classes, self.dim, dtype=DTYPE)
        self.head_b = torch.zeros(spec.num_classes, dtype=DTYPE)
        self.totals = StatSums(self.stat_shapes())
        dp = config.section(DpSettings)
        noise = None
        if dp.distributed:  # the clients' noise: the fixed point and shares they use (common/secagg/terms.py)
            noise = run_encoding(config.section(SecAggSettings), dp, config.num_clients)[1]
        self.private = PrivateRelease(dp, self.stat_shapes(), noise) if dp.enabled else None
        self.prior: tuple[PublicPrior, dict[str, object]] | None = None  # read at first need, or from the state

    def public_prior(self) -> dict[str, Tensor]:
        """The run's public prior as a plan's tensors (none without one): read from ``prior_file`` once, unless the
        state brought it, and held to ``prior_digest`` and the features' width (``ValueError`` otherwise)."""
        settings = self.settings
        if not settings.prior_k:
            return {}
        if self.prior is None:
            if not settings.prior_file:
                raise ValueError(
                    f"settings {settings.section}.prior_digest name a public prior, but "
                    f"{settings.section}.prior_file names no copy of it for the coordinator (lorm-prior writes one)"
                )
            prior, statement = read_prior(Path(settings.prior_file), settings.prior_digest)  # its digest checked
            check_prior(prior.mean, prior.basis, "the run's public prior", self._prior_width(), settings.prior_k)
            self.prior = prior, statement
        prior = self.prior[0]
        return {PRIOR_MEAN: prior.mean, PRIOR_BASIS: prior.basis}

    def _prior_width(self) -> int:
        return self.settings.feature_width(self.spec.feature_dim)

    def stat_shapes(self) -> dict[str, tuple[int, ...]]:
        """What the head sums over clients and tasks (``common.aggregation.features``): name -> shape."""
        return head_sum_shapes(self.spec, self.config)

    def steps(self, task: int) -> list[tuple[Phase, int]]:
        return [(Phase.FEATURES, 0)]

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase != Phase.FEATURES:
            raise ValueError(f"{self.name} has no {phase} step")
        if self.private is not None:
            self.private.check(task)  # refuse to start a step over the budget
        plan = self.base_plan(task, round_, phase, FeaturesStep(head_gram=self.use_gram), self.public_prior())
        return dataclasses.replace(plan, tensors=without_head(plan.tensors))  # clients need no head here

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, self.stats_aggregator(plan), self.merge)

    def stats_aggregator(self, plan: RoundPlan) -> FeatureStatsAggregator:
        """A features step's aggregator: the sums this head is solved from."""
        return ncm(plan, self.spec, self.config)

    def merge(self, plan: RoundPlan, aggregator: FeatureStatsAggregator) -> None:
        """The step's sums (noised first, with a budget) into the totals, and the head solved again."""
        if self.private is not None:
            self.private.release(plan.task, plan.class_range, aggregator.sums, aggregator.count)
        self.totals.absorb(aggregator.sums)  # the step's Grams become the totals' (nothing reads them after)
        self.head_w = self.solve(self.totals.value())

    @abstractmethod
    def solve(self, sums: dict[str, Tensor]) -> Tensor:
        """The head ``(C, F')`` from the sums over every client and task so far."""

    def step_report(self, plan: RoundPlan) -> dict[str, Any]:
        """With a privacy budget, the step's guarantee
        (:meth:`~server.strategies.closed_form_dp.PrivateRelease.report`); with a public prior, what it was
        fitted on and its digest."""
        report = self.private.report(plan.task) if self.private is not None else {}
        if self.prior is not None:
            report["public_prior"] = self.prior[1] | {"prior_digest": self.settings.prior_digest}
        return report

    def eval_plan(self, task: int) -> RoundPlan:
        """Evaluate in features mode: clients apply the feature map (the public prior's too) before the head
        ``(C, F')``."""
        plan = super().eval_plan(task)
        return dataclasses.replace(plan, instruction=FeaturesStep(), tensors=plan.tensors | self.public_prior())

    def adapter(self) -> dict[str, LowRank]:
        return {}  # the backbone stays W0

    def state_tensors(self) -> dict[str, Tensor]:
        tensors = super().state_tensors()
        if self.prior is not None:  # a restarted coordinator needs no copy of the file
            prior, statement = self.prior
            text = torch.frombuffer(bytearray(json.dumps(statement, sort_keys=True).encode()), dtype=torch.uint8)
            tensors |= {PRIOR_MEAN: prior.mean, PRIOR_BASIS: prior.basis, PRIOR_STATEMENT: text}
        if not self.totals.count:
            return tensors  # no task finished yet
        if self.private is not None:
            tensors["dp/spent"] = self.private.ledger.state()
        return tensors | {f"stats/{name}": t for name, t in self.totals.value().items()}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        if PRIOR_MEAN in tensors and PRIOR_BASIS in tensors:
            text = tensors.get(PRIOR_STATEMENT)
            statement = json.loads(bytes(text.tolist()).decode()) if text is not None else {}
            kept = {PRIOR_MEAN: tensors[PRIOR_MEAN], PRIOR_BASIS: tensors[PRIOR_BASIS]}
            try:
                prior = received_prior(kept, self._prior_width(), self.settings.prior_k, self.settings.prior_digest)
            except ValueError as err:
                raise ValueError(f"the state's public prior is not the run's: {err}") from err
            self.prior = prior, statement
        if self.private is not None and "dp/spent" in tensors:
            self.private.ledger.load(tensors["dp/spent"])
        if "stats/class_count" in tensors:
            self.totals = StatSums(self.stat_shapes())
            self.totals.fold({k.removeprefix("stats/"): t for k, t in tensors.items() if k.startswith("stats/")})


class NearestClassMean(ClosedFormHead):
    name = "ncm"

    def solve(self, sums: dict[str, Tensor]) -> Tensor:
        return ncm_head(sums["class_sum"], sums["class_count"])


class RidgeHead(ClosedFormHead):
    name = "ridge"
    use_gram = True
    settings_class = RidgeSettings

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        ridge = config.section(RidgeSettings)  # checked there: a fixed lambda, or a grid and a hold-out rule
        self.fixed_lambda, self.grid = ridge.fixed_lambda, ridge.lambdas
        if ridge.blocks > 1 and ridge.lambda_rule == "average" and config.section(SecAggSettings).enabled:
            raise ValueError(
                "setting ridge.lambda_rule = 'average' needs the held-out samples' Gram whole, which secure "
                "aggregation cannot add up: use 'members' or 'auto' (the members' rule under secure aggregation)"
            )
        self.average_rule = feature_stats_of(config).average_rule  # lambda by the ensemble's own held-out error
        super().__init__(config, spec)
        self.lam = self.fixed_lambda  # the lambda of the current head (0 before the first task)
        self.errors: list[float] = []  # held-out squared error per grid value, at the last solve

    def stat_shapes(self) -> dict[str, tuple[int, ...]]:
        return ridge_sum_shapes(self.spec, self.config)

    def stats_aggregator(self, plan: RoundPlan) -> FeatureStatsAggregator:
        return ridge(plan, self.spec, self.config)

    def state_tensors(self) -> dict[str, Tensor]:
        return super().state_tensors() | {"ridge/lambda": torch.tensor(self.lam, dtype=DTYPE)}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        self.lam = float(tensors.get("ridge/lambda", self.lam))

    def solve(self, sums: dict[str, Tensor]) -> Tensor:
        if not self.fixed_lambda and self.private is not None:
            self.lam = self.private.noise_lambda(sums["gram"].shape[-1])  # no held-out statistics under DP
        elif not self.fixed_lambda:
            self.lam, self.errors = select_lambda(sums, self.grid)
        return ridge_head(sums["gram"], sums["class_sum"], self.lam)

    def step_report(self, plan: RoundPlan) -> dict[str, Any]:
        """The lambda of the head just solved and, when it was chosen, every candidate's held-out squared error."""
        report: dict[str, Any] = {"ridge_lambda": self.lam} | super().step_report(plan)
        if not self.fixed_lambda and self.errors:
            report["ridge_heldout_error"] = {repr(lam): err for lam, err in zip(self.grid, self.errors, strict=True)}
        return report
