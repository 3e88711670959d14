"""LoRM with VeRA modules (``lorm-vera``), the shared part of its slice: its settings, what its steps declare
and its registration. The server half is ``server/strategies/vera.py``, the client half
``client/methods/vera.py``; the layer is ``common/adapters/vera.py`` (``adapter="vera"``), its merges
``common/merges/vectors.py``; its rounds fold into :class:`VeRARoundAggregator` (LoRM's round, with VeRA's
merges), its task Gram steps into LoRM's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from common.adapters.vera import apply_vera, frozen_matrices
from common.aggregation.base import Phased
from common.aggregation.declared import Shapes, declared_tensors, gram_shapes, step_head_shapes
from common.aggregation.lora import RoundAggregator, lorm
from common.merges.vectors import vera_accumulator, vera_sends_diagonal
from common.methods import LORM_STEPS, Method
from common.run.config import RunConfig
from common.run.settings import Settings, at_least_one, finite_number, setting
from common.wire.instructions import GramKind, LoraStep
from common.wire.messages import ModelSpec, Phase, RoundPlan
from common.wire.tensors import FACTOR, GRAM, VECTOR, tensor_name


@dataclass(frozen=True)
class VeraSettings(Settings):
    """LoRM with VeRA modules (``lorm-vera``): frozen seeded random ``B, A`` per layer, trained vectors
    ``lb`` and ``ld`` merged in closed form (docs/METHOD.md §6, "Other adapters: exact merges")."""

    section: ClassVar[str] = "vera"
    rank: int = setting(64, "r: the width of the frozen random B (d_out, r) and A (r, d_in); ld has r entries")
    d_init: float = setting(0.1, "the value of every entry of ld at a task's start (lb starts at 0), as VeRA")
    form: str = setting(
        "exact",
        "exact: the least-squares merges of SPEC §5; appendix: the paper's appendix formulas "
        "(RegMean of the dense deltas, divided element-wise by the frozen matrix, row means)",
    )

    def __post_init__(self) -> None:
        at_least_one(self, "rank")
        finite_number("vera.d_init", self.d_init, 0.0)
        if self.form not in ("exact", "appendix"):
            raise ValueError(f"setting vera.form should be 'exact' or 'appendix', got {self.form!r}")


def declare(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Shapes:
    """A step's tensors (``common/adapters/vera.py``): a training round's trained vector per layer (``"B"``: ``lb
    (d_out,)``, ``"A"``: ``ld (r,)``) and its Gram statistic (``common.merges.vectors.vera_statistic``: exact
    ``(d_out,)``, ``(r, r)`` or the diagonal Gram; appendix ``(r, r)`` or the Gram); a task's Gram step: the
    Grams; and the head the step asks for."""
    settings, step = config.section(VeraSettings), plan.expect(LoraStep)
    full, r, head = step.gram == GramKind.FULL, settings.rank, step_head_shapes(step, spec)
    if plan.phase != Phase.TRAIN:
        return (gram_shapes(spec, full) if step.gram != GramKind.NONE else {}) | head
    shapes: Shapes = {}
    for name, (d_out, d_in) in spec.layers.items():
        for side in step.train_factors:
            shapes[tensor_name(FACTOR, name, side)] = (d_out,) if side == "B" else (r,)
            if side == "A" and settings.form == "appendix":
                shapes[tensor_name(GRAM, name)] = (d_in, d_in) if full else (d_in,)
            elif side == "A" and vera_sends_diagonal(settings.form, full, r, d_in):
                shapes[tensor_name(GRAM, name)] = (d_in,)
            else:
                shapes[tensor_name(GRAM, name)] = (d_out,) if side == "B" and settings.form == "exact" else (r, r)
    return shapes | head


class VeRARoundAggregator(RoundAggregator):
    """One VeRA round: the trained vector per layer, from the clients' Gram statistics (already decayed)."""

    def __init__(
        self,
        plan: RoundPlan,
        declared: Shapes,
        spec: ModelSpec,
        config: RunConfig,
        frozen: dict[str, tuple[Tensor, Tensor]],
    ) -> None:
        (active,) = plan.expect(LoraStep).train_factors
        form = config.section(VeraSettings).form
        # the shared vectors as published: the ones the clients trained against and computed with
        vectors = plan.by_layer(VECTOR)
        layers = {
            name: vera_accumulator(active, form, *frozen[name], vectors[name]["B"], vectors[name]["A"])
            for name in spec.layers
        }
        super().__init__(plan, declared, spec, config, layers)


def vera_frozen(spec: ModelSpec, config: RunConfig) -> dict[str, tuple[Tensor, Tensor]]:
    """VeRA's frozen ``B (d_out, r)``, ``A (r, d_in)`` per layer, float64: drawn from the run's seed and the
    layer's name alone (``common.adapters.vera.frozen_matrices``), as every client draws them."""
    rank = config.section(VeraSettings).rank
    frozen = {}
    for name, (d_out, d_in) in spec.layers.items():
        b, a = frozen_matrices(config.seed, name, d_out, d_in, rank)
        frozen[name] = (b.to(torch.float64), a.to(torch.float64))
    return frozen


def vera_round(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> VeRARoundAggregator:
    """A VeRA training round: the closed-form merge of the trained vector."""
    return VeRARoundAggregator(plan, declared_tensors(plan, spec, config), spec, config, vera_frozen(spec, config))


# LoRM with VeRA: a training round's closed-form merge of the trained vector, LoRM's task Gram step
aggregator = Phased(Phase.TRAIN, vera_round, lorm)


METHOD = Method(
    "lorm-vera",
    "server.strategies.vera:LoRMVeRA",
    "client.methods.vera:VeRATrainer",
    "LoRM with VeRA modules: alternating lb/ld rounds, closed-form merges",
    VeraSettings,
    adapter="vera",
    apply_adapter=lambda backbone, config: apply_vera(backbone, config.section(VeraSettings).rank, config.seed),
    declare=declare,
    steps=LORM_STEPS,
    aggregator="common.methods.vera:aggregator",
)
