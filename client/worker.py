"""A client's work for one step of the run: its data and model, and the method's client half.

The worker holds no state between steps except its data: every step starts from what the
plan carries (shared factors, head, frozen deltas), with a fresh optimiser and a seed derived
from the plan, so the same plan gives the same update in any process. What a step trains,
and what the update carries, is the method's client half (``client/methods/``, chosen by
``config.method`` through ``common.methods``); evaluation is shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from client.classifier import ClassifierModel, model_spec
from client.ledger import ClientLedger, task_classes
from client.methods import client_method
from client.methods.base import Samples, set_view
from client.plans import PlanCheck
from client.scoring import scoring_half, seen_logits, trimmed
from common.aggregation.declared import check_declared_shapes, declared_tensors
from common.run.config import RunConfig
from common.run.partition import client_shards, client_test_indices
from common.run.schedule import run_tasks
from common.wire.messages import ClientUpdate, EvalReport, Phase, RoundPlan


class SampleData(Samples, Protocol):
    """A client's samples: labels known up front, inputs produced batch by batch.

    ``batch(idx, device, train=..., generator=..., padded=...)`` returns the model inputs and
    labels of the samples ``idx``; with ``train=True`` it may apply the dataset's training
    augmentation, drawing its randomness from ``generator`` only (so a step is reproducible).
    ``padded=True`` keeps text padded to the longest sample of the whole split (images: no effect).
    """

    def __len__(self) -> int: ...


@dataclass
class EncodedData:
    """Encoded inputs ``name -> (n, ...)`` and labels ``(n,)``, all on the CPU (no augmentation)."""

    inputs: dict[str, Tensor]
    labels: Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batch(
        self,
        idx: Tensor,
        device: torch.device,
        *,
        train: bool = False,
        generator: torch.Generator | None = None,
        padded: bool = False,
    ) -> tuple[dict[str, Tensor], Tensor]:
        inputs = {k: v[idx] for k, v in self.inputs.items()}
        # padding columns that no sample of this batch uses trimmed (same outputs, less work), or with ``padded``
        # those that no sample of the split uses (the width of padding=True over the split)
        inputs = trimmed(inputs, self.inputs.get("attention_mask") if padded else None)
        return {k: v.to(device) for k, v in inputs.items()}, self.labels[idx].to(device)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class ClientWorker:
    """Client ``client_index`` of ``config.num_clients``, with its shard of ``train`` and ``test``; with
    ``owned``, ``train`` and ``test`` are this client's own data, all of it its shard."""

    def __init__(
        self,
        config: RunConfig,
        client_index: int,
        client_id: str,
        model: ClassifierModel,
        train: SampleData,
        test: SampleData,
        device: torch.device,
        *,
        owned: bool = False,
    ) -> None:
        self.config, self.index, self.client_id = config, client_index, client_id
        self.model, self.train, self.test, self.device = model, train, test, device
        num_classes = model.head.out_features
        self.tasks = run_tasks(config, num_classes)
        labels = train.labels.numpy()
        if owned:  # task t's shard: every sample of its classes this client holds (maybe none)
            shards = [np.flatnonzero((labels >= lo) & (labels < hi)) for lo, hi in self.tasks]
            test_idx = np.arange(len(test))
        else:
            shards = client_shards(
                labels,
                self.tasks,
                config.num_clients,
                config.beta,
                config.seed,
                config.min_client_samples,
                client_index,
            )
            test_idx = client_test_indices(len(test), config.num_clients, client_index)
        self.shards = [torch.from_numpy(s) for s in shards]  # per task: sample indices
        self.test_idx = torch.from_numpy(test_idx)
        self.method = client_method(config)  # the client half of the run's method
        self.on_batch: Callable[[int, int], None] | None = None  # progress: (batches done, of total)
        self.spec = model_spec(model)  # the shapes the coordinator knows the model by
        # a privately trained run's releases of this client's records (client/ledger.py); lorm-client gives it a file
        self.ledger = ClientLedger.of(config)
        # each plan held to the run's method's steps and this client's cut of the tasks (client/plans.py)
        self.check = PlanCheck(config, self.tasks)

    def handle(self, plan: RoundPlan) -> ClientUpdate | EvalReport:
        """``plan``'s update or evaluation; ``PlanRefused`` (nothing read) for a step this client does not carry
        out."""
        self.check(plan)
        if plan.phase == Phase.EVALUATE:
            return self.evaluate(plan)
        if plan.phase in (Phase.TRAIN, Phase.TASK_GRAM, Phase.FEATURES):
            return self.update(plan)
        raise ValueError(f"a client cannot handle phase {plan.phase}")

    def update(self, plan: RoundPlan) -> ClientUpdate:
        """A ``TRAIN``, ``TASK_GRAM`` or ``FEATURES`` step, as the method's client half does it; its tensors must be
        those the step declares (``common.aggregation.declared``), which the coordinator will expect."""
        half = self.method.serves(plan)
        if self.ledger is not None:  # within the plan, and the same step's update sent again rather than re-noised
            reads = task_classes(self.config, plan.task, self.tasks[plan.task])
            update = self.ledger.release(plan, lambda: half.update(self, plan), reads)
        else:
            update = half.update(self, plan)
        got = {name: tuple(t.shape) for name, t in update.tensors.items()}
        check_declared_shapes(got, declared_tensors(plan, self.spec, self.config), type(half).__name__)
        return update

    def load_view(self, plan: RoundPlan) -> None:
        """Set the model the plan evaluates (or computes statistics on): its weights, then the view
        ``W0 + extra + view_scale * s B A``."""
        self.model.to(self.device)
        self.method.serves(plan).load(self, plan)
        set_view(self, plan)

    @torch.no_grad()
    def evaluate(self, plan: RoundPlan) -> EvalReport:
        """Class-incremental accuracy: argmax over all seen classes, per seen task, scored as an export's server
        scores (``client/scoring.py``)."""
        half = scoring_half(self, plan)
        seen = plan.seen_classes
        correct = [0] * (plan.task + 1)
        total = [0] * (plan.task + 1)
        labels = self.test.labels[self.test_idx]
        mine = self.test_idx[labels < seen]
        for start in range(0, mine.numel(), 256):
            inputs, y = self.test.batch(mine[start : start + 256], self.device)
            pred = seen_logits(half, self, plan, inputs).argmax(dim=1)  # (batch,) of (batch, seen)
            for j, (lo, hi) in enumerate(self.tasks[: plan.task + 1]):
                in_task = (y >= lo) & (y < hi)
                correct[j] += int((pred[in_task] == y[in_task]).sum())
                total[j] += int(in_task.sum())
        return EvalReport(
            run_id=plan.run_id,
            client_id=self.client_id,
            client_index=self.index,
            task=plan.task,
            correct=correct,
            total=total,
        )
