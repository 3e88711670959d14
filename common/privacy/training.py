"""Record-level differential privacy of the trained methods (LoRM's family, FedAvg-LoRA, FedAvg): DP-SGD on each
client's local training and the Gaussian mechanism on the Grams LoRM sends, calibrated and composed by
``dp_accounting``'s privacy-loss-distribution (PLD) accountant under the replace-one adjacency.

**The adjacency** (``common.privacy.gaussian``'s): two data sets are neighbours when one record is replaced by another
of the same label. The counts a run releases exactly (each client's sample count, the bytes of its updates) are then
the same on both, and a record's label is not protected.

What one task's records go through, on the client that holds them (every record belongs to one task and one client,
so tasks and clients compose in parallel and a record's guarantee is its task's):

- ``rounds`` training rounds, each ``steps = ceil(epochs / q)`` DP-SGD steps: a Poisson sample of the shard at rate
  ``q = dp.sample_rate``, each sample's gradient of the trained parameters clipped to L2 norm ``C = dp.clip``, the
  clipped sum plus ``N(0, (z C)^2)`` per coordinate, divided by the expected batch ``q n``; replacing a record moves
  the clipped sum by at most ``2 C``, which the accountant's replace-one analysis of the Poisson-subsampled Gaussian
  covers;
- with Grams (LoRM's family): a Gram release after every round and one in the task's Gram step, ``rounds + 1``
  Gaussian mechanisms; each sample's rows of each recorded layer's input are scaled down so that their energy
  ``sum_t |x_t|^2 <= c = dp.gram_clip``, so one record adds to the ``M`` Grams of a release (diagonal or full, the
  head's included) a positive semi-definite part of Frobenius norm at most ``sqrt(M) c``; two such parts differ by
  at most ``sqrt(2) sqrt(M) c`` (their inner product is not negative), and every entry gets ``N(0, (z_G sqrt(M)
  c)^2)`` (symmetric on a full Gram).

The sampling rate is the run's, not the client's, so the accounting depends on the configuration alone: the
coordinator states what every client's noise gives, and a client needs nothing but its configuration to calibrate.
A client of ``n`` records draws batches of ``q n`` records on average.

Calibration: the Grams' releases take ``dp.gram_share`` of the budget as Gaussian differential privacy (``z_G =
sqrt(2) sqrt(rounds + 1) / (sqrt(gram_share) mu)``, ``mu`` the budget's analytic Gaussian ratio), then the gradient
noise ``z`` is the least that keeps the composition of everything within ``(epsilon, delta)`` under the PLD accountant
(``dp_accounting.calibrate_dp_mechanism``; pessimistic discretisation, so the epsilon stated is an upper bound).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from common.privacy.gaussian import BITS, GRAM_REPLACE, gaussian_mu
from common.privacy.ledger import BudgetExceeded
from common.run.settings import DpSettings
from common.wire.instructions import TrainInstruction
from common.wire.messages import Phase, RoundPlan

if TYPE_CHECKING:
    import dp_accounting


@dataclass(frozen=True)
class TrainingNoise:
    """One task's mechanism on each client: DP-SGD's sampling rate, steps a round and noise multiplier, and the
    Grams' noise multiplier (0: the method sends no Grams)."""

    sample_rate: float  # q: each record is in a step's batch with probability q
    steps: int  # DP-SGD steps a round: ceil(epochs / q)
    noise_multiplier: float  # z: the clipped gradient sum's noise deviation over the clip C
    gram_multiplier: float  # z_G: a Gram release's noise deviation over its sensitivity
    rounds: int  # training rounds a task
    grams: int  # Gram releases a task: rounds + 1 with Grams, else 0

    def round_event(self) -> dp_accounting.DpEvent:
        """One round's DP-SGD steps, as ``dp_accounting`` describes them (under the accountant's replace-one)."""
        import dp_accounting

        gaussian = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        step = dp_accounting.PoissonSampledDpEvent(self.sample_rate, gaussian)
        return dp_accounting.SelfComposedDpEvent(step, self.steps)

    def event(self, rounds: int, grams: int) -> dp_accounting.DpEvent:
        """``rounds`` rounds of training and ``grams`` Gram releases, composed. A replace-one accountant reads a
        ``GaussianDpEvent(m)`` as a statistic each record moves by at most 1, so that a replacement moves it by 2;
        a Gram release moves by ``sqrt(2)`` of its per-record bound (module docstring), which is the event of
        multiplier ``sqrt(2) z_G``."""
        import dp_accounting

        parts: list[dp_accounting.DpEvent] = []
        if rounds:
            parts.append(dp_accounting.SelfComposedDpEvent(self.round_event(), rounds))
        if grams:
            gram = dp_accounting.GaussianDpEvent(GRAM_REPLACE * self.gram_multiplier)
            parts.append(dp_accounting.SelfComposedDpEvent(gram, grams))
        return dp_accounting.ComposedDpEvent(parts)

    def epsilon(self, rounds: int, grams: int, delta: float) -> float:
        """The epsilon at ``delta`` of a task's records after ``rounds`` rounds and ``grams`` Gram releases (PLD
        accountant, replace-one); 0 before any. Kept per arguments: the ledger asks it of every task at every step,
        and tasks at the same point of their plan have spent the same."""
        return _epsilon(self, rounds, grams, delta)


# The PLD's discretisation of the privacy loss: pessimistic (an upper bound on epsilon); at 1e-3 the calibrated
# noise is within 1e-4 of the one at 1e-4 (measured at epsilon 0.5 to 8, q 0.05 to 0.5), ten times faster.
DISCRETISATION = 1e-3
LEAST_Z = 0.25  # the least noise multiplier the calibration tries


def accountant() -> dp_accounting.pld.PLDAccountant:
    """A fresh PLD accountant under the replace-one adjacency."""
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import PLDAccountant

    return PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=DISCRETISATION)


@functools.cache
def _epsilon(noise: TrainingNoise, rounds: int, grams: int, delta: float) -> float:
    return pld_epsilon(noise.event(rounds, grams), delta) if rounds or grams else 0.0


def pld_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    """The epsilon at ``delta`` of ``event`` under the PLD accountant (replace-one)."""
    return float(accountant().compose(event).get_epsilon(delta))


@functools.cache
def training_noise(settings: DpSettings, epochs: int, rounds: int, grams: bool) -> TrainingNoise:
    """The mechanism that spends exactly the budget ``(dp.epsilon, dp.delta)`` over one task: ``rounds`` rounds of
    ``epochs`` local epochs, and (``grams``) a Gram release after each round and one at the task's end.
    ``ValueError`` when the Grams' share alone leaves nothing for training."""
    import dp_accounting

    # what the sampler draws exactly (client/dpsgd.py: BITS-bit integers below q 2^BITS), at least the setting
    q = math.ceil(settings.sample_rate * 2**BITS) / 2**BITS
    steps = math.ceil(epochs / q)
    releases = rounds + 1 if grams else 0
    mu = gaussian_mu(settings.epsilon, settings.delta)
    z_gram = GRAM_REPLACE * math.sqrt(releases) / (math.sqrt(settings.gram_share) * mu)
    base = TrainingNoise(q, steps, 0.0, z_gram if releases else 0.0, rounds, releases)
    if not rounds:
        return base
    if releases and base.epsilon(0, releases, settings.delta) >= settings.epsilon:
        raise ValueError(
            f"dp: the Grams' share of the budget (dp.gram_share {settings.gram_share:g}) spends all of epsilon "
            f"{settings.epsilon:g}: lower dp.gram_share"
        )

    def event(z: float) -> dp_accounting.DpEvent:
        return replace(base, noise_multiplier=z).event(rounds, releases)

    # The bracket's low end: a noise whose PLD stays small (its support grows as the noise shrinks: at z 0.01 it
    # needs tens of GiB) and whose epsilon exceeds every budget worth stating (37 or more at one step, q 0.5).
    if replace(base, noise_multiplier=LEAST_Z).epsilon(rounds, releases, settings.delta) <= settings.epsilon:
        raise ValueError(
            f"dp: epsilon {settings.epsilon:g} is more than DP-SGD at noise multiplier {LEAST_Z} spends over "
            f"{rounds} rounds of {steps} steps: no noise to calibrate; lower dp.epsilon"
        )
    z = float(
        dp_accounting.calibrate_dp_mechanism(
            accountant,
            event,
            settings.epsilon,
            settings.delta,
            dp_accounting.mechanism_calibration.ExplicitBracketInterval(LEAST_Z, 1e4),
            tol=1e-4,
        )
    )
    return replace(base, noise_multiplier=z)


def releases(plan: RoundPlan) -> tuple[int, int]:
    """What ``plan``'s step releases of its task's records, by what a client computes for it, never by the phase
    label alone: a training round when it trains (the client halves train in ``TRAIN`` steps only), and a Gram
    release whenever its instruction asks for any Gram, whatever its phase (a Gram step relabelled ``FEATURES`` runs
    the same Gram pass). ``EVALUATE`` reads the test split, not the task's training records: (0, 0)."""
    if plan.phase == Phase.EVALUATE:
        return 0, 0
    step = plan.instruction
    grams = int(isinstance(step, TrainInstruction) and step.sends_grams)
    return int(plan.phase == Phase.TRAIN), grams


class TrainingLedger:
    """The releases each task's records have been through (rounds trained, Gram releases), against the plan the
    clients calibrated their noise for: a release beyond it is refused, and the epsilon spent is the RDP
    accountant's of the releases so far."""

    def __init__(self, settings: DpSettings, noise: TrainingNoise) -> None:
        self.settings, self.noise = settings, noise
        self.done: dict[int, tuple[int, int]] = {}  # task -> (rounds, Gram releases) released

    def _after(self, task: int, rounds: int, grams: int) -> tuple[int, int]:
        done = self.done.get(task, (0, 0))
        return done[0] + rounds, done[1] + grams

    def check(self, task: int, rounds: int, grams: int, what: str) -> None:
        """``BudgetExceeded`` when ``rounds`` more rounds and ``grams`` more Gram releases of task ``task`` exceed
        the plan the noise is calibrated for (which spends the whole budget)."""
        after = self._after(task, rounds, grams)
        if after[0] > self.noise.rounds or after[1] > self.noise.grams:
            spent = self.epsilon_spent(task)
            raise BudgetExceeded(
                f"dp: {what} would take task {task}'s records through {after[0]} rounds and {after[1]} Gram releases; "
                f"the noise is calibrated for {self.noise.rounds} and {self.noise.grams}, which spend the run's "
                f"budget (epsilon {self.settings.epsilon:g}, delta {self.settings.delta:g}); they have spent epsilon "
                f"{spent:.4g}: refused"
            )

    def spend(self, task: int, rounds: int, grams: int, what: str) -> None:
        self.check(task, rounds, grams, what)
        self.done[task] = self._after(task, rounds, grams)

    def epsilon_spent(self, task: int | None = None) -> float:
        """The epsilon task ``task``'s records have spent; ``None``: the most any task's have."""
        tasks = list(self.done) if task is None else [task]
        return max((self.noise.epsilon(*self.done.get(t, (0, 0)), self.settings.delta) for t in tasks), default=0.0)

    def state(self) -> Tensor:
        """``(T, 2)``: rounds and Gram releases of tasks ``0 .. T - 1`` (for the run's persisted state)."""
        size = max(self.done, default=-1) + 1
        return torch.tensor([list(self.done.get(t, (0, 0))) for t in range(size)], dtype=torch.int64).view(size, 2)

    def load(self, done: Tensor) -> None:
        self.done = {t: (int(r), int(g)) for t, (r, g) in enumerate(done.tolist()) if r or g}
