"""FedAvg with full fine-tuning: the sample-weighted mean of the clients' deltas and heads.

``delta <- delta + sum_i n_i delta_i / sum_i n_i``, head weight and bias
``sum_i n_i w_i / sum_i n_i``. Clients send their delta and head only.
"""

from __future__ import annotations

from common.aggregation.dense import FedAvgAggregator, fedavg
from common.wire.messages import RoundPlan
from server.strategies.dense import DenseStrategy
from server.strategies.fold import Fold


class FedAvg(DenseStrategy):
    name = "fedavg"

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, fedavg(plan, self.spec, self.config), self.merge)

    def merge(self, plan: RoundPlan, aggregator: FedAvgAggregator) -> None:
        self.add_to_delta({name: acc.result() for name, acc in aggregator.delta.items()})
        self.head_w = aggregator.head.result()
        self.head_b = aggregator.bias.result()
