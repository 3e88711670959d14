"""LoRM's backbone with a closed-form head (ridge or cosine NCM) instead of the ACE-trained one.

The backbone is adapted exactly as :class:`~server.strategies.lorm.LoRM` adapts it (same
rounds, same per-round and task merges). After each task's TASK_GRAM step comes one more,
the *features step* ``(FEATURES, rounds_per_task)`` in features mode: clients send the
statistics of ``client/features.py`` of the current task's data under the merged backbone
``W0 + extra`` with ``extra`` the task merge of tasks ``0..t`` (the model evaluated after task
``t``). The sums fold into one :class:`~server.strategies.closed_form.ClosedFormHead` across
tasks, whose head is the one evaluated (features mode, same ``extra``) and exported.

Caveat (``lorm-ridge``, ``lorm-ncm``): the sums of task ``tau < t`` were computed under the
backbone merged after task ``tau``, not under today's, so the head mixes views of the data.
``lorm-ridge-first`` avoids it: LoRM adapts the backbone on task 0 only, after which the
backbone stays ``W0 + B^0 A^0`` and every task has only its features step, so all sums share
one view. LoRM's ACE head is still trained in LoRM's rounds (local training needs a head of
width ``F``) but is never evaluated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from common.aggregation.base import present
from common.run.config import RunConfig
from common.wire.instructions import FeaturesStep
from common.wire.messages import ModelSpec, Phase, RoundPlan
from common.wire.tensors import EXTRA, HEAD_WEIGHT, head_tensors, low_rank_tensors
from server.strategies.closed_form import ClosedFormHead, NearestClassMean, RidgeHead
from server.strategies.fold import Fold
from server.strategies.lorm import LoRM


class LoRMClosedForm(LoRM):
    """LoRM, then a features step per task; ``head_w, head_b`` are the closed-form head ``(C, F')``."""

    name = "lorm-ridge"
    head_class: type[ClosedFormHead] = RidgeHead
    first_task_only = False  # adapt the backbone on task 0 only; later tasks have the features step alone

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.closed = self.head_class(config, spec)  # sums over clients and tasks, and their head
        if self.closed.settings.prior_k:
            raise ValueError(
                f"{self.name}: a public prior is fitted on the frozen backbone's features, and this head reads LoRM's "
                f"adapted backbone: set no {self.closed.settings.section}.prior_digest (or use the method ncm or ridge)"
            )
        self.ace_w, self.ace_b = self.head_w, self.head_b  # LoRM's trained head (C, F): training rounds only
        self.head_w, self.head_b = self.closed.head_w, self.closed.head_b

    @property
    def features_round(self) -> int:
        return self.config.rounds_per_task  # as LoRM's TASK_GRAM step before it: the phase tells them apart

    def adapts(self, task: int) -> bool:
        return task == 0 or not self.first_task_only

    def steps(self, task: int) -> list[tuple[Phase, int]]:
        lorm = super().steps(task) if self.adapts(task) else []
        return lorm + [(Phase.FEATURES, self.features_round)]

    def begin_task(self, task: int) -> None:
        if self.adapts(task):
            super().begin_task(task)

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase == Phase.FEATURES:
            plan = self.closed.configure(task, 0, Phase.FEATURES)  # features mode, the statistics it needs
            return dataclasses.replace(
                plan, phase=phase, round=round_, tensors=plan.tensors | low_rank_tensors(EXTRA, self.view())
            )
        if not self.adapts(task):
            raise ValueError(f"{self.name} adapts the backbone on task 0 only; task {task} has no {phase} step")
        plan = super().configure(task, round_, phase)  # carries head_w (the closed-form head): swap in the ACE one
        dtype = present(plan.get(HEAD_WEIGHT)).dtype  # base_plan's precision
        ace = head_tensors(self.ace_w.to(dtype), self.ace_b.to(dtype))
        return dataclasses.replace(plan, tensors=plan.tensors | ace)

    def step_report(self, plan: RoundPlan) -> dict[str, Any]:
        return self.closed.step_report(plan) if plan.phase == Phase.FEATURES else super().step_report(plan)

    def open(self, plan: RoundPlan) -> Fold:
        """The features step's fold is the closed-form head's; LoRM's steps merge with its ACE head lent back."""
        if plan.phase == Phase.FEATURES:
            return self.closed.open(plan).then(self._closed_head)
        return super().open(plan).around(self._lend_ace_head, self._keep_ace_head)

    def _lend_ace_head(self) -> None:
        """LoRM's trained head in ``head_w, head_b``, for LoRM's merge (a training round leaves its new one there)."""
        self.head_w, self.head_b = self.ace_w, self.ace_b

    def _keep_ace_head(self) -> None:
        self.ace_w, self.ace_b = self.head_w, self.head_b
        self._closed_head()

    def _closed_head(self) -> None:
        """The closed-form head is the one evaluated."""
        self.head_w, self.head_b = self.closed.head_w, self.closed.head_b

    def eval_plan(self, task: int) -> RoundPlan:
        """The closed-form head on the merged backbone: features mode, ``extra`` = the view of the features step."""
        return dataclasses.replace(super().eval_plan(task), instruction=FeaturesStep())

    def state_tensors(self) -> dict[str, Tensor]:
        return self.closed.state_tensors() | super().state_tensors() | {"ace/w": self.ace_w, "ace/b": self.ace_b}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        self.closed.load_state_tensors(tensors)
        self.ace_w, self.ace_b = tensors["ace/w"], tensors["ace/b"]


class LoRMNearestClassMean(LoRMClosedForm):
    name = "lorm-ncm"
    head_class = NearestClassMean


class LoRMRidgeFirstTask(LoRMClosedForm):
    """The backbone adapted on task 0 only, then frozen at ``W0 + B^0 A^0``: one view for every task's sums."""

    name = "lorm-ridge-first"
    first_task_only = True
