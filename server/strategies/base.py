"""The strategy interface: what every federated method implements (Flower-style siblings).

A run is a sequence of steps per task. For each step the driver (``server/run.py``) asks the strategy for a
:class:`RoundPlan` (``configure``) and opens the step's fold (``fold``): the aggregator of the step's phase,
typed together with the strategy's merge of it (``server/strategies/fold.py``; each strategy's ``open``), under
the run's privacy account (``server/strategies/private.py``, which wraps it). The driver folds every client's
:class:`ClientUpdate` into the fold's aggregator as it arrives and finishes the fold. Aggregators hold running
sums only, so memory does not depend on how many clients fold into them; each is the one the method's factory
(``Method.aggregator``, ``common.aggregation.base.make_aggregator``) builds, which a client in a secure step builds
alike.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor

from common.aggregation.base import Aggregator
from common.run.config import RunConfig
from common.run.schedule import run_tasks
from common.wire.instructions import Instruction, LoraStep
from common.wire.messages import LowRank, ModelSpec, Phase, RoundPlan
from common.wire.tensors import EXTRA, head_tensors, low_rank_tensors
from server.strategies.fold import Fold
from server.strategies.private import training_privacy


class Strategy(ABC):
    """A federated continual-learning method, as seen by the coordinator."""

    name: str = ""
    sends_grams = False  # its training rounds send Grams, and each task ends with a Gram step (LoRM's family)

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        self.config = config
        self.spec = spec
        self.tasks = run_tasks(config, spec.num_classes)
        self.head_w, self.head_b = init_head(spec, config.seed)
        # the run's privacy account (dp.mode local or client, else none): it wraps every step's fold
        self.privacy = training_privacy(config, self.sends_grams)

    def extend(self, config: RunConfig) -> None:
        """The run's schedule grew (the operator appended a task): ``config`` is the run's configuration with
        the longer schedule (``common.run.schedule.with_schedule``); the tasks so far keep their ranges."""
        tasks = run_tasks(config, self.spec.num_classes)
        assert tasks[: len(self.tasks)] == self.tasks, "a schedule only grows"
        self.config, self.tasks = config, tasks

    def steps(self, task: int) -> list[tuple[Phase, int]]:
        """The ``(phase, round)`` steps of one task before its evaluation."""
        return [(Phase.TRAIN, j) for j in range(self.config.rounds_per_task)]

    def schedule(self) -> list[Phase]:
        """The phase of every step of the run, in order: each task's :meth:`steps`, then its evaluation."""
        return [phase for task in range(len(self.tasks)) for phase, _ in self.steps(task) + [(Phase.EVALUATE, 0)]]

    def begin_task(self, task: int) -> None:  # noqa: B027 (an optional hook)
        """Called once when ``task`` starts, before its first ``configure``."""

    @abstractmethod
    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        """The plan of one step; pure (may be called again, e.g. after a restart)."""

    @abstractmethod
    def open(self, plan: RoundPlan) -> Fold:
        """``plan``'s step as a fold: the aggregator of its phase (the one the method's factory, ``Method.aggregator``,
        builds from the plan, the model and the run's configuration) and the merge that reads it."""

    def fold(self, plan: RoundPlan) -> Fold:
        """The fold of ``plan``'s step, under the run's privacy account (which may refuse the step, fold the updates
        into its own aggregator and spend its budget when the merge is done)."""
        return self.privacy.wrap(self.open(plan))

    def aggregator(self, plan: RoundPlan) -> Aggregator:
        """An empty aggregator of ``plan``'s step: what the clients' updates fold into (the secure layout's source)."""
        return self.fold(plan).aggregator

    @abstractmethod
    def adapter(self) -> dict[str, LowRank]:
        """The low-rank backbone delta of the model evaluated now (and exported at the end)."""

    def dense_delta(self) -> dict[str, Tensor] | None:
        """The dense backbone delta ``parameter name -> W - W0`` of the model evaluated now.

        ``None`` (the default) when the model is ``W0 + adapter()``; the full fine-tuning
        baselines return their delta here and an empty :meth:`adapter`.
        """
        return None

    def exports(self) -> dict[str, dict[str, Tensor]]:
        """What the model evaluated now has besides the head and backbone delta, exported as
        ``<kind>.safetensors`` per kind (L2P's prompt pool, PILoRA's prototypes, ...; none by default)."""
        return {}

    def step_report(self, plan: RoundPlan) -> dict[str, Any]:
        """What the merge of ``plan``'s step chose, for the run's history (metrics.json) and log; JSON values."""
        return {}

    def report(self, plan: RoundPlan) -> dict[str, Any]:
        """What ``plan``'s merged step records: :meth:`step_report`, and what the privacy account states of it."""
        return self.step_report(plan) | self.privacy.statement(plan)

    def state_tensors(self) -> dict[str, Tensor]:
        """Everything the strategy must remember between steps, as named tensors (persisted)."""
        return {"head/w": self.head_w, "head/b": self.head_b} | self.privacy.state_tensors()

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        """Inverse of :meth:`state_tensors` (on a freshly constructed strategy)."""
        self.head_w, self.head_b = tensors["head/w"], tensors["head/b"]
        self.privacy.load(tensors)

    def view(self) -> dict[str, LowRank]:
        """The evaluated backbone delta as a plan's ``extra``: ``B * lora_scale, A`` per layer of :meth:`adapter`."""
        scale = self.config.lora_scale
        return {name: published(f.b * scale, f.a) for name, f in self.adapter().items()}

    def eval_plan(self, task: int) -> RoundPlan:
        """Evaluate ``W0 + adapter`` with the current head on every task seen so far."""
        plan = self.base_plan(task, self.config.rounds_per_task, Phase.EVALUATE, LoraStep())
        plan.tensors = low_rank_tensors(EXTRA, self.view()) | plan.tensors
        return plan

    def base_plan(
        self, task: int, round_: int, phase: Phase, instruction: Instruction, tensors: dict[str, Tensor] | None = None
    ) -> RoundPlan:
        """The plan of a step: ``instruction``, ``tensors`` and the current head (float32)."""
        head = head_tensors(published_tensor(self.head_w), published_tensor(self.head_b))
        return RoundPlan(
            run_id=self.config.run_id,
            phase=phase,
            task=task,
            round=round_,
            class_range=self.tasks[task],
            seen_classes=self.tasks[task][1],
            instruction=instruction,
            tensors=(tensors or {}) | head,
            seed=self.config.seed,
        )


def published_tensor(t: Tensor | None) -> Tensor | None:
    """What a plan carries: float32, the precision clients compute with (half of float64's bytes).

    Strategies keep and merge in float64; clients would round to float32 on loading anyway,
    so rounding before sending changes nothing a client computes.
    """
    return None if t is None else t.detach().to(torch.float32)


def published(b: Tensor, a: Tensor) -> LowRank:
    """Low-rank factors as a plan carries them (see :func:`published_tensor`)."""
    return LowRank(b.detach().to(torch.float32), a.detach().to(torch.float32))


def factors_to_tensors(prefix: str, factors: dict[str, LowRank]) -> dict[str, Tensor]:
    return {f"{prefix}/{name}/{part}": getattr(f, part) for name, f in factors.items() for part in ("b", "a")}


def factors_from_tensors(prefix: str, layers: dict, tensors: dict[str, Tensor]) -> dict[str, LowRank]:
    return {name: LowRank(tensors[f"{prefix}/{name}/b"], tensors[f"{prefix}/{name}/a"]) for name in layers}


def init_head(spec: ModelSpec, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded head like ``nn.Linear``'s init: ``U(-1/sqrt(F), 1/sqrt(F))`` for weight and bias."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 17)
    bound = 1.0 / math.sqrt(spec.feature_dim)
    w = torch.empty(spec.num_classes, spec.feature_dim, dtype=torch.float64).uniform_(-bound, bound, generator=gen)
    b = torch.empty(spec.num_classes, dtype=torch.float64).uniform_(-bound, bound, generator=gen)
    return w, b
