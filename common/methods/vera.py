"""LoRM with VeRA modules (``lorm-vera``), the shared part of its slice: its settings, what its steps declare
and its registration. The server half is ``server/strategies/vera.py``, the client half
``client/methods/vera.py``; the layer is ``common/adapters/vera.py`` (``adapter="vera"``), its merges
``common/merges/vectors.py``, and how its steps fold lives with the other adapters' in
``common/aggregation/lora.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.adapters.vera import apply_vera
from common.aggregation.declared import Shapes, gram_shapes, step_head_shapes
from common.merges.vectors import vera_sends_diagonal
from common.methods import LORM_STEPS, Method
from common.run.config import RunConfig
from common.run.settings import Settings, at_least_one, finite_number, setting
from common.wire.instructions import GramKind, LoraStep
from common.wire.messages import ModelSpec, Phase, RoundPlan
from common.wire.tensors import FACTOR, GRAM, tensor_name


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
    aggregator="common.aggregation.lora:vera",
)
