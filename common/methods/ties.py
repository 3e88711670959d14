"""TIES merging with full fine-tuning (Yadav et al. 2023), the shared part of its slice: its settings and its
registration. The server half is ``server/strategies/ties.py``; its clients train as ``fedavg``'s (the dense
client half), and its fold, the per-sign running sums, is :class:`TiesAggregator`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from common.aggregation.base import Aggregator
from common.aggregation.declared import Shapes, declared_tensors
from common.aggregation.dense import head_delta
from common.merges.dense import TiesAccumulator
from common.methods import DENSE, DENSE_ROUNDS, Method
from common.run.config import RunConfig
from common.run.settings import Settings, setting
from common.wire.messages import ClientUpdate, ModelSpec, RoundPlan
from common.wire.tensors import DELTA

HEAD_W, HEAD_B = "<head>.weight", "<head>.bias"  # the head's entries of TIES' task vector


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


class TiesAggregator(Aggregator):
    """TIES of the clients' task vectors: every backbone delta and the head's change, trimmed, sign-elected."""

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, density: float) -> None:
        super().__init__(plan, declared)
        self.spec = spec
        shapes = {name: tuple(shape) for name, shape in spec.params.items()}
        shapes |= {HEAD_W: (spec.num_classes, spec.feature_dim), HEAD_B: (spec.num_classes,)}
        self.ties = TiesAccumulator(shapes, density)

    def _fold(self, update: ClientUpdate) -> None:
        dw, db = head_delta(update, self.plan)
        self.ties.fold(update.named(DELTA) | {HEAD_W: dw, HEAD_B: db})


def aggregator(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> TiesAggregator:
    """TIES of the clients' task vectors, each trimmed to ``ties.density`` of its entries."""
    return TiesAggregator(plan, declared_tensors(plan, spec, config), spec, config.section(TiesSettings).density)


METHOD = Method(
    "ties",
    "server.strategies.ties:Ties",
    DENSE,
    "TIES merging, full fine-tuning",
    TiesSettings,
    steps=DENSE_ROUNDS,
    aggregator="common.methods.ties:aggregator",
)
