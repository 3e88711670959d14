"""Elastic weight consolidation (Kirkpatrick et al. 2017), federated by FedAvg: the shared part of its slice,
its settings and its registration. The server half is ``server/strategies/continual.py`` (``EWC``), the
client half ``client/methods/continual.py`` (``EwcTrainer``: the dense training with the Fisher penalty, and
the Fisher at a task's end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.methods import DENSE_ROUNDS, Method
from common.run.settings import Settings, finite_number, setting


@dataclass(frozen=True)
class EwcSettings(Settings):
    """Elastic weight consolidation (``ewc``), federated: FedAvg of the weights, the penalty on clients."""

    section: ClassVar[str] = "ewc"
    strength: float = setting(
        2.0, "lambda of the penalty lambda/2 sum_k F_k (theta_k - theta*_k)^2 (2: the paper's code's ewc_lambda 1)"
    )
    decay: float = setting(
        0.9, "F <- decay F + F_task at each task's end (the paper's code's ewc_gamma; 1: a plain sum)"
    )

    def __post_init__(self) -> None:
        finite_number("ewc.strength", self.strength, 0.0)
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"setting ewc.decay must lie in [0, 1], got {self.decay}")


METHOD = Method(
    "ewc",
    "server.strategies.continual:EWC",
    "client.methods.continual:EwcTrainer",
    "EWC: full fine-tuning with the Fisher penalty around the previous task's weights, FedAvg",
    EwcSettings,
    steps=DENSE_ROUNDS | {("task_gram", "dense")},
    aggregator="common.aggregation.dense:ewc",
)
