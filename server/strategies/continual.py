"""The continual-learning baselines of the paper, federated by FedAvg: EWC and LwF.

Both fine-tune every backbone weight and the head with ACE, as ``fedavg`` does, and merge the
clients' deltas and heads by FedAvg (the paper's adaptation of continual-learning methods to
the federated setting). What they add lives in the loss on the clients
(``client/methods/continual.py``); the coordinator hands out what that loss needs:

- ``anchor``: the global weights at the previous task's end, ``W0 + anchor``, per backbone
  parameter (float32). EWC's penalty is centred there; LwF's and TARGET's teacher is that model,
  with that model's head (``ANCHOR_HEAD`` entries of the anchor, :class:`Distilled`): the plan's
  head is the current one, whose old rows the distillation moves.
- EWC only: ``fisher``, the diagonal Fisher accumulated over the tasks so far (float32),
  ``F <- decay F + F_t``. ``F_t`` comes from one more step at each task's end (``TASK_GRAM``,
  ``send_fisher``): each client computes the diagonal Fisher of its shard at the task's merged
  weights (estimator ``RunConfig.fisher``), and the coordinator takes the sample-weighted mean
  (the ``reference`` estimator sums over samples: divided by the samples of all clients, as the
  paper's code does).

Nothing else crosses the wire. What clients send is FedAvg's (plus EWC's Fisher once per task),
and that is what the benchmark's "sent per client" counts; the plans they receive are larger
than FedAvg's by one copy of the backbone (the anchor), two for EWC (and the Fisher), from the
second task on.
"""

from __future__ import annotations

import torch
from torch import Tensor

from common.aggregation.dense import FisherAggregator, ewc_fisher
from common.methods.ewc import EwcSettings
from common.run.config import RunConfig
from common.wire.instructions import DenseStep
from common.wire.messages import ANCHOR_HEAD, ModelSpec, Phase, RoundPlan
from common.wire.tensors import ANCHOR, DELTA, FISHER, named_tensors
from server.strategies.fedavg import FedAvg
from server.strategies.fold import Fold


class Anchored(FedAvg):
    """FedAvg that also hands out the global weights of the previous task's end (``anchor``)."""

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.anchor: dict[str, Tensor] = {}  # empty during the first task: nothing to keep yet

    def begin_task(self, task: int) -> None:
        super().begin_task(task)
        if task > 0:
            self.anchor = dict(self.delta)  # add_to_delta makes new tensors: these stay as they are

    def plan_tensors(self) -> dict[str, Tensor]:
        return named_tensors(ANCHOR, self.anchor)

    def state_tensors(self) -> dict[str, Tensor]:
        return super().state_tensors() | {f"anchor/{name}": a for name, a in self.anchor.items()}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        prefix = "anchor/"
        self.anchor = {name.removeprefix(prefix): t for name, t in tensors.items() if name.startswith(prefix)}


class Distilled(Anchored):
    """Anchored, whose anchor also holds the global head at the previous task's end (``ANCHOR_HEAD``):
    the clients' teacher, fixed for the task. The current head cannot serve: the distillation trains
    its old classes' rows, so a teacher built from it would follow the student round by round."""

    def begin_task(self, task: int) -> None:
        super().begin_task(task)
        if task > 0:
            self.anchor |= dict(zip(ANCHOR_HEAD, (self.head_w.clone(), self.head_b.clone())))

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        if self.anchor and not all(key in self.anchor for key in ANCHOR_HEAD):  # the first task has no teacher
            raise ValueError(
                f"strategy {self.name!r}: this run's state has the previous task's backbone but not its head "
                "(saved before the teacher kept its own head); start the run again"
            )


class LwF(Distilled):
    name = "lwf"


class Target(Distilled):
    """TARGET: its clients synthesise old-class inputs from the anchor model and distil on them
    (``client/methods/target.py``); the coordinator merges as FedAvg and hands out the anchor."""

    name = "target"


class EWC(Anchored):
    name = "ewc"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.settings = config.section(EwcSettings)
        self.fisher: dict[str, Tensor] = {}

    def steps(self, task: int) -> list[tuple[Phase, int]]:
        return super().steps(task) + [(Phase.TASK_GRAM, self.config.rounds_per_task)]  # the task's Fisher

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase == Phase.TASK_GRAM:  # no training: the Fisher of the task's merged weights
            step = DenseStep(send_fisher=True, send_head=False)
            return self.base_plan(task, round_, phase, step, named_tensors(DELTA, self.delta))
        return super().configure(task, round_, phase)

    def plan_tensors(self) -> dict[str, Tensor]:
        return super().plan_tensors() | named_tensors(FISHER, self.fisher)

    def open(self, plan: RoundPlan) -> Fold:
        if plan.phase == Phase.TASK_GRAM:
            return Fold(plan, ewc_fisher(plan, self.spec, self.config), self.merge_fisher)
        return super().open(plan)

    def merge_fisher(self, plan: RoundPlan, aggregator: FisherAggregator) -> None:
        """The task's Fisher, into the decayed sum of the tasks so far."""
        decay = self.settings.decay
        self.fisher = {
            name: ((decay * self.fisher[name].to(torch.float64) if name in self.fisher else 0.0) + acc.result()).to(
                torch.float32
            )
            for name, acc in aggregator.fisher.items()
        }

    def state_tensors(self) -> dict[str, Tensor]:
        return super().state_tensors() | {f"fisher/{name}": f for name, f in self.fisher.items()}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        self.fisher = {name: tensors[f"fisher/{name}"] for name in self.spec.params if f"fisher/{name}" in tensors}
