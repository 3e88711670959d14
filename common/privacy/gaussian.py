"""The Gaussian mechanism on a closed-form head's statistics: its calibration from the budget (``dp_accounting``'s
analytic Gaussian mechanism), the releases' composition, its noise (seeded or from the CSPRNG), and the per-sample
clipping its sensitivity assumes (the package's docstring states the mechanism)."""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from common.run.settings import DpSettings

if TYPE_CHECKING:  # dp_accounting (scipy, mpmath) takes a second to import: only a run with a budget loads it
    import dp_accounting

DTYPE = torch.float64
GRAM, CLASS_SUM, CLASS_COUNT = "gram", "class_sum", "class_count"  # the statistics' names (StatSums)
PUBLIC = (CLASS_COUNT,)  # released un-noised, public by design

# The adjacency every guarantee of the project is stated under: two data sets are neighbours when one record is
# replaced by another record of the same label. Counts (of a class, of a client's samples, of an update's rows and
# bytes) are released exactly, so under add-or-remove no epsilon would hold; under replace-one they are the same on
# both data sets, and a record's label is not protected. A sum of per-record parts of norm at most b moves by at most
# SUM_REPLACE b when one record is replaced; a sum of positive semi-definite parts (a Gram, x x^T) by at most
# GRAM_REPLACE b: |A - B|_F^2 = |A|^2 + |B|^2 - 2 <A, B> <= 2 b^2, since <A, B> >= 0.
ADJACENCY = "replace-one"
SUM_REPLACE = 2.0
GRAM_REPLACE = math.sqrt(2.0)


def noise_statement(seed: int, sampler: str = "box-muller") -> str:
    """What a run's statement says of its noise's source: ``dp.seed -1``, the OS's CSPRNG (through OpenDP's
    mechanism with ``sampler`` ``opendp``); otherwise a seeded generator, whose noise whoever knows the seed (it is
    in the run's ``config.json`` and ``metrics.json``) can subtract: such a run is reproducible, and private
    against nobody who holds its results."""
    if sampler == "opendp":
        return "opendp"
    if seed < 0:
        return "csprng"
    return f"seeded (dp.seed {seed}): not private against anyone who knows the seed, which the run's files hold"


def gaussian_mu(epsilon: float, delta: float) -> float:
    """``mu``: the ratio sensitivity / sigma of the one-shot Gaussian mechanism that is exactly
    ``(epsilon, delta)``-DP (the analytic Gaussian mechanism, ``dp_accounting``); ``mu(1, 1e-5) ~ 0.268``."""
    import dp_accounting

    return 1.0 / float(dp_accounting.get_sigma_gaussian(epsilon, delta))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The least ``epsilon`` of a Gaussian mechanism of ratio ``mu`` at ``delta`` (inverse of :func:`gaussian_mu`);
    0 for ``mu = 0`` (nothing released)."""
    import dp_accounting

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
        import dp_accounting

        return dp_accounting.GaussianDpEvent(self.sigma / self.sensitivity)


def calibrate(settings: DpSettings, statistics: tuple[str, ...], gram_blocks: int = 1) -> dict[str, Release]:
    """The releases of a features step that sends ``statistics`` (names of :data:`GRAM`, :data:`CLASS_SUM`,
    :data:`CLASS_COUNT`): ``sigma = sensitivity / mu_k`` with ``mu_k^2`` each statistic's share of ``mu^2``
    (``dp.gram_share`` to the Gram, the rest to the class sums), ``mu = gaussian_mu(epsilon, delta)``. A Gram of
    ``gram_blocks = K`` diagonal blocks, each block of a sample clipped to ``C / sqrt(K)`` (:func:`clip_blocks`),
    moves by at most ``sqrt(2) C^2 / sqrt(K)``. ``ValueError`` for a statistic this mechanism has no sensitivity
    for."""
    unknown = sorted(set(statistics) - {GRAM, CLASS_SUM, *PUBLIC})
    if unknown:
        raise ValueError(f"dp: no sensitivity is known for the statistics {unknown}: they cannot be released")
    mu = gaussian_mu(settings.epsilon, settings.delta)
    class_sum = SUM_REPLACE * settings.clip  # x -> x' of the same class: |x - x'| <= 2C
    if GRAM not in statistics:
        return {CLASS_SUM: Release(class_sum, class_sum / mu)}
    # x x^T -> x' x'^T: |x x^T - x' x'^T|_F <= sqrt(2) C^2; on K diagonal blocks of norm C / sqrt(K) each, the parts
    # have norm sqrt(K (C^2 / K)^2) = C^2 / sqrt(K)
    gram = GRAM_REPLACE * settings.clip**2 / math.sqrt(gram_blocks)
    return {
        GRAM: Release(gram, gram / (mu * math.sqrt(settings.gram_share))),
        CLASS_SUM: Release(class_sum, class_sum / (mu * math.sqrt(1.0 - settings.gram_share))),
    }


def gram_blocks(shape: tuple[int, ...]) -> int:
    """``K`` of a Gram kept as ``(K, d, d)`` diagonal blocks; 1 for a whole ``(d, d)`` Gram (or none)."""
    return math.prod(shape[:-2]) if len(shape) > 2 else 1


def composed_mu(releases: dict[str, Release]) -> float:
    """``sqrt(sum_k mu_k^2)``: the one Gaussian mechanism that the releases on the same records compose into."""
    return math.sqrt(sum(r.mu**2 for r in releases.values()))


def composed_event(releases: dict[str, Release]) -> dp_accounting.DpEvent:
    """The releases of one step, composed, as ``dp_accounting`` describes them (for its accountants)."""
    import dp_accounting

    return dp_accounting.ComposedDpEvent([r.event() for r in releases.values()])


def noise_floor_lambda(release: Release, width: int, scale: float) -> float:
    """The ridge's lambda from the noise alone: ``scale x sqrt(2) sigma sqrt(d)``, ``sqrt(2) sigma sqrt(d)`` the
    spectral norm of the Gram's ``d x d`` noise (:func:`add_gram_noise`: off-diagonal deviation ``sigma /
    sqrt(2)``; the semicircle's edge), which ``G + E + lam I`` must exceed to stay positive definite (AdaSSP's rule,
    without its private estimate of ``G``'s least eigenvalue). It reads no data: post-processing of public
    numbers."""
    return scale * math.sqrt(2.0) * release.sigma * math.sqrt(width)


BITS = 53  # the uniform integers drawn: as many bits as a float64's significand


def secure_bits(count: int) -> Tensor:
    """``(count,)`` int64: uniform ``BITS``-bit integers from the operating system's CSPRNG (``os.urandom``)."""
    if not count:
        return torch.zeros(0, dtype=torch.int64)
    raw = torch.frombuffer(bytearray(os.urandom(8 * count)), dtype=torch.int64)
    return (raw >> (64 - BITS)) & ((1 << BITS) - 1)


def derived_seed(label: str) -> int:
    """A 63-bit generator seed derived from ``label`` (SHA-256): a seeded draw's own stream per seed and context."""
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "little") & ((1 << 63) - 1)


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
            u = (secure_bits(2 * pairs).view(2, pairs).to(DTYPE) + 1.0) / float(1 << BITS)  # (0, 1]: a finite log
            radius, angle = torch.sqrt(-2.0 * torch.log(u[0])), (2.0 * math.pi) * u[1]
            out[start : start + pairs] = radius * torch.cos(angle)
            out[start + pairs : start + 2 * pairs] = radius * torch.sin(angle)
        return out[:count].view(shape)


class OpenDPNoise:
    """OpenDP's Gaussian mechanism (``opendp``, Rust): each value ``x`` released as ``x + N(0, sigma^2)`` sampled
    exactly and rounded once (:meth:`perturb`), so its low bits carry no pattern of the sampler (a float Box-Muller
    draw added to ``x`` leaves one, Mironov 2012). Its draws come from the operating system's randomness; it has
    no seed. About 50 us a value on this project's machine: central releases only (``dp.sampler``)."""

    def __init__(self) -> None:
        import opendp.prelude as dp  # a second to import, and only a run that asks for it needs it

        dp.enable_features("contrib")
        self._dp = dp

    def perturb(self, values: Tensor, sigma: float) -> Tensor:
        """``values + N(0, sigma^2)`` elementwise, float64, a new tensor of ``values``' shape."""
        dp = self._dp
        if values.numel() == 0:
            return values.to(DTYPE).clone()
        domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
        mechanism = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=float(sigma))
        out = mechanism(values.detach().to(DTYPE).flatten().tolist())
        return torch.tensor(out, dtype=DTYPE).view(values.shape)

    def normal(self, shape: tuple[int, ...]) -> Tensor:
        return self.perturb(torch.zeros(shape, dtype=DTYPE), 1.0)


def noise_source(seed: int, task: int, sampler: str = "box-muller") -> NoiseSource:
    """The noise of task ``task``'s release: ``seed >= 0`` a generator seeded by ``(seed, task)``, else the CSPRNG
    (``sampler`` ``opendp``: OpenDP's mechanism, :class:`OpenDPNoise`)."""
    if sampler == "opendp":
        return OpenDPNoise()
    return keyed_noise(seed, f"dp-noise/{seed}/{task}")


def keyed_noise(seed: int, label: str) -> NoiseSource:
    """``seed >= 0``: a generator seeded by ``label`` (which names the seed and the draw's context: tests and
    benchmarks only); ``seed < 0``: the operating system's CSPRNG."""
    return SecureNoise() if seed < 0 else SeededNoise(derived_seed(label))


def add_gram_noise(gram: Tensor, sigma: float, source: NoiseSource) -> None:
    """``gram += E`` in place, ``E`` symmetric, of each ``(d, d)`` matrix of ``gram`` (``(d, d)``, or ``(K, d, d)``
    diagonal blocks): ``N(0, sigma^2)`` on the diagonal, ``N(0, sigma^2 / 2)`` above it, mirrored.

    That is the Gaussian mechanism of deviation ``sigma`` on the vector ``v(G) = (G_ii; sqrt(2) G_ij, i < j)``, whose
    norm is ``|G|_F``: replacing one record moves it by ``|x x^T - x' x'^T|_F <= sqrt(2) C^2`` (:data:`GRAM_REPLACE`),
    so that sensitivity holds with half the off-diagonal variance of noising the upper triangle as it is (Analyze
    Gauss)."""
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
        if isinstance(source, OpenDPNoise):  # the mechanism noises each value itself (no draw scaled, then added)
            perturb_exactly(stats[name], sigma, source, gram=name == GRAM)
        elif name == GRAM:
            add_gram_noise(stats[name], sigma, source)
        else:
            stats[name].add_(source.normal(tuple(stats[name].shape)).mul_(sigma))


def perturb_exactly(t: Tensor, sigma: float, source: OpenDPNoise, gram: bool) -> None:
    """``t`` noised in place by OpenDP's mechanism: every value with deviation ``sigma``, or a Gram's (``(d, d)`` or
    ``(K, d, d)``, symmetric) diagonal with ``sigma`` and each pair above it once with ``sigma / sqrt(2)``, mirrored
    (the law of :func:`add_gram_noise`)."""
    if not gram:
        t.copy_(source.perturb(t, sigma))
        return
    d = t.shape[-1]
    rows, cols = torch.triu_indices(d, d, 1)
    diagonal = t.diagonal(dim1=-2, dim2=-1)
    diagonal.copy_(source.perturb(diagonal, sigma))
    upper = source.perturb(t[..., rows, cols], sigma / math.sqrt(2.0))
    t[..., rows, cols] = upper
    t[..., cols, rows] = upper


def clip_rows(x: Tensor, bound: float) -> Tensor:
    """``x: (n, F')`` with each row scaled down to L2 norm at most ``bound`` (rows within it unchanged)."""
    norms = x.norm(dim=1, keepdim=True)
    return x * torch.clamp(bound / norms.clamp_min(torch.finfo(x.dtype).tiny), max=1.0)


def clip_blocks(x: Tensor, bound: float, blocks: int = 1) -> Tensor:
    """``x: (n, F')`` with each of each row's ``blocks`` equal blocks scaled down to L2 norm at most ``bound /
    sqrt(blocks)``: the row's norm is then at most ``bound``, and its outer product restricted to the diagonal blocks
    has Frobenius norm at most ``bound^2 / sqrt(blocks)`` (``sqrt(sum_b |x_b|^4)``). ``blocks`` 1: :func:`clip_rows`."""
    if blocks == 1:
        return clip_rows(x, bound)
    n, width = x.shape
    if blocks < 1 or width % blocks:
        raise ValueError(f"clip: {width} features do not split into {blocks} equal blocks")
    return clip_rows(x.reshape(n * blocks, width // blocks), bound / math.sqrt(blocks)).reshape(n, width)
