"""Hostile clients, for measuring the robust mode (``server/robust.py``): each is an honest
worker whose updates (or labels) are tampered with, as a poisoning client would.

Naive attacks, far past any bound:

- ``scale-factors``: every trained tensor (LoRA factors, dense deltas, the head) moved 1e4
  times as far from where the step started it;
- ``scale-grams``: every second-moment statistic (layer Grams, the head Gram, a statistic's
  Gram factor) 1e6 times larger, so that its factor dominates ``sum_i G_i``;
- ``flip-sign``: every trained tensor's change from where the step started it, negated;
- ``flip-labels``: trains, and computes its statistics, on labels mirrored within each task
  (class ``lo + k`` becomes ``hi - 1 - k``): an honest-looking update of the wrong function.

Adaptive attacks. The attacker model: a client that knows the run's configuration
(the Join reply carries it: ``robust.kappa``, ``train_per_class``, the task's classes) and its own
honest update, and nothing of the other clients' updates; it takes its own honest measures as its
estimate of the step's medians (an honest client is a typical one) and does not read Status.

- ``inflate-samples``: claims ``INFLATE`` x its samples (at most what the run admits for the task,
  ``server.checks.sample_bounds``), its Grams and class statistics scaled to match
  (``server.robust_measures.reweigh``): every per-sample measure stays honest;
- ``scale-under-bound``: every measure the guard bounds at ``UNDER`` (0.95) x ``kappa`` x its own
  honest one: it claims that many times its samples, its Grams' per-sample traces and its change
  norms that many times its own, all along its honest directions: the most weight it can take
  unclipped, if its estimate of the medians is right;
- ``slow-drift``: its change turned, at its honest norm, towards a fixed direction by a weight
  that grows by ``DRIFT`` every update it sends (``unit(c) + DRIFT * t * u``): small at first, with
  the model drifting along ``u`` round after round;
- ``collude-2``, ``collude-3``: ``scale-under-bound`` by two or three clients together (clients
  ``i .. i+k-1``), each turning its change by ``PULL`` towards the *same* direction ``u``: their
  shared part adds up, they raise the step's medians together, and each one's cosine is measured
  against a sum that holds the others' pull.

``wrap_hostile("scale-grams", 3)`` is a ``wrap`` for :func:`engine.simulation.run_inprocess`.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from client.worker import ClientWorker
from common.run.settings import RobustSettings
from common.wire.messages import ClientUpdate, EvalReport, RoundPlan
from server.checks import Options, sample_bounds
from server.robust_measures import CHANGE, SECOND, change, plan_starts, reweigh, scaled, tensor_role

NAIVE = ("scale-factors", "scale-grams", "flip-sign", "flip-labels")
ADAPTIVE = ("inflate-samples", "scale-under-bound", "slow-drift", "collude-2", "collude-3")
ATTACKS = NAIVE + ADAPTIVE
FACTOR_SCALE, GRAM_SCALE = 1e4, 1e6
INFLATE = 10  # inflate-samples: claimed samples per sample held
UNDER = 0.95  # scale-under-bound, collude-k: the fraction of the guard's bound aimed at
DRIFT = 0.1  # slow-drift: the drift direction's weight grows by this every update
PULL = 1.0  # collude-k: the shared direction's weight beside the honest unit change
DRIFT_SEED, COLLUDE_SEED = 7041, 4103  # the drift's and the colluders' directions (fixed: the same every run)


def colluders(kind: str) -> int:
    """How many clients the attack ``kind`` takes (``collude-3``: 3)."""
    return int(kind.split("-")[1]) if kind.startswith("collude-") else 1


def direction(name: str, shape: torch.Size, seed: int) -> Tensor:
    """A fixed unit direction (float64) of ``shape`` for the tensor ``name``: the same in every run and
    for every client that uses ``seed``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    u = torch.randn(shape, generator=g, dtype=torch.float64)
    return u / u.norm()


def turned(name: str, tensor: Tensor, starts: dict[str, Tensor], weight: float, seed: int, norm_scale: float) -> Tensor:
    """``tensor``'s change from its start replaced by ``|c| norm_scale unit(unit(c) + weight u)``, ``u`` the
    fixed :func:`direction` of ``seed``: turned towards ``u``, at ``norm_scale`` x its norm."""
    moved = change(name, tensor, starts)
    norm = float(moved.norm())
    if norm == 0.0:
        return tensor
    mixed = moved / norm + weight * direction(name, moved.shape, seed)
    new = mixed * (norm * norm_scale / float(mixed.norm()))
    return (tensor.to(torch.float64) - moved + new).to(tensor.dtype)


def under_bound(update: ClientUpdate, plan: RoundPlan, kappa: float, pull: float) -> ClientUpdate:
    """``scale-under-bound`` (``pull`` 0) or a colluder's update (``pull`` > 0): every bounded measure at
    ``UNDER * kappa`` x the update's own, its changes turned by ``pull`` towards the colluders' direction."""
    factor = UNDER * kappa
    starts = plan_starts(plan)
    tensors = dict(update.tensors)
    for name, t in tensors.items():
        role = tensor_role(name, t)
        if role == CHANGE:
            tensors[name] = turned(name, t, starts, pull, COLLUDE_SEED, factor)
        elif role == SECOND:  # per claimed sample: with the claim below, factor x its own per-sample trace
            tensors[name] = scaled(name, t, starts, factor)
    return reweigh(
        dataclasses.replace(update, tensors=tensors), max(update.num_samples, math.floor(factor * update.num_samples))
    )


def tamper(
    kind: str, update: ClientUpdate, plan: RoundPlan, *, kappa: float = 2.0, sent: int = 1, most: int = 0
) -> ClientUpdate:
    """``update`` as the attack ``kind`` would send it (``flip-labels`` changes nothing here). ``kappa``:
    the run's ``robust.kappa`` (what the adaptive attacks aim under); ``sent``: how many updates this
    client has sent, this one included (``slow-drift``); ``most``: the run's cap on the claimed samples
    of this task (``inflate-samples``; 0: none)."""
    if kind == "flip-labels":
        return update
    if kind == "inflate-samples":
        claim = INFLATE * update.num_samples
        return reweigh(update, min(claim, most) if most > 0 else claim)
    if kind == "scale-under-bound":
        return under_bound(update, plan, kappa, 0.0)
    if kind.startswith("collude-"):
        return under_bound(update, plan, kappa, PULL)
    starts = plan_starts(plan)
    tensors = dict(update.tensors)
    for name, t in tensors.items():
        role = tensor_role(name, t)
        if role == CHANGE and kind == "slow-drift":
            tensors[name] = turned(name, t, starts, DRIFT * sent, DRIFT_SEED, 1.0)
        elif role == CHANGE and kind in ("scale-factors", "flip-sign"):
            tensors[name] = scaled(name, t, starts, FACTOR_SCALE if kind == "scale-factors" else -1.0)
        elif role == SECOND and kind == "scale-grams":
            tensors[name] = scaled(name, t, starts, GRAM_SCALE)
    return dataclasses.replace(update, tensors=tensors)


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
        self.sent = 0  # updates sent so far (slow-drift's clock)
        if kind == "flip-labels":
            worker.train = MirroredLabels(worker.train, worker.tasks)

    def handle(self, plan: RoundPlan) -> ClientUpdate | EvalReport:
        out = self.worker.handle(plan)
        if not isinstance(out, ClientUpdate):
            return out
        self.sent += 1
        config = self.worker.config
        most = sample_bounds(config, Options(), plan.class_range)[1]
        kappa = config.section(RobustSettings).kappa  # the run's, as its Join reply tells every client
        return tamper(self.kind, out, plan, kappa=kappa, sent=self.sent, most=most)


def hostile_indices(kind: str, first: int, num_clients: int) -> list[int]:
    """The clients the attack ``kind`` makes hostile: ``first`` and, for ``collude-k``, the next ``k - 1``."""
    indices = [first + j for j in range(colluders(kind))]
    if indices[-1] >= num_clients:
        raise ValueError(f"{kind} takes clients {indices}, but the run has {num_clients}")
    return indices


def wrap_hostile(kind: str, index: int | list[int]) -> Callable[[int, ClientWorker], Any]:
    """A ``run_inprocess`` ``wrap`` that makes client ``index`` (or each of the list) hostile in the way ``kind``."""
    if kind not in ATTACKS:
        raise ValueError(f"unknown attack {kind!r}; known: {list(ATTACKS)}")
    hostile = {index} if isinstance(index, int) else set(index)
    return lambda i, worker: HostileWorker(worker, kind) if i in hostile else worker
