"""The prompt-based continual learners of the paper, federated by FedAvg: L2P and CODA-Prompt.

Both keep the backbone at ``W0`` and train a pool of prompts (``common/adapters/prompts.py``) and the
head with ACE on the clients (``client/methods/prompts.py``). The coordinator holds the pool
in float64, hands it out in every plan (a ``PromptStep``, float32) with the number of its
leading components that are frozen, and merges by FedAvg: the sample-weighted mean of the
clients' changes of the trained components is added to them, and the head is the
sample-weighted mean of the clients' heads (the paper's adaptation of continual-learning
methods to the federated setting).

- ``l2p``: the pool (prompts and keys) is drawn once and trained whole, every round.
- ``coda-p``: ``components // tasks`` components join at each task's start, orthonormal to the
  earlier ones (CODA-P's Gram-Schmidt initialisation); the earlier ones are frozen from then on.

What a client sends per round: the trained components' change and the head, nothing else.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from common.adapters.prompts import grow_coda, init_l2p
from common.aggregation.dense import FedAvgAggregator, prompts
from common.methods.coda import CodaSettings
from common.methods.l2p import L2pSettings
from common.run.config import RunConfig
from common.wire.instructions import PromptStep
from common.wire.messages import LowRank, ModelSpec, Phase, RoundPlan
from common.wire.tensors import PROMPT, named_tensors
from server.strategies.base import Strategy
from server.strategies.fold import Fold


class PromptStrategy(Strategy):
    """A prompt pool on the frozen ``W0`` and the head, merged by FedAvg; subclasses make and grow the pool."""

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.pool: dict[str, Tensor] = {}  # name -> (components, ...), float64

    def frozen(self, task: int) -> int:
        """How many leading components of every pool tensor ``task`` keeps frozen."""
        return 0

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase != Phase.TRAIN:
            raise ValueError(f"strategy {self.name!r} has no {phase} step")
        step = PromptStep(prompt_frozen=self.frozen(task))
        return self.base_plan(task, round_, phase, step, named_tensors(PROMPT, self.published_pool()))

    def eval_plan(self, task: int) -> RoundPlan:
        """Evaluate the pool so far with the current head on ``W0``."""
        plan = super().eval_plan(task)
        pool = named_tensors(PROMPT, self.published_pool())
        return replace(plan, instruction=PromptStep(), tensors=pool | plan.tensors)

    def published_pool(self) -> dict[str, Tensor]:
        """The pool as plans carry it: float32 (``published_tensor``)."""
        return {name: p.detach().to(torch.float32) for name, p in self.pool.items()}

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, prompts(plan, self.spec, self.config), self.merge)

    def merge(self, plan: RoundPlan, aggregator: FedAvgAggregator) -> None:
        frozen = plan.expect(PromptStep).prompt_frozen
        self.pool = {
            name: torch.cat([p[:frozen], p[frozen:] + aggregator.delta[name].result()]) for name, p in self.pool.items()
        }
        self.head_w = aggregator.head.result()
        self.head_b = aggregator.bias.result()

    def state_tensors(self) -> dict[str, Tensor]:
        return super().state_tensors() | {f"prompt/{name}": p for name, p in self.pool.items()}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        prefix = "prompt/"
        self.pool = {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}

    def adapter(self) -> dict[str, LowRank]:
        return {}

    def exports(self) -> dict[str, dict[str, Tensor]]:
        return {"prompts": self.pool}


class L2P(PromptStrategy):
    name = "l2p"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        s = config.section(L2pSettings)
        self.pool = init_l2p(s.pool, s.length, spec.feature_dim, config.seed, s.init)


class CodaPrompt(PromptStrategy):
    name = "coda-p"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.settings = config.section(CodaSettings)
        self.per_task = self.settings.components // len(self.tasks)
        if self.per_task < 1:
            raise ValueError(
                f"coda.components ({self.settings.components}) must be at least the number of tasks "
                f"({len(self.tasks)}): each task adds components // tasks of them"
            )

    def frozen(self, task: int) -> int:
        return self.per_task * task

    def begin_task(self, task: int) -> None:
        super().begin_task(task)
        have = next(iter(self.pool.values())).shape[0] if self.pool else 0
        if have == self.per_task * (task + 1):  # grown already (a coordinator resumed after this task began)
            return
        if have != self.per_task * task:
            raise ValueError(f"coda-p: task {task} starts with {have} components, expected {self.per_task * task}")
        s = self.settings
        self.pool = grow_coda(self.pool, self.per_task, s.length, self.spec.feature_dim, self.config.seed, task)
