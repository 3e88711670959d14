"""What each task's records have spent of the run's budget, the refusal of a release that would overspend it, and the
run's guarantee as ``metrics.json`` states it."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from common.privacy.gaussian import DTYPE, gaussian_epsilon, gaussian_mu


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


DISTRIBUTED_KEYS = ("variance", "survivors", "colluders", "log_tau", "delta")  # a distributed step's, in privacy.steps


def privacy_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's guarantee for ``metrics.json``: ``{"privacy": {...}}`` with the epsilon its most spent records have
    spent and its delta (the largest any step states), from its history's steps that released statistics (their
    ``dp`` reports), and the public prior its features passed (``public_prior``: the corpus, its size and digest,
    the prior's own digest), inside ``privacy`` or, without a budget, beside it; ``{}`` for a run that released
    none under a budget and used no prior."""
    priors = [entry["public_prior"] for entry in history if "public_prior" in entry]
    prior = {"public_prior": priors[-1]} if priors else {}  # what the head's features passed first, and its digest
    steps = [entry for entry in history if "dp" in entry]
    if not steps:
        return prior
    last = steps[-1]["dp"]
    return {
        "privacy": prior
        | {
            "epsilon": max(entry["dp"]["run_epsilon"] for entry in steps),
            "delta": max(entry["dp_delta"] for entry in steps),
            "budget_epsilon": last["budget_epsilon"],
            "mode": last["mode"],
            "unit": last["unit"],
            "adjacency": last.get("adjacency", "add-or-remove"),  # a run recorded before replace-one said none
            "noise": last.get("noise", "unstated"),
            "public": last["public"],
            "steps": [
                {"task": entry["task"], "epsilon": entry["dp_epsilon"]}
                | {k: entry["dp"][k] for k in DISTRIBUTED_KEYS if k in entry["dp"]}  # distributed mode
                for entry in steps
            ],
        }
    }
