"""A closed-form head's privacy budget (the ``dp`` section; ``ncm`` and ``ridge``): calibration, ledger and noise.

:class:`PrivateRelease` calibrates each features step's summed statistics once, keeps the ledger of what each task's
records have spent, and noises a step's sums before they join the totals (central mode), or states what the sum of
the clients' noised shares carried (distributed mode); it also gives the ridge its noise-floor lambda. The heads
that hold one, and solve from the sums it noised, are :mod:`server.strategies.closed_form`'s; the trained methods'
budgets are :mod:`server.strategies.private`'s; the mechanisms themselves are ``common/privacy/``'s.
"""

from __future__ import annotations

import math
from typing import Any

from common.aggregation.features import StatSums
from common.privacy.gaussian import (
    ADJACENCY,
    CLASS_SUM,
    GRAM,
    Release,
    add_noise,
    calibrate,
    composed_mu,
    gaussian_mu,
    gram_blocks,
    noise_floor_lambda,
    noise_source,
    noise_statement,
)
from common.privacy.ledger import PrivacyLedger
from common.run.settings import DpSettings
from common.secagg.distributed_dp import DistributedNoise, noised_entries


class PrivateRelease:
    """The run's privacy budget on a closed-form head's steps: each step's statistics calibrated once
    (:func:`~common.privacy.gaussian.calibrate`), the ledger of what each task's records have spent, and the noise
    added to a step's summed statistics before they join the totals (central mode), or (``noise``: distributed
    mode) the distributed discrete Gaussian mechanism the clients' shares make, whose sum arrives noised."""

    def __init__(
        self, settings: DpSettings, shapes: dict[str, tuple[int, ...]], noise: DistributedNoise | None = None
    ) -> None:
        self.settings = settings
        # a Gram of K diagonal blocks (K, d, d): its clients clip each block of a sample to C / sqrt(K)
        self.releases = calibrate(settings, tuple(shapes), gram_blocks(shapes.get(GRAM, ())))
        self.mu = composed_mu(self.releases)  # one step's release, composed
        self.ledger = PrivacyLedger(settings.epsilon, settings.delta)
        self.noise = noise
        if noise is not None:  # the releases of the noised terms as the clients mask them
            self.shared = noise.layout_releases(noised_entries(shapes.get(GRAM, ()), shapes[CLASS_SUM]))
        self.carried: dict[str, Any] = {}  # distributed: what the last step's sum carried (noise.report)

    def check(self, task: int) -> None:
        """``BudgetExceeded`` unless task ``task``'s records can afford its features step (before it starts)."""
        self.ledger.check(task, self.mu, f"task {task}'s features step")

    def release(self, task: int, classes: tuple[int, int], sums: StatSums, survivors: int) -> None:
        """Spend task ``task``'s budget and noise the step's sums in place: the Gram, and the rows ``classes`` of
        the class sums (the task's; the other rows hold nothing of this step). Noise drawn in a fixed order from
        ``noise_source(dp.seed, task)``. Distributed mode: the sum of ``survivors`` arrived noised; the ledger
        spends the ``mu`` of the Gaussian mechanism with its ``(epsilon, delta)``, at most the budget's
        (``DistributedNoise.report``)."""
        if self.noise is not None:
            self.carried = self.noise.report(self.shared, survivors)
            mu = gaussian_mu(self.carried["epsilon"], self.settings.delta)
            self.ledger.spend(task, min(mu, self.mu), f"task {task}'s features step")
            return
        self.ledger.spend(task, self.mu, f"task {task}'s features step")
        lo, hi = classes
        stats = {CLASS_SUM: sums.plain[CLASS_SUM][lo:hi]}  # a view: noised in place
        if GRAM in self.releases:
            stats[GRAM] = sums.grams[GRAM].value()
        add_noise(stats, self.releases, noise_source(self.settings.seed, task, self.settings.sampler))

    def gram_sigma(self) -> float:
        """The deviation of the noise on each entry of the summed Gram: one release per task spent so far
        (distributed: the variance every sum of at least the threshold carries)."""
        variance = self.shared[GRAM].variance if self.noise is not None else self.releases[GRAM].sigma ** 2
        return math.sqrt(variance * len(self.ledger.spent))

    def noise_lambda(self, width: int) -> float:
        """``dp.lambda_scale`` times the spectral norm of the summed Gram's noise on a block of width ``width``."""
        summed = Release(self.releases[GRAM].sensitivity, self.gram_sigma())
        return noise_floor_lambda(summed, width, self.settings.lambda_scale)

    def report(self, task: int) -> dict[str, Any]:
        """The step's guarantee for the run's history and log: the epsilon its records have spent (flat, logged),
        and the mechanism (nested: metrics.json only)."""
        mechanism: dict[str, Any] = {"mode": "central", "sigma": {name: r.sigma for name, r in self.releases.items()}}
        if self.noise is not None:
            mechanism = {"mode": "distributed", "mechanism": "discrete_gaussian"} | self.carried
        logged: dict[str, Any] = {}
        delta = self.settings.delta
        if self.noise is not None:  # the log line names the mode, what the sum carried and its delta
            logged = {"dp_mode": "distributed"} | {f"dp_variance_{k}": v for k, v in self.carried["variance"].items()}
            delta = self.carried["delta"]
        return {
            "dp_epsilon": self.ledger.epsilon_spent(task),
            "dp_delta": delta,
            **logged,
            "dp": mechanism
            | {
                "unit": "record",
                "adjacency": ADJACENCY,
                "noise": noise_statement(self.settings.seed, self.settings.sampler),
                "run_epsilon": self.ledger.epsilon_spent(),
                "budget_epsilon": self.settings.epsilon,
                "clip": self.settings.clip,
                "public": ["class_count"],
            },
        }
