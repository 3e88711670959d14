"""Client-level differential privacy of the plain-averaging methods (``dp.mode = client``: DP-FedAvg, McMahan et al.
2018, with the server-side fixed clipping of Andrew et al. 2021's baseline): the unit of privacy is a client's whole
data set, not one record.

Each round, the coordinator takes every client's update as a change from the round's plan (a data-independent
reference: the factors and head it sent, zero for a dense delta), scales the change down to L2 norm ``S =
dp.clip`` over all its tensors together, averages the clipped changes with equal weights (a client's sample count
no longer weighs it), and adds ``N(0, (z S / n)^2)`` to every entry of the mean, ``n`` the clients folded (public:
which clients take part is released, so the adjacency is ``common.privacy.gaussian``'s replace-one, here of one
client's whole data set by another's). The head's rows outside the task's classes are taken from the reference,
which no client's data moves, so they need no noise. Replacing one client's data moves the sum of clipped changes by
at most ``2 S``: each round is a Gaussian mechanism of ratio ``2 / z`` on every client, and the run's ``R = num_tasks
x rounds_per_task`` rounds compose exactly in Gaussian DP to ``2 sqrt(R) / z``: ``z = 2 sqrt(R) / mu``, ``mu =
gaussian_mu(epsilon, delta)`` (every client takes part in every round, so there is no sampling to amplify it).

What it trusts: the coordinator, which sees each client's update before clipping it (as central record-level DP
trusts it with the un-noised sums); so secure aggregation, which hides the individual updates from it, is refused
with this mode. The schedule must be fixed at the start (a run's composition is over all its rounds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from common.privacy.gaussian import SUM_REPLACE, NoiseSource, gaussian_epsilon, gaussian_mu
from common.privacy.ledger import BudgetExceeded
from common.run.config import RunConfig
from common.run.settings import DpSettings
from common.wire.tensors import DELTA, FACTOR, HEAD_BIAS, HEAD_WEIGHT, LORA


@dataclass(frozen=True)
class ClientLevelNoise:
    """The run's mechanism: ``rounds`` Gaussian releases of the mean of clipped changes, each of multiplier ``z``."""

    clip: float  # S: a client's change, all its tensors together, scaled down to this L2 norm
    rounds: int  # R: the rounds the budget covers (the run's training rounds)
    noise_multiplier: float  # z: the sum's noise deviation over S

    @staticmethod
    def of(settings: DpSettings, rounds: int) -> ClientLevelNoise:
        return ClientLevelNoise(
            settings.clip, rounds, SUM_REPLACE * math.sqrt(rounds) / gaussian_mu(settings.epsilon, settings.delta)
        )

    def epsilon(self, released: int, delta: float) -> float:
        """The epsilon at ``delta`` of every client after ``released`` rounds (Gaussian DP composes exactly)."""
        mu = SUM_REPLACE * math.sqrt(released) / self.noise_multiplier
        return gaussian_epsilon(mu, delta) if released else 0.0


def run_rounds(config: RunConfig) -> int:
    """The rounds a client-level budget covers: every training round of the run's fixed schedule."""
    return config.num_tasks * config.rounds_per_task


def reference_of(name: str, reference: dict[str, Tensor]) -> Tensor | None:
    """The plan's tensor an update's tensor ``name`` is a change from: ``factor/<layer>/<part>`` from the plan's
    ``lora/...``; a dense ``delta/...`` is a change already (the plan's ``delta/...`` is the global delta it changes),
    so none; anything else (the head) from the plan's tensor of its name."""
    kind, _, rest = name.partition("/")
    if kind == DELTA:
        return None
    return reference.get(f"{LORA}/{rest}" if kind == FACTOR else name)


def clipped_change(
    tensors: dict[str, Tensor], reference: dict[str, Tensor], clip: float, rows: tuple[int, int]
) -> dict[str, Tensor]:
    """``tensors`` as a change from ``reference`` (zero where the reference has no tensor), float64, the head's rows
    outside ``rows`` zeroed (no client moves them), scaled down to L2 norm ``clip`` over all tensors together."""
    lo, hi = rows
    change = {}
    for name, t in tensors.items():
        if not t.is_floating_point():
            continue
        ref = reference_of(name, reference)
        d = t.to(torch.float64) - (ref.to(torch.float64) if ref is not None else 0.0)
        if name in (HEAD_WEIGHT, HEAD_BIAS):
            d[:lo] = 0.0
            d[hi:] = 0.0
        change[name] = d
    norm = math.sqrt(sum(float(d.square().sum()) for d in change.values()))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {name: d.mul_(scale) for name, d in change.items()}


def noised_mean(
    sums: dict[str, Tensor],
    reference: dict[str, Tensor],
    clients: int,
    sigma: float,
    rows: tuple[int, int],
    source: NoiseSource,
) -> dict[str, Tensor]:
    """``reference + (sum + N(0, sigma^2)) / clients`` per tensor (in sorted order of names, a fixed order of draws),
    the head's rows outside ``rows`` exactly the reference's (no noise: no client's data is in them)."""
    lo, hi = rows
    out = {}
    for name in sorted(sums):
        total = sums[name].clone()
        if name in (HEAD_WEIGHT, HEAD_BIAS):
            total[lo:hi] += source.normal(tuple(total[lo:hi].shape)).to(torch.float64) * sigma
        else:
            total += source.normal(tuple(total.shape)).to(torch.float64) * sigma
        ref = reference_of(name, reference)
        out[name] = (ref.to(torch.float64) if ref is not None else 0.0) + total / clients
    return out


class ClientLevelLedger:
    """The rounds released so far against the budget's ``R``: a round beyond it is refused."""

    def __init__(self, settings: DpSettings, noise: ClientLevelNoise) -> None:
        self.settings, self.noise = settings, noise
        self.released = 0

    def check(self, what: str) -> None:
        if self.released + 1 > self.noise.rounds:
            raise BudgetExceeded(
                f"dp: {what} would be the clients' round {self.released + 1}; their noise is calibrated for "
                f"{self.noise.rounds}, which spend the run's budget (epsilon {self.settings.epsilon:g}, delta "
                f"{self.settings.delta:g}): refused"
            )

    def spend(self, what: str) -> None:
        self.check(what)
        self.released += 1

    def epsilon_spent(self) -> float:
        return self.noise.epsilon(self.released, self.settings.delta)
