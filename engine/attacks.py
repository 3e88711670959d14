"""Hostile clients, for measuring the robust mode (``server/robust.py``): each is an honest
worker whose updates (or labels) are tampered with, as a poisoning client would.

- ``scale-factors``: every trained tensor (LoRA factors, dense deltas, the head) moved 1e4
  times as far from where the step started it;
- ``scale-grams``: every second-moment statistic (layer Grams, the head Gram, a statistic's
  Gram factor) 1e6 times larger, so that its factor dominates ``sum_i G_i``;
- ``flip-sign``: every trained tensor's change from where the step started it, negated;
- ``flip-labels``: trains, and computes its statistics, on labels mirrored within each task
  (class ``lo + k`` becomes ``hi - 1 - k``): an honest-looking update of the wrong function.

``wrap_hostile("scale-grams", 3)`` is a ``wrap`` for :func:`engine.simulation.run_inprocess`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from client.worker import ClientWorker
from common.messages import ClientUpdate, EvalReport, RoundPlan
from common.tensors import update_tensors, with_tensors
from server.robust import CHANGE, SECOND, plan_starts, scaled, tensor_role

ATTACKS = ("scale-factors", "scale-grams", "flip-sign", "flip-labels")
FACTOR_SCALE, GRAM_SCALE = 1e4, 1e6


def tamper(kind: str, update: ClientUpdate, plan: RoundPlan) -> ClientUpdate:
    """``update`` as the attack ``kind`` would send it (``flip-labels`` changes nothing here)."""
    if kind == "flip-labels":
        return update
    starts = plan_starts(plan)
    tensors = update_tensors(update)
    for name, t in tensors.items():
        role = tensor_role(name, t)
        if role == CHANGE and kind in ("scale-factors", "flip-sign"):
            tensors[name] = scaled(name, t, starts, FACTOR_SCALE if kind == "scale-factors" else -1.0)
        elif role == SECOND and kind == "scale-grams":
            tensors[name] = scaled(name, t, starts, GRAM_SCALE)
    return with_tensors(update, tensors)


class MirroredLabels:
    """A client's samples with each label mirrored within its task's class range."""

    def __init__(self, data: Any, tasks: list[tuple[int, int]]) -> None:
        self.data = data
        self.labels = data.labels  # the partition (which samples the client holds) stays honest
        self.lookup = torch.arange(int(data.labels.max()) + 1)
        for lo, hi in tasks:
            self.lookup[lo:hi] = torch.arange(hi - 1, lo - 1, -1)

    def __len__(self) -> int:
        return len(self.data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.data, name)

    def batch(self, idx: Tensor, device: torch.device, **kwargs: Any) -> tuple[dict[str, Tensor], Tensor]:
        inputs, labels = self.data.batch(idx, device, **kwargs)
        return inputs, self.lookup.to(labels.device)[labels]


class HostileWorker:
    """An honest :class:`ClientWorker` whose updates go through :func:`tamper` (or whose
    training labels are mirrored)."""

    def __init__(self, worker: ClientWorker, kind: str) -> None:
        if kind not in ATTACKS:
            raise ValueError(f"unknown attack {kind!r}; known: {list(ATTACKS)}")
        self.worker, self.kind = worker, kind
        if kind == "flip-labels":
            worker.train = MirroredLabels(worker.train, worker.tasks)  # type: ignore[assignment]

    def handle(self, plan: RoundPlan) -> ClientUpdate | EvalReport:
        out = self.worker.handle(plan)
        return tamper(self.kind, out, plan) if isinstance(out, ClientUpdate) else out


def wrap_hostile(kind: str, index: int) -> Callable[[int, ClientWorker], Any]:
    """A ``run_inprocess`` ``wrap`` that makes client ``index`` hostile in the way ``kind``."""
    if kind not in ATTACKS:
        raise ValueError(f"unknown attack {kind!r}; known: {list(ATTACKS)}")
    return lambda i, worker: HostileWorker(worker, kind) if i == index else worker
