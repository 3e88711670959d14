"""Learning without forgetting (Li & Hoiem 2017), federated by FedAvg: the shared part of its slice, its
settings and its registration. The server half is ``server/strategies/continual.py`` (``LwF``), the client
half ``client/methods/continual.py`` (``LwfTrainer``: the dense training with distillation on the old classes
from the previous task's model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.methods import DENSE_ROUNDS, Method
from common.run.settings import Settings, finite_number, setting


@dataclass(frozen=True)
class LwfSettings(Settings):
    """Learning without forgetting (``lwf``), federated: FedAvg of the weights, distillation on clients."""

    section: ClassVar[str] = "lwf"
    alpha: float = setting(0.5, "weight of the distillation loss (the paper's code's alpha)")
    temperature: float = setting(2.0, "softmax temperature of teacher and student on the old classes")

    def __post_init__(self) -> None:
        finite_number("lwf.alpha", self.alpha, 0.0)
        finite_number("lwf.temperature", self.temperature, 0.0, strict=True)


METHOD = Method(
    "lwf",
    "server.strategies.continual:LwF",
    "client.methods.continual:LwfTrainer",
    "LwF: full fine-tuning with distillation on the old classes from the previous task's model, FedAvg",
    LwfSettings,
    steps=DENSE_ROUNDS,
    aggregator="common.aggregation.dense:fedavg",
)
