"""LoRM (docs/METHOD.md §3): alternating closed-form LoRA merges per round, RegMean across tasks."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import replace

import torch
from torch import Tensor

from common.adapters.lora import init_lora_a
from common.aggregation.lora import LoRMRoundAggregator, TaskGramAggregator, lorm_round, task_gram
from common.merges.grams import decay_gram
from common.merges.regmean import LoraBAccumulator, TaskMergeAccumulator
from common.run.config import RunConfig
from common.wire.instructions import GramKind, LoraStep
from common.wire.messages import LowRank, ModelSpec, Phase, RoundPlan
from common.wire.tensors import EXTRA, LORA, low_rank_tensors
from server.strategies.base import Strategy, factors_from_tensors, factors_to_tensors, published
from server.strategies.fold import Fold


class TaskGramStrategy(Strategy):
    """A method whose tasks end, after their rounds, with a task Gram step (the statistics its merge
    across tasks weighs by): Grams of the layers' inputs diagonal with ``gamma_backbone = 0``, else full."""

    sends_grams = True

    @property
    def gram_kind(self) -> GramKind:
        return GramKind.DIAG if self.config.gamma_backbone == 0.0 else GramKind.FULL

    def steps(self, task: int) -> list[tuple[Phase, int]]:
        return super().steps(task) + [(Phase.TASK_GRAM, self.config.rounds_per_task)]

    def open(self, plan: RoundPlan) -> Fold:
        """A training round's fold (:meth:`open_round`), or the task Gram step's (:meth:`open_task_gram`)."""
        return self.open_task_gram(plan) if plan.phase == Phase.TASK_GRAM else self.open_round(plan)

    @abstractmethod
    def open_round(self, plan: RoundPlan) -> Fold: ...

    @abstractmethod
    def open_task_gram(self, plan: RoundPlan) -> Fold: ...


class LoRM(TaskGramStrategy):
    name = "lorm"
    trains_on_previous = False  # clients train on W0 + s B A (docs/METHOD.md §3 step 3); True: on W0 + extra + s B A

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.shared: dict[str, LowRank] = {}  # the current task's factors, float64
        self.task_factors: list[dict[str, LowRank]] = []  # B^t, A^t of every finished task
        self.task_grams: list[dict[str, Tensor]] = []  # G^t = sum_i G_i^t of every finished task
        self.task_merge = {name: TaskMergeAccumulator(d_out, d_in) for name, (d_out, d_in) in spec.layers.items()}
        self.merged: dict[str, LowRank] = {}  # B_cat, A_cat of the task merge

    def begin_task(self, task: int) -> None:
        """Fresh factors for every task: ``B = 0`` and a seeded random ``A``."""
        gen = torch.Generator().manual_seed(self.config.seed * 7919 + task)
        r = self.config.rank
        self.shared = {
            name: LowRank(torch.zeros(d_out, r, dtype=torch.float64), init_lora_a(r, d_in, gen).to(torch.float64))
            for name, (d_out, d_in) in self.spec.layers.items()
        }

    def stacked(self, tasks: list[dict[str, LowRank]], weight: float = 1.0) -> dict[str, LowRank]:
        """``weight * sum_tau B^tau A^tau`` over ``tasks`` as one low-rank pair per layer:
        ``[B^0 ... B^k] * weight`` and ``[A^0; ...; A^k]``."""
        return {
            name: LowRank(torch.cat([f[name].b for f in tasks], 1) * weight, torch.cat([f[name].a for f in tasks], 0))
            for name in self.spec.layers
        }

    def divisor(self, task: int) -> int:
        """What task ``task``'s residual and each earlier one are divided by in its Gram passes: ``t + 1``."""
        return task + 1

    def _previous(self, task: int) -> dict[str, LowRank]:
        """``s sum_{tau<t} B^tau A^tau / divisor(t)`` as one low-rank pair per layer (published)."""
        done = self.task_factors[:task]
        if not done:
            return {}
        return {
            name: published(f.b, f.a)
            for name, f in self.stacked(done, self.config.lora_scale / self.divisor(task)).items()
        }

    def active_factor(self, round_: int) -> str:
        """Rounds alternate: B (A frozen and shared), then A (B frozen and shared), ..."""
        return "B" if round_ % 2 == 0 else "A"

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        # Gram passes see W0 + (sum_{tau<t} B^tau A^tau + B A) / (t + 1): docs/METHOD.md §3 steps 4 and 6.
        tensors = low_rank_tensors(LORA, {name: published(f.b, f.a) for name, f in self.shared.items()})
        tensors |= low_rank_tensors(EXTRA, self._previous(task))
        step = LoraStep(view_scale=1.0 / self.divisor(task), gram=self.gram_kind, train_extra=self.trains_on_previous)
        if phase == Phase.TRAIN:
            step = replace(step, train_factors=(self.active_factor(round_),), head_gram=True)
            return self.base_plan(task, round_, phase, step, tensors)
        if phase == Phase.TASK_GRAM:
            return self.base_plan(task, round_, phase, replace(step, send_head=False), tensors)
        raise ValueError(f"LoRM has no {phase} step")

    def open_round(self, plan: RoundPlan) -> Fold:
        return Fold(plan, lorm_round(plan, self.spec, self.config), self.merge_round)

    def open_task_gram(self, plan: RoundPlan) -> Fold:
        return Fold(plan, task_gram(plan, self.spec, self.config), self.merge_task_gram)

    def merge_round(self, plan: RoundPlan, aggregator: LoRMRoundAggregator) -> None:
        """The round's closed-form merge of the active factor, and the head."""
        for name, acc in aggregator.layers.items():
            new: Tensor = acc.result()
            if isinstance(acc, LoraBAccumulator):
                # Keep the A the clients trained against and the merge used: the published one.
                self.shared[name] = LowRank(new, acc.a)
            else:
                self.shared[name] = LowRank(self.shared[name].b, new)
        self.head_w = aggregator.head.result()
        self.head_b = aggregator.bias.result()

    def merge_task_gram(self, plan: RoundPlan, aggregator: TaskGramAggregator) -> None:
        """The task's Grams: the task ends with its factors and Grams stored, and the task merge redone."""
        self._end_task(dict(self.shared), {name: acc.value() for name, acc in aggregator.grams.items()})

    def _end_task(self, factors: dict[str, LowRank], grams: dict[str, Tensor]) -> None:
        """Store ``B^t, A^t, G^t`` and redo the task merge over tasks ``0..t``."""
        for name, f in factors.items():
            self.task_merge[name].fold(f.b, f.a, decay_gram(grams[name], self.config.gamma_backbone))
        self.task_factors.append(factors)
        self.task_grams.append(grams)
        self.merged = self.merge_tasks()

    def merge_tasks(self) -> dict[str, LowRank]:
        """The task-level RegMean (docs/METHOD.md §2.4, §2.7) over every finished task, in low-rank form."""
        if len(self.task_factors) == 1:
            return dict(self.task_factors[0])  # one task: the model is W0 + B^0 A^0 itself (docs/METHOD.md §3 step 7)
        return {name: LowRank(*acc.result()) for name, acc in self.task_merge.items()}

    def state_tensors(self) -> dict[str, Tensor]:
        tensors = super().state_tensors() | factors_to_tensors("shared", self.shared)
        for t, (factors, grams) in enumerate(zip(self.task_factors, self.task_grams)):
            tensors |= factors_to_tensors(f"task{t}", factors)
            tensors |= {f"task{t}/{name}/g": g for name, g in grams.items()}
        return tensors

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        layers = self.spec.layers
        if f"shared/{next(iter(layers))}/b" in tensors:
            self.shared = factors_from_tensors("shared", layers, tensors)
        t = 0
        while f"task{t}/{next(iter(layers))}/b" in tensors:
            # Re-fold the stored tasks in order: the same sums, the same merge as before.
            self._end_task(
                factors_from_tensors(f"task{t}", layers, tensors),
                {name: tensors[f"task{t}/{name}/g"] for name in layers},
            )
            t += 1

    def adapter(self) -> dict[str, LowRank]:
        return self.merged


class LoRMBOnly(LoRM):
    """Ablation: every round trains B (A stays the task's random init), never A."""

    name = "lorm-b-only"

    def active_factor(self, round_: int) -> str:
        return "B"


class LoRMAverageTasks(LoRM):
    """Ablation: tasks' residuals averaged, ``dW = mean_t B^t A^t``, instead of the task RegMean."""

    name = "lorm-avg-tasks"

    def merge_tasks(self) -> dict[str, LowRank]:
        t = len(self.task_factors)
        return {name: LowRank(f.b / t, f.a) for name, f in self.stacked(self.task_factors).items()}


class LoRMSequential(LoRM):
    """Variant: each task's LoRA learns a residual on top of the earlier tasks' residuals, which add up.

    Task ``t`` trains, and runs its Gram passes, in the view ``W0 + E_t + s B A`` with
    ``E_t = s sum_{tau<t} B^tau A^tau`` (``plan.train_extra``), and the model evaluated after
    task ``t`` is that view with the task's merged factors: ``dW = sum_tau B^tau A^tau``. The
    per-round closed-form merges are LoRM's; the task-level RegMean is replaced by the sum, so a
    task's residual is not diluted by ``1/(t+1)`` and a new task starts from the representation
    the earlier ones built (transfer), at the price of later residuals acting on earlier tasks'
    features unchecked.
    """

    name = "lorm-seq"
    trains_on_previous = True

    def divisor(self, task: int) -> int:
        return 1  # the earlier residuals at full weight: E_t + s B A is the model being trained

    def merge_tasks(self) -> dict[str, LowRank]:
        return self.stacked(self.task_factors)
