"""TIES-Merging with full fine-tuning: the clients' round updates merged as task vectors.

A client's task vector is its whole update of the round, flattened: every backbone delta and
the head change ``(w_i - w_g, b_i - b_g)``. Per round (Yadav et al., 2023; see
:class:`common.dense_merge.TiesAccumulator`): trim each vector to its top ``ties.density``
entries by magnitude (default 0.3), elect a sign per entry from the sum of the trimmed
vectors, average the entries that agree with it (disjoint mean), and add ``ties.scale``
(lambda, default 0.4) times the result to the global delta and head: the settings
:class:`common.settings.TiesSettings`.

The fold keeps per-sign running sums and counts, so memory does not depend on the number of
clients; only the trimming threshold needs one client's whole vector at a time. Clients send
their delta and head only.
"""

from __future__ import annotations

from common.config import RunConfig
from common.declared import Shapes
from common.dense_merge import TiesAccumulator
from common.messages import ClientUpdate, ModelSpec, RoundPlan
from common.settings import TiesSettings
from common.tensors import DELTA, HEAD_BIAS, HEAD_WEIGHT
from server.strategies.base import Aggregator, present
from server.strategies.dense import DenseStrategy, head_delta

HEAD_W, HEAD_B = "<head>.weight", "<head>.bias"  # the head's entries of the task vector


class TiesAggregator(Aggregator):
    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, density: float) -> None:
        super().__init__(plan, declared)
        self.spec = spec
        shapes = {name: tuple(shape) for name, shape in spec.params.items()}
        shapes |= {HEAD_W: (spec.num_classes, spec.feature_dim), HEAD_B: (spec.num_classes,)}
        self.ties = TiesAccumulator(shapes, density)

    def _fold(self, update: ClientUpdate) -> None:
        dw, db = head_delta(update, self.plan)
        self.ties.fold(update.named(DELTA) | {HEAD_W: dw, HEAD_B: db})


class Ties(DenseStrategy):
    name = "ties"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        settings = config.section(TiesSettings)  # checked there: density in (0, 1], a finite scale
        self.density = settings.density  # fraction of entries each client keeps
        self.scale = settings.scale  # lambda: the merged vector's step size

    def aggregator(self, plan: RoundPlan) -> Aggregator:
        return TiesAggregator(plan, self.declared(plan), self.spec, self.density)

    def aggregate(self, plan: RoundPlan, aggregator: Aggregator) -> None:
        assert isinstance(aggregator, TiesAggregator)
        merged = {name: self.scale * t for name, t in aggregator.ties.result().items()}
        self.head_w = present(plan.get(HEAD_WEIGHT)) + merged.pop(HEAD_W)
        self.head_b = present(plan.get(HEAD_BIAS)) + merged.pop(HEAD_B)
        self.add_to_delta(merged)
