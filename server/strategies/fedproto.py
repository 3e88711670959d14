"""FedProto (Tan et al. 2022), with FedAvg of the weights as the paper ran it.

Clients fine-tune every backbone weight and the head with ACE plus FedProto's prototype loss
(``client/methods/prototypes.py``), and send FedAvg's delta and head and, of the task's classes,
their feature sums ``S_c`` and counts ``n_c`` at their trained weights. The coordinator merges
the weights by FedAvg and sets the global prototype of each class of the round's task to
``p_c = sum_i S_ic / sum_i n_ic``: the count-weighted mean of the clients' prototypes, from
sums (memory ``(C, F)``, independent of the number of clients). Every plan carries the
prototypes of all classes seen so far (``proto/mean``, ``proto/count``: the slice,
``common/methods/fedproto.py``; an old class keeps the prototype of its task's last round).
"""

from __future__ import annotations

import torch
from torch import Tensor

from common.methods.fedproto import PROTO, FedProtoAggregator
from common.methods.fedproto import aggregator as fedproto_aggregator
from common.run.config import RunConfig
from common.wire.messages import ModelSpec, RoundPlan
from common.wire.tensors import named_tensors
from server.strategies.fedavg import FedAvg
from server.strategies.fold import Fold


class FedProto(FedAvg):
    name = "fedproto"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        self.proto_mean = torch.zeros(spec.num_classes, spec.feature_dim, dtype=torch.float64)
        self.proto_count = torch.zeros(spec.num_classes, dtype=torch.float64)

    def prototypes(self) -> dict[str, Tensor]:
        return {"mean": self.proto_mean.to(torch.float32), "count": self.proto_count.to(torch.float32)}

    def exports(self) -> dict[str, dict[str, Tensor]]:
        return {"prototypes": self.prototypes()}

    def plan_tensors(self) -> dict[str, Tensor]:
        return named_tensors(PROTO, self.prototypes())

    def eval_plan(self, task: int) -> RoundPlan:
        plan = super().eval_plan(task)
        plan.tensors |= self.plan_tensors()
        return plan

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, fedproto_aggregator(plan, self.spec, self.config), self.merge_prototypes)

    def merge_prototypes(self, plan: RoundPlan, aggregator: FedProtoAggregator) -> None:
        """FedAvg's merge, and the task's classes' prototypes from their feature sums and counts."""
        self.merge(plan, aggregator)
        sums, (lo, hi) = aggregator.sums.value(), plan.class_range
        count = sums["class_count"]
        mean = sums["class_sum"] / count.clamp_min(1.0)[:, None]
        self.proto_mean = torch.cat([self.proto_mean[:lo], mean, self.proto_mean[hi:]])
        self.proto_count = torch.cat([self.proto_count[:lo], count, self.proto_count[hi:]])

    def state_tensors(self) -> dict[str, Tensor]:
        return super().state_tensors() | {"proto/mean": self.proto_mean, "proto/count": self.proto_count}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        self.proto_mean, self.proto_count = tensors["proto/mean"], tensors["proto/count"]
