"""LoRM with (IA)^3 modules (docs/METHOD.md §6, "Other adapters: exact merges"): one trained vector per layer,
merged exactly.

Each target layer's update is ``dW = diag(l) W0`` (``ia3.side=output``, the paper's appendix) or
``W0 diag(l)`` (``input``), ``l`` zero at a task's start (``common/adapters/ia3.py``). Every training round
trains ``l`` (there is one vector: nothing to alternate) and merges the clients' vectors in
closed form from their statistics (``common.merges.vectors.ia3_statistic``: ``e_i`` of length
``d_out``, or ``(W0^T W0) o G_i``): the coordinator never holds ``W0`` nor a dense Gram.

Across tasks, as LoRM, every task's delta is merged by minimising ``sum_t ||dW X_t - dW_t X_t||^2``
with the task's global Gram, here over the (IA)^3 family: the same closed form with each task's
statistic summed over its clients (the task Gram step sends it). RegMean over dense deltas would
leave the family (a dense ``d_out x d_in`` delta); this keeps the model an (IA)^3 model, exported as
its vectors. Gram passes see ``W0 + (sum_{tau<t} dW_tau + dW) / (t + 1)`` as LoRM's do.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from common.adapters.ia3 import SIDE
from common.merges.vectors import ia3_accumulator
from common.methods.ia3 import IA3RoundAggregator, Ia3Settings, IA3TaskAggregator, ia3_round, ia3_task
from common.run.config import RunConfig
from common.wire.instructions import LoraStep
from common.wire.messages import LowRank, ModelSpec, Phase, RoundPlan
from common.wire.tensors import VECTOR, layered
from server.strategies.fold import Fold
from server.strategies.lorm import TaskGramStrategy

F64 = torch.float64


class LoRMIA3(TaskGramStrategy):
    name = "lorm-ia3"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.settings = config.section(Ia3Settings)
        if self.settings.form == "appendix" and config.gamma_backbone != 0.0:
            raise ValueError(
                "ia3.form=appendix needs diagonal Grams (gamma_backbone = 0): with full ones its rule divides by "
                "W0, which the coordinator does not hold"
            )
        self.side = SIDE[self.settings.side]
        self.sizes = {name: d_out if self.side == "B" else d_in for name, (d_out, d_in) in spec.layers.items()}
        self.current: dict[str, Tensor] = {}  # the current task's vector per layer, float64
        self.task_vectors: list[dict[str, Tensor]] = []  # l^t of every finished task
        self.task_stats: list[dict[str, Tensor]] = []  # its statistic summed over clients
        self.merged: dict[str, Tensor] = {}  # the task merge: the evaluated model's vectors

    def begin_task(self, task: int) -> None:
        self.current = {name: torch.zeros(size, dtype=F64) for name, size in self.sizes.items()}

    def _vectors(self, current: dict[str, Tensor] | None, extra: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
        """A plan's vectors: the trained side's (when ``current``) and the frozen ``"E"`` (scaled by ``lora_scale``)."""
        out: dict[str, dict[str, Tensor]] = {}
        for name in self.sizes:
            parts = {self.side: current[name].to(torch.float32)} if current is not None else {}
            if name in extra:
                parts["E"] = (extra[name] * self.config.lora_scale).to(torch.float32)
            out[name] = parts
        return out

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        # Gram passes see W0 + (sum_{tau<t} dW_tau + dW) / (t + 1), as LoRM's (docs/METHOD.md §3).
        done = self.task_vectors[:task]
        extra = {name: torch.stack([v[name] for v in done]).sum(0) / (task + 1) for name in self.sizes} if done else {}
        vectors = layered(VECTOR, self._vectors(self.current, extra))
        step = LoraStep(view_scale=1.0 / (task + 1), gram=self.gram_kind)
        if phase == Phase.TRAIN:
            return self.base_plan(
                task, round_, phase, replace(step, train_factors=(self.side,), head_gram=True), vectors
            )
        if phase == Phase.TASK_GRAM:
            return self.base_plan(task, round_, phase, replace(step, send_head=False), vectors)
        raise ValueError(f"LoRM with (IA)^3 has no {phase} step")

    def eval_plan(self, task: int) -> RoundPlan:
        plan = super().eval_plan(task)
        plan.tensors |= layered(VECTOR, self._vectors(None, self.merged))
        return plan

    def open_round(self, plan: RoundPlan) -> Fold:
        return Fold(plan, ia3_round(plan, self.spec, self.config), self.merge_round)

    def open_task_gram(self, plan: RoundPlan) -> Fold:
        return Fold(plan, ia3_task(plan, self.spec, self.config), self.merge_task)

    def merge_round(self, plan: RoundPlan, aggregator: IA3RoundAggregator) -> None:
        """The round's closed-form merge of the vector, and the head."""
        self.current = {name: acc.result() for name, acc in aggregator.layers.items()}
        self.head_w = aggregator.head.result()
        self.head_b = aggregator.bias.result()

    def merge_task(self, plan: RoundPlan, aggregator: IA3TaskAggregator) -> None:
        """The task's summed statistics: the task ends with its vectors stored, and the task merge redone."""
        self._end_task(dict(self.current), {name: acc.value() for name, acc in aggregator.stats.items()})

    def _end_task(self, vectors: dict[str, Tensor], stats: dict[str, Tensor]) -> None:
        self.task_vectors.append(vectors)
        self.task_stats.append(stats)
        self.merged = self.merge_tasks()

    def merge_tasks(self) -> dict[str, Tensor]:
        """Every finished task's vectors merged exactly, each weighted by its task's summed statistic."""
        if len(self.task_vectors) == 1:
            return dict(self.task_vectors[0])  # one task: the model is that task's own
        merged = {}
        for name, (d_out, d_in) in self.spec.layers.items():
            full = self.task_stats[0][name].dim() == 2 and self.side == "A"
            acc = ia3_accumulator(self.side, self.settings.form, d_out, d_in, full)
            for vectors, stats in zip(self.task_vectors, self.task_stats):
                acc.fold(vectors[name], stats[name])
            merged[name] = acc.result()
        return merged

    def adapter(self) -> dict[str, LowRank]:
        return {}  # no low-rank delta: the model is W0 rescaled by exports()["ia3"]

    def exports(self) -> dict[str, dict[str, Tensor]]:
        return {"ia3": {name: v.to(torch.float32) for name, v in self.merged.items()}} if self.merged else {}

    def state_tensors(self) -> dict[str, Tensor]:
        tensors = super().state_tensors() | {f"current/{name}": v for name, v in self.current.items()}
        for t, (vectors, stats) in enumerate(zip(self.task_vectors, self.task_stats)):
            tensors |= {f"task{t}/{name}/l": v for name, v in vectors.items()}
            tensors |= {f"task{t}/{name}/stat": s for name, s in stats.items()}
        return tensors

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        names = list(self.sizes)
        if f"current/{names[0]}" in tensors:
            self.current = {name: tensors[f"current/{name}"] for name in names}
        t = 0
        while f"task{t}/{names[0]}/l" in tensors:
            self._end_task(
                {name: tensors[f"task{t}/{name}/l"] for name in names},
                {name: tensors[f"task{t}/{name}/stat"] for name in names},
            )
            t += 1
