"""The coordinator's account of a trained method's privacy budget (``dp.mode = local``, ``common/privacy/training.py``).

Each client noises what it trains and sends; the coordinator adds nothing. It keeps the ledger of the releases each
task's records have been through, refuses to start a step beyond the plan the clients calibrated their noise for,
and states the epsilon spent in the step's history entry and log line (and so in ``metrics.json`` and every export).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from common.methods import method
from common.privacy.training import TrainingLedger, releases, training_noise
from common.run.config import RunConfig
from common.run.settings import DpSettings
from common.wire.messages import RoundPlan


class PrivateTraining:
    """The ledger of a run of a ``dp_training`` method with a budget, and its statements."""

    def __init__(self, config: RunConfig, sends_grams: bool) -> None:
        self.settings = config.section(DpSettings)
        self.noise = training_noise(self.settings, config.local_epochs, config.rounds_per_task, sends_grams)
        self.ledger = TrainingLedger(self.settings, self.noise)

    @staticmethod
    def of(config: RunConfig, sends_grams: bool) -> PrivateTraining | None:
        """The account of ``config``'s run, or ``None`` when it has no budget or its method does not train privately."""
        dp = config.section(DpSettings)
        return PrivateTraining(config, sends_grams) if dp.enabled and method(config.method).dp_training else None

    def check(self, plan: RoundPlan) -> None:
        """``BudgetExceeded`` before a step that would release more than the clients' noise is calibrated for."""
        rounds, grams = releases(plan)
        if rounds or grams:
            self.ledger.check(plan.task, rounds, grams, f"task {plan.task} {plan.phase.value} step {plan.round}")

    def spend(self, plan: RoundPlan) -> dict[str, Any]:
        """Record ``plan``'s merged step; its guarantee for the history (flat keys logged, ``dp`` nested)."""
        rounds, grams = releases(plan)
        if not rounds and not grams:
            return {}
        self.ledger.spend(plan.task, rounds, grams, f"task {plan.task} {plan.phase.value} step {plan.round}")
        noise, done = self.noise, self.ledger.done[plan.task]
        return {
            "dp_epsilon": self.ledger.epsilon_spent(plan.task),
            "dp_delta": self.settings.delta,
            "dp": {
                "mode": "local",
                "mechanism": "dp-sgd" + (" + gaussian grams" if noise.grams else ""),
                "unit": "record",
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

    def state(self) -> Tensor:
        return self.ledger.state()

    def load(self, tensors: dict[str, Tensor]) -> None:
        if "dp/released" in tensors:
            self.ledger.load(tensors["dp/released"])
