"""Record-level differential privacy of the closed-form heads' statistics (issue 44): the ``dp`` section, the
Gaussian mechanism's calibration by ``dp_accounting``, its noise, and the ledger that refuses an over-budget release.

The mechanism perturbs the sufficient statistics once (Analyze Gauss; AdaSSP). Each sample's features, after the
feature map (layers, norm, random projection), are scaled down to L2 norm at most ``C = dp.clip`` before they
enter any sum (``FeatureMap.clip``), so adding or removing one record changes

- the Gram ``G = sum_i x_i x_i^T`` ``(F', F')`` by ``x x^T``, of Frobenius norm ``|x|^2 <= C^2`` (its ``K``
  diagonal blocks with ``ridge.blocks`` by at most that too);
- the class sums ``S: (C, F')`` by one row ``x``: L2 norm ``<= C``;
- the class counts by 1: **public by design**, never noised; neither head reads them (cosine NCM's rows are
  ``S_c / |S_c|``, the ridge head is ``S (G + lam I)^-1``), and the coordinator sees them.

Every entry of a statistic gets ``N(0, sigma^2)`` noise, ``sigma = sensitivity / mu_k``; the Gram's is symmetric,
``N(0, sigma^2 / 2)`` off the diagonal (:func:`add_gram_noise`). Gaussian mechanisms compose exactly into one
(Gaussian differential privacy, Dong, Roth and Su 2019): releases of ``mu_k`` are one of ``mu = sqrt(sum_k
mu_k^2)``, so a budget ``(epsilon, delta)`` is the ``mu = 1 / sigma`` of the analytic Gaussian mechanism of
sensitivity 1 (Balle and Wang 2018, ``dp_accounting.get_sigma_gaussian``), split between the statistics by shares
of ``mu^2`` (``dp.gram_share``).

Composition over the run: every record belongs to one task, and only that task's features step reads it, so
the steps compose in parallel and the run's guarantee is each step's. :class:`PrivacyLedger` keeps the ``mu^2``
each task's records have spent and refuses a release that would take them over the budget.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import dp_accounting
import torch
from torch import Tensor

from common.run.settings import Settings, finite_number, setting

DTYPE = torch.float64
GRAM, CLASS_SUM, CLASS_COUNT = "gram", "class_sum", "class_count"  # the statistics' names (StatSums)
PUBLIC = (CLASS_COUNT,)  # released un-noised, public by design


@dataclass(frozen=True)
class DpSettings(Settings):
    """Record-level differential privacy of the closed-form heads (``ncm``, ``ridge``): central, the coordinator
    adds the noise to the clients' summed statistics (``docs/PRIVACY.md``)."""

    section: ClassVar[str] = "dp"
    epsilon: float = setting(
        0.0,
        "the privacy budget epsilon of every training record over the whole run (0 or inf: no differential "
        "privacy, the run as without this section)",
    )
    delta: float = setting(1e-5, "the budget's delta, in (0, 1); below 1 / (training records) to mean anything")
    clip: float = setting(
        1.0,
        "C: each sample's head features (after layers, norm and the random projection) scaled down to L2 norm at "
        "most C before they enter a sum, so a record moves the Gram by at most C^2 and the class sums by C",
    )
    gram_share: float = setting(
        0.1, "ridge: the Gram's share of the budget, in (0, 1), as a share of mu^2; the class sums get the rest"
    )
    lambda_scale: float = setting(
        2.0,
        "ridge without fixed_lambda: lambda = lambda_scale x sqrt(2) sigma sqrt(d), the spectral norm of the "
        "summed Gram's noise on a block of width d (AdaSSP's rule without its private least eigenvalue: it reads "
        "no data; it replaces ridge.holdout and ridge.lambda_rule)",
    )
    seed: int = setting(
        -1,
        "the noise's generator: -1 the operating system's CSPRNG (os.urandom); >= 0 a seeded torch generator, "
        "reproducible, for tests and benchmarks only (whoever knows the seed can subtract the noise)",
    )

    def __post_init__(self) -> None:
        if not (self.epsilon >= 0 and not math.isnan(self.epsilon)):
            raise ValueError(f"setting dp.epsilon must be > 0, or 0 or inf for none, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"setting dp.delta must lie in (0, 1), got {self.delta}")
        finite_number("dp.clip", self.clip, 0.0, strict=True)
        finite_number("dp.lambda_scale", self.lambda_scale, 0.0, strict=True)
        if not 0 < self.gram_share < 1:
            raise ValueError(f"setting dp.gram_share must lie in (0, 1), got {self.gram_share}")
        if self.seed < -1:
            raise ValueError(f"setting dp.seed must be -1 (the CSPRNG) or a seed >= 0, got {self.seed}")

    @property
    def enabled(self) -> bool:
        """A finite positive epsilon: the statistics are clipped and noised."""
        return 0 < self.epsilon < math.inf


# ----------------------------------------------------------------------------- the accountant


def gaussian_mu(epsilon: float, delta: float) -> float:
    """``mu``: the ratio sensitivity / sigma of the one-shot Gaussian mechanism that is exactly
    ``(epsilon, delta)``-DP (the analytic Gaussian mechanism, ``dp_accounting``); ``mu(1, 1e-5) ~ 0.268``."""
    return 1.0 / float(dp_accounting.get_sigma_gaussian(epsilon, delta))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The least ``epsilon`` of a Gaussian mechanism of ratio ``mu`` at ``delta`` (inverse of :func:`gaussian_mu`);
    0 for ``mu = 0`` (nothing released)."""
    return float(dp_accounting.get_epsilon_gaussian(1.0 / mu, delta)) if mu > 0 else 0.0


@dataclass(frozen=True)
class Release:
    """One statistic's Gaussian mechanism: the L2 sensitivity of the statistic to one record, and the deviation of
    the noise on each of its entries."""

    sensitivity: float
    sigma: float

    @property
    def mu(self) -> float:
        return self.sensitivity / self.sigma

    def event(self) -> dp_accounting.GaussianDpEvent:
        """The release as ``dp_accounting`` describes it (its noise multiplier sigma / sensitivity)."""
        return dp_accounting.GaussianDpEvent(self.sigma / self.sensitivity)


def calibrate(settings: DpSettings, statistics: tuple[str, ...]) -> dict[str, Release]:
    """The releases of a features step that sends ``statistics`` (names of :data:`GRAM`, :data:`CLASS_SUM`,
    :data:`CLASS_COUNT`): ``sigma = sensitivity / mu_k`` with ``mu_k^2`` each statistic's share of ``mu^2``
    (``dp.gram_share`` to the Gram, the rest to the class sums), ``mu = gaussian_mu(epsilon, delta)``.
    ``ValueError`` for a statistic this mechanism has no sensitivity for."""
    unknown = sorted(set(statistics) - {GRAM, CLASS_SUM, *PUBLIC})
    if unknown:
        raise ValueError(f"dp: no sensitivity is known for the statistics {unknown}: they cannot be released")
    mu = gaussian_mu(settings.epsilon, settings.delta)
    c = settings.clip
    if GRAM not in statistics:
        return {CLASS_SUM: Release(c, c / mu)}
    return {
        GRAM: Release(c * c, c * c / (mu * math.sqrt(settings.gram_share))),
        CLASS_SUM: Release(c, c / (mu * math.sqrt(1.0 - settings.gram_share))),
    }


def composed_mu(releases: dict[str, Release]) -> float:
    """``sqrt(sum_k mu_k^2)``: the one Gaussian mechanism that the releases on the same records compose into."""
    return math.sqrt(sum(r.mu**2 for r in releases.values()))


def composed_event(releases: dict[str, Release]) -> dp_accounting.DpEvent:
    """The releases of one step, composed, as ``dp_accounting`` describes them (for its accountants)."""
    return dp_accounting.ComposedDpEvent([r.event() for r in releases.values()])


def noise_floor_lambda(release: Release, width: int, scale: float) -> float:
    """The ridge's lambda from the noise alone: ``scale x sqrt(2) sigma sqrt(d)``, ``sqrt(2) sigma sqrt(d)`` the
    spectral norm of the Gram's ``d x d`` noise (:func:`add_gram_noise`: off-diagonal deviation ``sigma /
    sqrt(2)``; the semicircle's edge), which ``G + E + lam I`` must exceed to stay positive definite (AdaSSP's rule,
    without its private estimate of ``G``'s least eigenvalue). It reads no data: post-processing of public
    numbers."""
    return scale * math.sqrt(2.0) * release.sigma * math.sqrt(width)


class BudgetExceeded(ValueError):
    """A release that would take some records over the run's privacy budget."""


class PrivacyLedger:
    """What each task's records have spent, as ``mu^2`` (Gaussian mechanisms compose by adding it); tasks hold
    disjoint records, so the run's guarantee is its most spent task's."""

    def __init__(self, epsilon: float, delta: float) -> None:
        self.epsilon, self.delta = epsilon, delta
        self.budget = gaussian_mu(epsilon, delta) ** 2
        self.spent: dict[int, float] = {}  # task -> mu^2 its records have spent

    def check(self, task: int, mu: float, what: str) -> None:
        """``BudgetExceeded`` naming the spent and the asked unless task ``task``'s records can afford a release of
        ``mu`` (``1e-9`` relative slack for float rounding of a release calibrated to the whole budget)."""
        spent = self.spent.get(task, 0.0)
        if spent + mu**2 > self.budget * (1 + 1e-9):
            raise BudgetExceeded(
                f"dp: {what} would release statistics of task {task}'s records at epsilon "
                f"{gaussian_epsilon(mu, self.delta):.4g}; they have spent epsilon "
                f"{gaussian_epsilon(math.sqrt(spent), self.delta):.4g}, and both together are epsilon "
                f"{gaussian_epsilon(math.sqrt(spent + mu**2), self.delta):.4g}, over the run's budget "
                f"(epsilon {self.epsilon:g}, delta {self.delta:g}): refused"
            )

    def spend(self, task: int, mu: float, what: str) -> None:
        """Record a release of ``mu`` on task ``task``'s records, after :meth:`check`."""
        self.check(task, mu, what)
        self.spent[task] = self.spent.get(task, 0.0) + mu**2

    def epsilon_spent(self, task: int | None = None) -> float:
        """The epsilon (at the run's delta) task ``task``'s records have spent; ``None``: the most any task's have."""
        spent = max(self.spent.values(), default=0.0) if task is None else self.spent.get(task, 0.0)
        return gaussian_epsilon(math.sqrt(spent), self.delta)

    def state(self) -> Tensor:
        """``(T,)``: the ``mu^2`` spent by tasks ``0 .. T - 1`` (for the run's persisted state)."""
        size = max(self.spent, default=-1) + 1
        return torch.tensor([self.spent.get(t, 0.0) for t in range(size)], dtype=DTYPE)

    def load(self, spent: Tensor) -> None:
        self.spent = {t: float(v) for t, v in enumerate(spent) if float(v) > 0}


# ----------------------------------------------------------------------------- the noise


class NoiseSource(Protocol):
    """Standard normal draws, float64."""

    def normal(self, shape: tuple[int, ...]) -> Tensor: ...


class SeededNoise:
    """A seeded torch generator: reproducible noise, for tests and benchmarks (not secret to whoever knows the
    seed)."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def normal(self, shape: tuple[int, ...]) -> Tensor:
        return torch.randn(shape, generator=self.generator, dtype=DTYPE)


class SecureNoise:
    """Normal draws from the operating system's CSPRNG (``os.urandom``), by the Box-Muller transform of 53-bit
    uniforms in ``(0, 1]``: no generator state that the released values could reveal."""

    CHUNK = 1 << 22  # pairs of normals per read of os.urandom (64 MiB)

    def normal(self, shape: tuple[int, ...]) -> Tensor:
        count = math.prod(shape)
        out = torch.empty(count + 1, dtype=DTYPE)  # filled in pairs; one spare for an odd count
        for start in range(0, count, 2 * self.CHUNK):
            pairs = min((count - start + 1) // 2, self.CHUNK)
            raw = torch.frombuffer(bytearray(os.urandom(16 * pairs)), dtype=torch.int64).view(2, pairs)
            u = (((raw >> 11) & ((1 << 53) - 1)).to(DTYPE) + 1.0) / float(1 << 53)  # (0, 1]: a finite log
            radius, angle = torch.sqrt(-2.0 * torch.log(u[0])), (2.0 * math.pi) * u[1]
            out[start : start + pairs] = radius * torch.cos(angle)
            out[start + pairs : start + 2 * pairs] = radius * torch.sin(angle)
        return out[:count].view(shape)


def noise_source(seed: int, task: int) -> NoiseSource:
    """The noise of task ``task``'s release: ``seed >= 0`` a generator seeded by ``(seed, task)``, else the CSPRNG."""
    if seed < 0:
        return SecureNoise()
    digest = hashlib.sha256(f"dp-noise/{seed}/{task}".encode()).digest()
    return SeededNoise(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def add_gram_noise(gram: Tensor, sigma: float, source: NoiseSource) -> None:
    """``gram += E`` in place, ``E`` symmetric, of each ``(d, d)`` matrix of ``gram`` (``(d, d)``, or ``(K, d, d)``
    diagonal blocks): ``N(0, sigma^2)`` on the diagonal, ``N(0, sigma^2 / 2)`` above it, mirrored.

    That is the Gaussian mechanism of deviation ``sigma`` on the vector ``v(G) = (G_ii; sqrt(2) G_ij, i < j)``, whose
    norm is ``|G|_F``: one record moves it by exactly ``|x x^T|_F = |x|^2 <= C^2``, so the sensitivity ``C^2``
    holds with half the off-diagonal variance of noising the upper triangle as it is (Analyze Gauss).
    """
    noise = source.normal(tuple(gram.shape)).mul_(sigma)  # (..., d, d); the strict lower triangle unused
    diagonal = noise.diagonal(dim1=-2, dim2=-1).clone()
    upper = noise.triu_(1).mul_(1.0 / math.sqrt(2.0))
    gram.add_(upper).add_(upper.transpose(-1, -2))
    gram.diagonal(dim1=-2, dim2=-1).add_(diagonal)


def add_noise(stats: dict[str, Tensor], releases: dict[str, Release], source: NoiseSource, share: float = 1.0) -> None:
    """Perturb ``stats`` in place: each statistic named in ``releases`` gets noise of variance ``share x sigma^2``
    (symmetric on the Gram). ``share`` 1: central DP, the whole noise at once; ``1 / n``: one of ``n`` parties'
    share, whose sum carries ``sigma^2`` (distributed noise under secure aggregation)."""
    for name, release in releases.items():
        sigma = release.sigma * math.sqrt(share)
        if name == GRAM:
            add_gram_noise(stats[name], sigma, source)
        else:
            stats[name].add_(source.normal(tuple(stats[name].shape)).mul_(sigma))


def clip_rows(x: Tensor, bound: float) -> Tensor:
    """``x: (n, F')`` with each row scaled down to L2 norm at most ``bound`` (rows within it unchanged)."""
    norms = x.norm(dim=1, keepdim=True)
    return x * torch.clamp(bound / norms.clamp_min(torch.finfo(x.dtype).tiny), max=1.0)


def privacy_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's guarantee for ``metrics.json``: ``{"privacy": {...}}`` with the epsilon its most spent records have
    spent and its delta, from its history's steps that released statistics (their ``dp`` reports); ``{}`` for a
    run that released none under a budget."""
    steps = [entry for entry in history if "dp" in entry]
    if not steps:
        return {}
    last = steps[-1]["dp"]
    return {
        "privacy": {
            "epsilon": max(entry["dp"]["run_epsilon"] for entry in steps),
            "delta": max(entry["dp_delta"] for entry in steps),
            "budget_epsilon": last["budget_epsilon"],
            "mode": last["mode"],
            "unit": last["unit"],
            "public": last["public"],
            "steps": [{"task": entry["task"], "epsilon": entry["dp_epsilon"]} for entry in steps],
        }
    }
