"""FedProto (Tan et al. 2022), the shared part of its slice: settings, the prototypes' tensors, what a
step declares, how its updates fold (:class:`FedProtoAggregator`), and its registration. The server half is
``server/strategies/fedproto.py``, the client half ``client/methods/prototypes.py``; both import this module
and neither imports the other.

Clients fine-tune every backbone weight and the head (FedAvg's ``DenseStep``) with ACE plus the prototype
loss, and send, besides FedAvg's delta and head, the task's classes' feature sums and counts at their
trained weights. Every plan carries the global prototypes of the classes seen so far as ``proto/mean``
``(C, F)`` and ``proto/count`` ``(C,)`` (0: no prototype yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.aggregation.declared import Shapes, class_sum_shapes, declared_tensors, stat_shapes, trained_tensors
from common.aggregation.dense import FedAvgAggregator
from common.aggregation.features import StatSums, check_class_counts
from common.methods import DENSE_ROUNDS, Method
from common.run.config import RunConfig
from common.run.settings import Settings, finite_number, setting
from common.wire.instructions import Mode
from common.wire.messages import ClientUpdate, ModelSpec, Phase, RoundPlan
from common.wire.tensors import STAT

PROTO = "proto"  # a plan's global prototypes: proto/mean (C, F) and proto/count (C,)


@dataclass(frozen=True)
class FedProtoSettings(Settings):
    """FedProto (``fedproto``): FedAvg, with clients pulled towards the global class prototypes."""

    section: ClassVar[str] = "fedproto"
    weight: float = setting(
        0.1, "lambda of the prototype loss lambda * mean ||f(x) - p_y||^2 / F (the paper's code: ld_reg 0.1)"
    )
    classify: str = setting(
        "head", "'head' (the ACE head, as the paper ran it) or 'prototype' (nearest global prototype, FedProto's)"
    )

    def __post_init__(self) -> None:
        finite_number("fedproto.weight", self.weight, 0.0)
        if self.classify not in ("head", "prototype"):
            raise ValueError(f"setting fedproto.classify must be 'head' or 'prototype', got {self.classify!r}")


def declare(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Shapes:
    """FedAvg's tensors, and in a training round the task's class sums ``stat/class_sum (C_t, F)`` and counts
    ``stat/class_count (C_t,)``: the clients' prototypes."""
    shapes = trained_tensors(plan, spec, config)
    if plan.mode == Mode.FULL and plan.phase == Phase.TRAIN:
        shapes |= stat_shapes(class_sum_shapes(plan, spec))
    return shapes


class FedProtoAggregator(FedAvgAggregator):
    """FedAvg's means, and the sums of the clients' class sums and counts."""

    PARTS = (
        "delta",
        "head",
        "bias",
        "sums",
    )  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec) -> None:
        super().__init__(plan, declared, spec)
        self.sums = StatSums(class_sum_shapes(plan, spec))

    def _check(self, update: ClientUpdate) -> None:
        check_class_counts(update)

    def _fold(self, update: ClientUpdate) -> None:
        super()._fold(update)
        self.sums.fold(update.named(STAT))


def aggregator(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> FedProtoAggregator:
    """A step's aggregator: FedAvg's, with the sums of the task's classes' features and counts."""
    return FedProtoAggregator(plan, declared_tensors(plan, spec, config), spec)


METHOD = Method(
    "fedproto",
    "server.strategies.fedproto:FedProto",
    "client.methods.prototypes:FedProtoTrainer",
    "FedProto: FedAvg, with each sample's features pulled to its class's global prototype",
    FedProtoSettings,
    declare=declare,
    steps=DENSE_ROUNDS,
    aggregator="common.methods.fedproto:aggregator",
)
