"""LoRM with VeRA modules (docs/METHOD.md §6, "Other adapters: exact merges"): LoRM's rounds and task merge,
VeRA's vectors.

Each layer's update is ``diag(lb) B diag(ld) A`` with frozen seeded ``B, A`` (``common/adapters/vera.py``).
Rounds alternate the trained vector as LoRM alternates its factors: ``lb`` (side ``"B"``) with
``ld`` shared, then ``ld`` (side ``"A"``) with ``lb`` shared. Each round merges in closed form
(``common.merges.vectors``): exactly (least squares, ``vera.form=exact``) or by the paper's appendix
formulas (``vera.form=appendix``). Clients send their vector and a statistic of their Gram (``c_i``
or ``A G_i A^T``), never a dense Gram. A finished task's delta is the low-rank product
``(diag(lb) B diag(ld)) A``, so the task-level RegMean, the Gram views and the export are LoRM's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from common.adapters.vera import SIDES, product
from common.methods.vera import VeRARoundAggregator, VeraSettings, vera_frozen, vera_round
from common.run.config import RunConfig
from common.wire.messages import LowRank, ModelSpec, Phase, RoundPlan
from common.wire.tensors import LORA, VECTOR, layered
from server.strategies.fold import Fold
from server.strategies.lorm import LoRM

F64 = torch.float64


class LoRMVeRA(LoRM):
    name = "lorm-vera"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.settings = config.section(VeraSettings)
        self.frozen = vera_frozen(spec, config)  # B (d_out, r), A (r, d_in) per layer, float64
        self.vectors: dict[str, dict[str, Tensor]] = {}  # the current task's lb ("B") and ld ("A"), float64

    def begin_task(self, task: int) -> None:
        """Fresh vectors for every task: ``lb = 0``, ``ld = d_init`` (VeRA's initialisation)."""
        r = self.settings.rank
        self._set_vectors(
            {
                name: {"B": torch.zeros(d_out, dtype=F64), "A": torch.full((r,), self.settings.d_init, dtype=F64)}
                for name, (d_out, _) in self.spec.layers.items()
            }
        )

    def _set_vectors(self, vectors: dict[str, dict[str, Tensor]]) -> None:
        """The vectors, and LoRM's ``shared`` factors as their low-rank product (what a task stores)."""
        self.vectors = vectors
        self.shared = {name: LowRank(*product(v["B"], v["A"], *self.frozen[name])) for name, v in vectors.items()}

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        plan = super().configure(task, round_, phase)
        # the current delta travels as its vectors, not as lora/*: the frozen B, A are rebuilt by clients
        vectors = layered(
            VECTOR, {name: {s: v[s].to(torch.float32) for s in SIDES} for name, v in self.vectors.items()}
        )
        plan.tensors = {name: t for name, t in plan.tensors.items() if not name.startswith(LORA + "/")} | vectors
        return plan

    def open_round(self, plan: RoundPlan) -> Fold:
        return Fold(plan, vera_round(plan, self.spec, self.config), self.merge_vectors)

    def merge_vectors(self, plan: RoundPlan, aggregator: VeRARoundAggregator) -> None:
        """The round's closed-form merge of the trained vector, and the head."""
        side = aggregator.active
        # The other side: the published one, which the clients trained against and the merge used.
        self._set_vectors(
            {
                name: {s: v.to(F64) for s, v in plan.by_layer(VECTOR)[name].items()} | {side: acc.result()}
                for name, acc in aggregator.layers.items()
            }
        )
        self.head_w = aggregator.head.result()
        self.head_b = aggregator.bias.result()

    def state_tensors(self) -> dict[str, Tensor]:
        return super().state_tensors() | {
            f"vectors/{name}/{side}": t for name, v in self.vectors.items() for side, t in v.items()
        }

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        if f"vectors/{next(iter(self.spec.layers))}/B" in tensors:
            self._set_vectors(
                {name: {side: tensors[f"vectors/{name}/{side}"] for side in SIDES} for name in self.spec.layers}
            )
