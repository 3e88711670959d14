"""The coordinator's account of a run's privacy budget, one class per mode, each a wrapper of the strategy's step
folds (``server/strategies/fold.py``), as Flower wraps a strategy for DP: :meth:`wrap` refuses a step beyond the
budget, folds its updates into what the mode needs and spends the budget once the method's merge is done, and
:meth:`statement` is what the step's history entry records of it. No step function asks which mode a run has.

- no budget, or a method the coordinator noises itself (:class:`NoPrivacy`): the folds as they are.

- ``dp.mode = local`` (:class:`PrivateTraining`, ``common/privacy/training.py``): each client noises what it trains
  and sends; the coordinator adds nothing. It keeps the ledger of the releases each task's records have been
  through and refuses to start a step beyond the plan the clients calibrated their noise for.
- ``dp.mode = client`` (:class:`ClientLevelPrivacy`, ``common/privacy/client_level.py``): DP-FedAvg; the coordinator
  clips each client's change, averages with equal weights and noises the mean.

Either states the epsilon spent in the step's history entry and log line (and so in ``metrics.json`` and every
export).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from common.aggregation.base import Aggregator
from common.methods import method
from common.privacy.client_level import (
    ClientLevelLedger,
    ClientLevelNoise,
    clipped_change,
    noised_mean,
    run_rounds,
)
from common.privacy.gaussian import ADJACENCY, NoiseSource, keyed_noise, noise_statement
from common.privacy.training import TrainingLedger, releases, training_noise
from common.run.config import RunConfig
from common.run.settings import DpSettings
from common.wire.messages import ClientUpdate, Phase, RoundPlan
from server.strategies.fold import Fold


class NoPrivacy:
    """A run without a training budget: its folds as the method opens them, nothing stated, nothing kept."""

    def wrap(self, fold: Fold) -> Fold:
        return fold

    def statement(self, plan: RoundPlan) -> dict[str, Any]:
        return {}

    def state_tensors(self) -> dict[str, Tensor]:
        return {}

    def load(self, tensors: dict[str, Tensor]) -> None:
        pass


class PrivateTraining:
    """The ledger of a run of a ``dp_training`` method with a budget, and its statements."""

    KEY = "dp/released"  # its state's name among the strategy's tensors

    def __init__(self, config: RunConfig, sends_grams: bool) -> None:
        self.settings = config.section(DpSettings)
        self.noise = training_noise(self.settings, config.local_epochs, config.rounds_per_task, sends_grams)
        self.ledger = TrainingLedger(self.settings, self.noise)

    @staticmethod
    def of(config: RunConfig, sends_grams: bool) -> PrivateTraining | None:
        """The account of ``config``'s run, or ``None`` when it has no budget or its method does not train privately."""
        dp = config.section(DpSettings)
        return PrivateTraining(config, sends_grams) if dp.local and method(config.method).dp_training else None

    def check(self, plan: RoundPlan) -> None:
        """``BudgetExceeded`` before a step that would release more than the clients' noise is calibrated for."""
        rounds, grams = releases(plan)
        if rounds or grams:
            self.ledger.check(plan.task, rounds, grams, f"task {plan.task} {plan.phase.value} step {plan.round}")

    def wrap(self, fold: Fold) -> Fold:
        """``fold``, refused (``BudgetExceeded``) when its step would release more than the clients' noise is
        calibrated for; its merge spends the step's releases. Each client noises its own: the aggregator as it is."""
        self.check(fold.plan)
        return fold.then(lambda: self.spend(fold.plan))

    def spend(self, plan: RoundPlan) -> None:
        """Record ``plan``'s merged step in the ledger."""
        rounds, grams = releases(plan)
        if rounds or grams:
            self.ledger.spend(plan.task, rounds, grams, f"task {plan.task} {plan.phase.value} step {plan.round}")

    def statement(self, plan: RoundPlan) -> dict[str, Any]:
        """The guarantee after ``plan``'s merged step, for the history (flat keys logged, ``dp`` nested)."""
        rounds, grams = releases(plan)
        if not rounds and not grams:
            return {}
        noise, done = self.noise, self.ledger.done[plan.task]
        return {
            "dp_epsilon": self.ledger.epsilon_spent(plan.task),
            "dp_delta": self.settings.delta,
            "dp": {
                "mode": "local",
                "mechanism": "dp-sgd" + (" + gaussian grams" if noise.grams else ""),
                "unit": "record",
                "adjacency": ADJACENCY,
                "noise": noise_statement(self.settings.seed),
                "run_epsilon": self.ledger.epsilon_spent(),
                "budget_epsilon": self.settings.epsilon,
                "clip": self.settings.clip,
                "sample_rate": noise.sample_rate,
                "steps_per_round": noise.steps,
                "noise_multiplier": noise.noise_multiplier,
                **(
                    {"gram_multiplier": noise.gram_multiplier, "gram_clip": self.settings.gram_clip}
                    if noise.grams
                    else {}
                ),
                "released": {"rounds": done[0], "grams": done[1]},
                "planned": {"rounds": noise.rounds, "grams": noise.grams},
                "public": ["num_samples"],
            },
        }

    def state_tensors(self) -> dict[str, Tensor]:
        return {self.KEY: self.ledger.state()}

    def load(self, tensors: dict[str, Tensor]) -> None:
        if self.KEY in tensors:
            self.ledger.load(tensors[self.KEY])


class ClippedChanges(Aggregator):
    """A step's updates under client-level DP (``common/privacy/client_level.py``): each checked by the method's own
    aggregator's rules, taken as a change from the plan and clipped, and summed with equal weights; :meth:`finish`
    folds the noised mean into the method's aggregator as its one update. No training loss is kept: it is a
    statistic of the clients' data that no noise covers."""

    def __init__(self, inner: Aggregator, noise: ClientLevelNoise) -> None:
        super().__init__(inner.plan, inner.declared)
        self.inner, self.noise = inner, noise
        self.sums: dict[str, Tensor] = {}
        self.template: ClientUpdate | None = None

    def _check(self, update: ClientUpdate) -> None:
        self.inner._check(update)

    def _fold(self, update: ClientUpdate) -> None:
        change = clipped_change(update.tensors, self.plan.tensors, self.noise.clip, self.plan.class_range)
        for name, d in change.items():
            self.sums[name] = self.sums[name] + d if name in self.sums else d
        self.template = update

    @property
    def mean_loss(self) -> float:
        return float("nan")

    def finish(self, source: NoiseSource) -> None:
        """Fold into the method's aggregator its one update: the plan plus the noised mean of the clipped changes."""
        assert self.template is not None and self.count, "a step with no update merges nothing"
        sigma = self.noise.noise_multiplier * self.noise.clip
        mean = noised_mean(self.sums, self.plan.tensors, self.count, sigma, self.plan.class_range, source)
        tensors = {name: mean.get(name, t) for name, t in self.template.tensors.items()}
        merged = dataclasses.replace(
            self.template, client_id="<mean>", tensors=tensors, num_samples=1, train_loss=float("nan")
        )
        self.inner.fold(merged, checked=True)


class ClientLevelPrivacy:
    """The account of a run with client-level DP (``dp.mode = client``, DP-FedAvg): the rounds released against the
    budget, each step's clipped and noised mean, and its statements."""

    KEY = "dp/client_rounds"

    def __init__(self, config: RunConfig) -> None:
        self.settings = config.section(DpSettings)
        self.noise = ClientLevelNoise.of(self.settings, run_rounds(config))
        self.ledger = ClientLevelLedger(self.settings, self.noise)

    @staticmethod
    def of(config: RunConfig) -> ClientLevelPrivacy | None:
        dp = config.section(DpSettings)
        return ClientLevelPrivacy(config) if dp.client_level else None

    def check(self, plan: RoundPlan) -> None:
        if plan.phase == Phase.TRAIN:
            self.ledger.check(f"task {plan.task} train step {plan.round}")

    def wrap(self, fold: Fold) -> Fold:
        """A training round's ``fold`` (refused beyond the budget) as clipped changes with equal weights, whose noised
        mean folds into the method's aggregator before its merge, and the round spent; any other step's as it is."""
        plan = fold.plan
        if plan.phase != Phase.TRAIN:
            return fold
        self.check(plan)

        def merged(plan: RoundPlan, clipped: ClippedChanges) -> None:
            clipped.finish(keyed_noise(self.settings.seed, f"client-level/{plan.task}/{plan.round}"))
            fold.finish()  # the method's merge of its aggregator, which holds the noised mean now
            self.spend(plan)

        return Fold(plan, ClippedChanges(fold.aggregator, self.noise), merged)

    def spend(self, plan: RoundPlan) -> None:
        """Record ``plan``'s merged training round in the ledger."""
        if plan.phase == Phase.TRAIN:
            self.ledger.spend(f"task {plan.task} train step {plan.round}")

    def statement(self, plan: RoundPlan) -> dict[str, Any]:
        if plan.phase != Phase.TRAIN:
            return {}
        spent = self.ledger.epsilon_spent()  # every client's: the unit is the client, in every task
        return {
            "dp_epsilon": spent,
            "dp_delta": self.settings.delta,
            "dp": {
                "mode": "client",
                "mechanism": "dp-fedavg (clipped changes, equal weights, gaussian)",
                "unit": "client",
                "adjacency": ADJACENCY,
                "noise": noise_statement(self.settings.seed),
                "run_epsilon": spent,
                "budget_epsilon": self.settings.epsilon,
                "clip": self.noise.clip,
                "noise_multiplier": self.noise.noise_multiplier,
                "released": {"rounds": self.ledger.released},
                "planned": {"rounds": self.noise.rounds},
                "public": ["num_samples", "clients"],
            },
        }

    def state_tensors(self) -> dict[str, Tensor]:
        return {self.KEY: torch.tensor([self.ledger.released], dtype=torch.int64)}

    def load(self, tensors: dict[str, Tensor]) -> None:
        if self.KEY in tensors:
            self.ledger.released = int(tensors[self.KEY][0])


TrainingPrivacy = NoPrivacy | PrivateTraining | ClientLevelPrivacy  # what wraps a strategy's folds


def training_privacy(config: RunConfig, sends_grams: bool) -> TrainingPrivacy:
    """The account of ``config``'s run: local mode's, client-level mode's, or none (no budget, or a method the
    coordinator noises itself)."""
    return PrivateTraining.of(config, sends_grams) or ClientLevelPrivacy.of(config) or NoPrivacy()
