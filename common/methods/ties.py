"""TIES merging with full fine-tuning (Yadav et al. 2023), the shared part of its slice: its settings and its
registration. The server half is ``server/strategies/ties.py``; its clients train as ``fedavg``'s (the dense
client half), and its fold, the per-sign running sums, is ``common.aggregation.dense:ties``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from common.methods import DENSE, DENSE_ROUNDS, Method
from common.run.settings import Settings, setting


@dataclass(frozen=True)
class TiesSettings(Settings):
    """TIES merging (``ties``)."""

    section: ClassVar[str] = "ties"
    density: float = setting(0.3, "k: the fraction of entries of largest magnitude each client keeps, in (0, 1]")
    scale: float = setting(0.4, "lambda: the merged task vector's step size")

    def __post_init__(self) -> None:
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"setting ties.density should lie in (0, 1], got {self.density}")
        if not math.isfinite(self.scale):
            raise ValueError(f"setting ties.scale should be finite, got {self.scale}")


METHOD = Method(
    "ties",
    "server.strategies.ties:Ties",
    DENSE,
    "TIES merging, full fine-tuning",
    TiesSettings,
    steps=DENSE_ROUNDS,
    aggregator="common.aggregation.dense:ties",
)
