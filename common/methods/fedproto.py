"""FedProto (Tan et al. 2022), the shared part of its slice: settings, the prototypes' tensors, what a
step declares, and its registration. The server half is ``server/strategies/fedproto.py``, the client half
``client/methods/prototypes.py``; both import this module and neither imports the other.

Clients fine-tune every backbone weight and the head (FedAvg's ``DenseStep``) with ACE plus the prototype
loss, and send, besides FedAvg's delta and head, the task's classes' feature sums and counts at their
trained weights. Every plan carries the global prototypes of the classes seen so far as ``proto/mean``
``(C, F)`` and ``proto/count`` ``(C,)`` (0: no prototype yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.config import RunConfig
from common.declared import Shapes, class_sum_shapes, stat_shapes, trained_tensors
from common.messages import Mode, ModelSpec, Phase, RoundPlan
from common.methods import Method
from common.settings import Settings, finite_number, setting

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


METHOD = Method(
    "fedproto",
    "server.strategies.fedproto:FedProto",
    "client.methods.prototypes:FedProtoTrainer",
    "FedProto: FedAvg, with each sample's features pulled to its class's global prototype",
    FedProtoSettings,
    declare=declare,
)
