"""What the full fine-tuning baselines share: a dense global backbone delta, and update checks.

These methods (FedAvg, RegMean, Fisher averaging, TIES) train every backbone weight with the
same ACE loss, head and data as LoRM. The model they hold is ``W = W0 + delta`` per backbone
parameter (``ModelSpec.params``) with the merged head; clients receive ``delta`` in every
plan (a ``DenseStep``) and send back their own ``delta_i`` = trained minus received weights.
Each round the strategy merges the ``delta_i`` into a step and adds it to ``delta``.

There is no low-rank adapter: :meth:`DenseStrategy.adapter` is empty and
:meth:`DenseStrategy.dense_delta` returns ``delta``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from common.run.config import RunConfig
from common.wire.instructions import DenseStep
from common.wire.messages import LowRank, ModelSpec, Phase, RoundPlan
from common.wire.tensors import DELTA, named_tensors
from server.strategies.base import Strategy


class DenseStrategy(Strategy):
    """A full fine-tuning baseline: state ``delta`` (float32 per backbone parameter) + head."""

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        if not spec.params:
            raise ValueError(
                f"strategy {self.name!r} fine-tunes the whole backbone: the model spec must list "
                "its parameters (ModelSpec.params), got none"
            )
        self.delta: dict[str, Tensor] = {
            name: torch.zeros(shape, dtype=torch.float32) for name, shape in spec.params.items()
        }

    def instruction(self) -> DenseStep:
        """What a training round asks of the clients besides the delta and head."""
        return DenseStep()

    def plan_tensors(self) -> dict[str, Tensor]:
        """What a training round hands out besides the delta and head (named tensors)."""
        return {}

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase != Phase.TRAIN:
            raise ValueError(f"strategy {self.name!r} has no {phase} step")
        return self.base_plan(
            task, round_, phase, self.instruction(), named_tensors(DELTA, self.delta) | self.plan_tensors()
        )

    def eval_plan(self, task: int) -> RoundPlan:
        """Evaluate ``W0 + delta`` with the current head."""
        plan = super().eval_plan(task)
        return replace(plan, instruction=DenseStep(), tensors=named_tensors(DELTA, self.delta) | plan.tensors)

    def add_to_delta(self, step: dict[str, Tensor]) -> None:
        """``delta <- delta + step`` (summed in float64, stored as float32); new tensors, so
        plans already handed out keep the delta they were made with."""
        self.delta = {name: (d.to(torch.float64) + step[name]).to(torch.float32) for name, d in self.delta.items()}

    def state_tensors(self) -> dict[str, Tensor]:
        return super().state_tensors() | {f"delta/{name}": d for name, d in self.delta.items()}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        self.delta = {name: tensors[f"delta/{name}"] for name in self.spec.params}

    def adapter(self) -> dict[str, LowRank]:
        return {}

    def dense_delta(self) -> dict[str, Tensor]:
        return self.delta
