"""PILoRA (Guo et al. 2024): incremental LoRA with prototypes, heterogeneity-aware prototype re-weighting.

Each task trains a LoRA module of its own, ``(B_t, A_t)`` per layer (``B`` zero, ``A`` Kaiming
at the task's start), on top of the earlier tasks' modules, which stay frozen; the model is
``W0 + sum_tau B_tau A_tau``, handed out as the plan's ``extra`` (stacked factors). The factors
are merged by FedAvg (sample-weighted means). Classification is by class prototypes
(``client/methods/pilora.py``), which the clients train with the LoRA; the coordinator merges
each class's prototypes by PILoRA's heterogeneity-aware re-weighting (:func:`reweight`): a
client's prototype weighs more the closer it lies to the class means of the clients that hold
the class. With PILoRA's factor (``soft_temp`` 5: its code's softmax of the normalised reciprocal
distances divided by 0.2) the holders' prototypes dominate; the LoRM paper's code multiplies by 0.2
instead, which weighs every client nearly alike, so the prototypes of clients that never saw a class
(moved only as that class's negatives) average in at full weight.

The re-weighting needs every client's prototypes and class means at once: the aggregator keeps
them, ``K (2 C_t F + C_t)`` numbers for ``K`` clients (the one merge here whose coordinator
memory grows with the number of clients; FedAvg's sums stay constant).
"""

from __future__ import annotations

import torch
from torch import Tensor

from common.adapters.lora import init_lora_a
from common.methods.fedproto import PROTO
from common.methods.pilora import PiLoraAggregator, PiLoraSettings
from common.methods.pilora import aggregator as pilora_aggregator
from common.run.config import RunConfig
from common.wire.instructions import LoraStep
from common.wire.messages import LowRank, ModelSpec, Phase, RoundPlan
from common.wire.tensors import EXTRA, LORA, low_rank_tensors, named_tensors
from server.strategies.base import Strategy, factors_from_tensors, factors_to_tensors, published
from server.strategies.fold import Fold

DTYPE = torch.float64


def reweight(prototypes: Tensor, means: Tensor, soft_temp: float) -> Tensor:
    """One class's merged prototype from the clients' prototypes ``(K, F)`` and the class means ``(M, F)``
    of the ``M`` clients that hold the class: with ``d_i = sum_j ||p_i - m_j||``, weights
    ``softmax(soft_temp * minmax(1 / d_i))`` over the clients, ``sum_i w_i p_i``."""
    distance = torch.cdist(prototypes.to(DTYPE), means.to(DTYPE)).sum(1)  # (K,)
    reciprocal = 1.0 / (distance + 1e-10)
    spread = reciprocal.max() - reciprocal.min()
    normalised = (reciprocal - reciprocal.min()) / spread if spread > 0 else torch.zeros_like(reciprocal)
    weights = torch.softmax(soft_temp * normalised, dim=0)
    return (weights[:, None] * prototypes.to(DTYPE)).sum(0)


class PiLoRA(Strategy):
    name = "pilora"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.settings = config.section(PiLoraSettings)
        self.done: dict[str, LowRank] = {}  # the earlier tasks' modules, factors stacked (rank r * tasks)
        self.current: dict[str, LowRank] = {}
        self.proto = torch.zeros(spec.num_classes, spec.feature_dim, dtype=DTYPE)
        self.seen = 0  # classes 0..seen-1 have prototypes

    def begin_task(self, task: int) -> None:
        lo, hi = self.tasks[task]
        if self.seen >= hi:  # begun already (a coordinator resumed after this task began)
            return
        if self.current:
            self.done = self.adapter()
        r = self.config.rank
        gen = torch.Generator().manual_seed((self.config.seed * 7919 + 41) * 1_000_003 + task)
        self.current = {
            name: LowRank(torch.zeros(d_out, r, dtype=DTYPE), init_lora_a(r, d_in, gen).to(DTYPE))
            for name, (d_out, d_in) in self.spec.layers.items()
        }
        fresh = self.settings.init * torch.randn(hi - lo, self.spec.feature_dim, generator=gen, dtype=DTYPE)
        self.proto = torch.cat([self.proto[:lo], fresh, self.proto[hi:]])
        self.seen = hi

    def prototypes(self) -> dict[str, Tensor]:
        count = (torch.arange(self.spec.num_classes) < self.seen).to(torch.float32)
        return {"mean": self.proto.to(torch.float32), "count": count}

    def exports(self) -> dict[str, dict[str, Tensor]]:
        return {"prototypes": self.prototypes()}  # the classifier

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase != Phase.TRAIN:
            raise ValueError(f"strategy {self.name!r} has no {phase} step")
        scale = self.config.lora_scale
        tensors = low_rank_tensors(LORA, {name: published(f.b, f.a) for name, f in self.current.items()})
        tensors |= low_rank_tensors(EXTRA, {name: published(f.b * scale, f.a) for name, f in self.done.items()})
        tensors |= named_tensors(PROTO, self.prototypes())
        step = LoraStep(train_factors=("B", "A"), train_extra=True, send_head=False)
        return self.base_plan(task, round_, phase, step, tensors)

    def eval_plan(self, task: int) -> RoundPlan:
        plan = super().eval_plan(task)  # extra: every task's module so far
        plan.tensors |= named_tensors(PROTO, self.prototypes())
        return plan

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, pilora_aggregator(plan, self.spec, self.config), self.merge)

    def merge(self, plan: RoundPlan, aggregator: PiLoraAggregator) -> None:
        self.current = {n: LowRank(aggregator.b[n].result(), aggregator.a[n].result()) for n in self.current}
        lo, hi = plan.class_range
        prototypes = torch.stack(aggregator.prototypes)  # (K, C_t, F)
        counts = torch.stack(aggregator.class_counts)  # (K, C_t)
        sums = torch.stack(aggregator.class_sums)  # (K, C_t, F)
        merged = self.proto[lo:hi].clone()
        for c in range(hi - lo):
            holders = counts[:, c] > 0
            if bool(holders.any()):
                means = sums[holders, c] / counts[holders, c, None]
                merged[c] = reweight(prototypes[:, c], means, self.settings.soft_temp)
        self.proto = torch.cat([self.proto[:lo], merged, self.proto[hi:]])

    def adapter(self) -> dict[str, LowRank]:
        """Every task's module so far, stacked: ``B = [B_0 .. B_t]``, ``A = [A_0; ..; A_t]``."""
        if not self.done:
            return dict(self.current)
        return {
            name: LowRank(torch.cat([self.done[name].b, f.b], dim=1), torch.cat([self.done[name].a, f.a]))
            for name, f in self.current.items()
        }

    def state_tensors(self) -> dict[str, Tensor]:
        seen = torch.tensor([self.seen])
        out = super().state_tensors() | factors_to_tensors("current", self.current) | {"proto": self.proto}
        return out | factors_to_tensors("done", self.done) | {"seen": seen}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        self.proto, self.seen = tensors["proto"], int(tensors["seen"][0])
        if self.seen:
            self.current = factors_from_tensors("current", self.spec.layers, tensors)
        if "done/" + next(iter(self.spec.layers)) + "/b" in tensors:
            self.done = factors_from_tensors("done", self.spec.layers, tensors)
