"""PILoRA (Guo et al. 2024), the shared part of its slice: settings, what a step declares, how its updates
fold (:class:`PiLoraAggregator`), and its registration. The server half is ``server/strategies/pilora.py``,
the client half ``client/methods/pilora.py``.

Each task trains a LoRA module of its own on top of the earlier tasks' (``LoraStep`` with ``train_extra``),
and classes are scored by learned prototypes, which every plan carries as FedProto's ``proto/mean``
``(C, F)`` and ``proto/count`` ``(C,)``. A training round's update carries, besides the factors, the task's
class sums and counts and the client's trained prototypes ``stat/prototype (C_t, F)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from common.aggregation.base import Aggregator
from common.aggregation.declared import Shapes, class_sum_shapes, declared_tensors, stat_shapes, trained_tensors
from common.aggregation.features import check_class_counts
from common.merges.regmean import WeightedMeanAccumulator
from common.methods import LORA_ROUNDS, Method
from common.run.config import RunConfig
from common.run.settings import Settings, finite_number, setting
from common.wire.instructions import Mode
from common.wire.messages import ClientUpdate, ModelSpec, Phase, RoundPlan
from common.wire.tensors import FACTOR, LORA, STAT

DTYPE = torch.float64


@dataclass(frozen=True)
class PiLoraSettings(Settings):
    """PILoRA (``pilora``): an incremental LoRA per task classified by learned class prototypes."""

    section: ClassVar[str] = "pilora"
    temperature: float = setting(1.0, "T of the distance-based cross-entropy over -||f(x) - p_c|| / (sqrt(F) T) (1)")
    pl: float = setting(0.001, "weight of the prototype loss, the mean scaled distance to the own class's (0.001)")
    ort: float = setting(0.5, "weight of the orthogonality loss sum |A_t A_old^T| over layers (0.5)")
    soft_temp: float = setting(
        5.0,
        "factor of the min-max-normalised reciprocal distances in the re-weighting softmax: 5, PILoRA's "
        "(its code divides by a temperature of 0.2); 0.2 is the LoRM paper's code (it multiplies by 0.2: "
        "clients weighted nearly alike)",
    )
    init: float = setting(0.1, "standard deviation of a new class prototype, drawn N(0, init^2) (0.1)")

    def __post_init__(self) -> None:
        finite_number("pilora.temperature", self.temperature, 0.0, strict=True)
        for key in ("pl", "ort", "soft_temp", "init"):
            finite_number(f"pilora.{key}", getattr(self, key), 0.0)


def declare(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Shapes:
    """The LoRA step's tensors, and in a training round the task's class sums and counts and the client's
    trained prototypes ``stat/prototype (C_t, F)``."""
    shapes = trained_tensors(plan, spec, config)
    if plan.mode == Mode.LORA and plan.phase == Phase.TRAIN:
        sums = class_sum_shapes(plan, spec)
        shapes |= stat_shapes(sums | {"prototype": sums["class_sum"]})
    return shapes


class PiLoraAggregator(Aggregator):
    """FedAvg of the task's factors; every client's prototypes and class sums, for the re-weighting."""

    def __init__(self, plan: RoundPlan, declared: Shapes) -> None:
        super().__init__(plan, declared)
        shared = plan.low_rank(LORA)
        self.b = {name: WeightedMeanAccumulator(tuple(f.b.shape)) for name, f in shared.items()}
        self.a = {name: WeightedMeanAccumulator(tuple(f.a.shape)) for name, f in shared.items()}
        self.prototypes: list[Tensor] = []  # per client (C_t, F)
        self.class_sums: list[Tensor] = []
        self.class_counts: list[Tensor] = []

    def _check(self, update: ClientUpdate) -> None:
        check_class_counts(update)

    def _fold(self, update: ClientUpdate) -> None:
        n = update.num_samples
        for name, f in update.by_layer(FACTOR).items():
            self.b[name].fold(f["B"], n)
            self.a[name].fold(f["A"], n)
        if n == 0:  # a client on its own data with none of the task's samples: its prototypes were not trained
            return
        stats = update.named(STAT)
        self.prototypes.append(stats["prototype"].to(DTYPE))
        self.class_sums.append(stats["class_sum"].to(DTYPE))
        self.class_counts.append(stats["class_count"].to(DTYPE))


def aggregator(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> PiLoraAggregator:
    """A step's aggregator: FedAvg of the factors, and every client's prototypes and class sums (not summable:
    the re-weighting needs them one by one)."""
    return PiLoraAggregator(plan, declared_tensors(plan, spec, config))


METHOD = Method(
    "pilora",
    "server.strategies.pilora:PiLoRA",
    "client.methods.pilora:PiLoraTrainer",
    "PILoRA: a LoRA module per task, classes scored by prototypes re-weighted across clients, FedAvg",
    PiLoraSettings,
    declare=declare,
    steps=LORA_ROUNDS,
    aggregator="common.methods.pilora:aggregator",
)
