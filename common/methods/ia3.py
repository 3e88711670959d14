"""LoRM with (IA)^3 modules (``lorm-ia3``), the shared part of its slice: its settings, what its steps declare
and its registration. The server half is ``server/strategies/ia3.py``, the client half ``client/methods/ia3.py``;
the layer is ``common/adapters/ia3.py`` (``adapter="ia3"``), its merges ``common/merges/vectors.py``; its rounds
fold into :class:`IA3RoundAggregator` (LoRM's round, with the vector's merges), its task steps into
:class:`IA3TaskAggregator`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.adapters.ia3 import SIDE, apply_ia3
from common.aggregation.base import Aggregator, Phased
from common.aggregation.declared import Shapes, declared_tensors, step_head_shapes
from common.aggregation.lora import RoundAggregator
from common.merges.grams import GramSum
from common.merges.vectors import ia3_accumulator, ia3_statistic_shape
from common.methods import LORM_STEPS, Method
from common.run.config import RunConfig
from common.run.settings import Settings, setting
from common.wire.instructions import GramKind, LoraStep
from common.wire.messages import ClientUpdate, ModelSpec, Phase, RoundPlan
from common.wire.tensors import FACTOR, GRAM, tensor_name


@dataclass(frozen=True)
class Ia3Settings(Settings):
    """LoRM with (IA)^3 modules (``lorm-ia3``): a trained vector rescales each target layer's output or input,
    merged in closed form (docs/METHOD.md §6, "Other adapters: exact merges")."""

    section: ClassVar[str] = "ia3"
    side: str = setting("output", "output: l o (W0 x), the paper's appendix; input: W0 (l o x)")
    form: str = setting(
        "exact",
        "exact: the least-squares merges of SPEC §5; appendix: the paper's appendix formula (output side, "
        "diagonal Grams: RegMean of the dense deltas, divided element-wise by W0, row means)",
    )

    def __post_init__(self) -> None:
        if self.side not in ("output", "input"):
            raise ValueError(f"setting ia3.side should be 'output' or 'input', got {self.side!r}")
        if self.form not in ("exact", "appendix"):
            raise ValueError(f"setting ia3.form should be 'exact' or 'appendix', got {self.form!r}")
        if self.form == "appendix" and self.side == "input":
            raise ValueError("setting ia3.form=appendix: the paper's appendix gives a formula for the output side only")


def declare(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> Shapes:
    """A step's tensors (``common/adapters/ia3.py``): a training round's trained vector per layer (``(d_out,)`` on
    the output, ``(d_in,)`` on the input), in every step its Gram statistic
    (``common.merges.vectors.ia3_statistic``), and the head the step asks for."""
    settings = config.section(Ia3Settings)
    step = plan.expect(LoraStep)
    side, full = SIDE[settings.side], step.gram == GramKind.FULL
    shapes: Shapes = {}
    for name, (d_out, d_in) in spec.layers.items():
        if plan.phase == Phase.TRAIN:
            shapes[tensor_name(FACTOR, name, side)] = (d_out,) if side == "B" else (d_in,)
        if step.gram != GramKind.NONE:
            shapes[tensor_name(GRAM, name)] = ia3_statistic_shape(side, settings.form, d_out, d_in, full)
    return shapes | step_head_shapes(step, spec)


class IA3RoundAggregator(RoundAggregator):
    """One (IA)^3 round: the vector per layer, from the clients' statistics (already decayed)."""

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, config: RunConfig) -> None:
        step = plan.expect(LoraStep)
        (side,) = step.train_factors
        form, full = config.section(Ia3Settings).form, step.gram == GramKind.FULL
        layers = {name: ia3_accumulator(side, form, d_out, d_in, full) for name, (d_out, d_in) in spec.layers.items()}
        super().__init__(plan, declared, spec, config, layers)


class IA3TaskAggregator(Aggregator):
    """End of task: each layer's statistic summed over clients (the task's weights in the task merge)."""

    PARTS = ("stats",)  # its running sums (common/merges/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec) -> None:
        super().__init__(plan, declared)
        self.stats = {name: GramSum(declared[f"gram/{name}"][0]) for name in spec.layers}

    def _fold(self, update: ClientUpdate) -> None:
        grams = update.named(GRAM)
        for name, acc in self.stats.items():
            acc.fold(grams[name])


def ia3_round(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> IA3RoundAggregator:
    """An (IA)^3 training round: the closed-form merge of the vector."""
    return IA3RoundAggregator(plan, declared_tensors(plan, spec, config), spec, config)


def ia3_task(plan: RoundPlan, spec: ModelSpec, config: RunConfig) -> IA3TaskAggregator:
    """An (IA)^3 task step: each layer's statistic, summed."""
    return IA3TaskAggregator(plan, declared_tensors(plan, spec, config), spec)


# LoRM with (IA)^3: a training round's closed-form merge of the vector, a task step's summed statistics
aggregator = Phased(Phase.TRAIN, ia3_round, ia3_task)


METHOD = Method(
    "lorm-ia3",
    "server.strategies.ia3:LoRMIA3",
    "client.methods.ia3:IA3Trainer",
    "LoRM with (IA)^3 modules: one vector per layer per round, closed-form merges",
    Ia3Settings,
    adapter="ia3",
    apply_adapter=lambda backbone, config: apply_ia3(backbone, SIDE[config.section(Ia3Settings).side]),
    declare=declare,
    steps=LORM_STEPS,
    aggregator="common.methods.ia3:aggregator",
)
