"""FedProx (Li et al. 2020) on LoRA, the shared part of its slice: settings, its steps' instruction, and its
registration. The server half is ``server/strategies/fedprox.py``, the client half ``client/methods/fedprox.py``.

FedAvg of the LoRA factors and the head, where each client adds the proximal term ``mu / 2 ||w - w^t||^2`` to
its loss: ``w`` the parameters it trains (both factors of every layer and the head), ``w^t`` the global ones it
received. The coordinator hands ``mu`` out with every step (:class:`FedProxStep`), so a schedule of ``mu``
needs no client change; the updates are FedAvg-LoRA's, and so are what a step declares and how it folds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.methods import Method
from common.run.settings import Settings, finite_number, setting
from common.wire.instructions import LoraStep


@dataclass(frozen=True)
class FedProxSettings(Settings):
    """FedProx (``fedprox``): FedAvg-LoRA with a proximal term on the trained parameters."""

    section: ClassVar[str] = "fedprox"
    mu: float = setting(0.01, "mu of the proximal term mu / 2 ||w - w_global||^2 over the trained parameters (0.01)")

    def __post_init__(self) -> None:
        finite_number("fedprox.mu", self.mu, 0.0)


@dataclass(frozen=True)
class FedProxStep(LoraStep):
    """A FedProx training round: LoRA's step, and the proximal term's ``mu``."""

    KIND: ClassVar[str] = "fedprox"
    mu: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        finite_number("mu", self.mu, 0.0)


METHOD = Method(
    "fedprox",
    "server.strategies.fedprox:FedProx",
    "client.methods.fedprox:FedProxTrainer",
    "FedProx: FedAvg of LoRA factors and head, each client's loss with the proximal term mu/2 ||w - w_global||^2",
    FedProxSettings,
    steps=frozenset({("train", "fedprox")}),
    aggregator="common.aggregation.lora:fedavg_lora",
)
