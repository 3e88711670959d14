"""TIES-Merging with full fine-tuning: the clients' round updates merged as task vectors.

A client's task vector is its whole update of the round, flattened: every backbone delta and
the head change ``(w_i - w_g, b_i - b_g)``. Per round (Yadav et al., 2023; see
:class:`common.merges.dense.TiesAccumulator`): trim each vector to its top ``ties.density``
entries by magnitude (default 0.3), elect a sign per entry from the sum of the trimmed
vectors, average the entries that agree with it (disjoint mean), and add ``ties.scale``
(lambda, default 0.4) times the result to the global delta and head: the settings
:class:`common.methods.ties.TiesSettings`.

The fold keeps per-sign running sums and counts, so memory does not depend on the number of
clients; only the trimming threshold needs one client's whole vector at a time. Clients send
their delta and head only.
"""

from __future__ import annotations

from common.aggregation.base import present
from common.methods.ties import HEAD_B, HEAD_W, TiesAggregator, TiesSettings
from common.methods.ties import aggregator as ties_aggregator
from common.run.config import RunConfig
from common.wire.messages import ModelSpec, RoundPlan
from common.wire.tensors import HEAD_BIAS, HEAD_WEIGHT
from server.strategies.dense import DenseStrategy
from server.strategies.fold import Fold


class Ties(DenseStrategy):
    name = "ties"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        settings = config.section(TiesSettings)  # checked there: density in (0, 1], a finite scale
        self.density = settings.density  # fraction of entries each client keeps
        self.scale = settings.scale  # lambda: the merged vector's step size

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, ties_aggregator(plan, self.spec, self.config), self.merge)

    def merge(self, plan: RoundPlan, aggregator: TiesAggregator) -> None:
        merged = {name: self.scale * t for name, t in aggregator.ties.result().items()}
        self.head_w = present(plan.get(HEAD_WEIGHT)) + merged.pop(HEAD_W)
        self.head_b = present(plan.get(HEAD_BIAS)) + merged.pop(HEAD_B)
        self.add_to_delta(merged)
