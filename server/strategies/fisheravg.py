"""Fisher averaging with full fine-tuning: each entry weighted by the clients' diagonal Fisher.

Per entry of every backbone parameter, ``delta <- delta + sum_i F_i delta_i / sum_i F_i``, and
the head alike with its change ``w_i - w_g`` (``b_i - b_g``) and ``fisher["head.weight"]``
(``fisher["head.bias"]``). Clients send their delta, head and diagonal empirical Fisher.

Where ``sum_i F_i = 0`` — an entry no client's loss depends on, e.g. the head rows of classes
outside the current task under the ACE loss, or embeddings of tokens no client saw — the ratio
is undefined and the sample-weighted mean ``sum_i n_i delta_i / sum_i n_i`` is used (the
FedAvg step for that entry).

``F_i`` is the Fisher of client ``i``'s whole shard: ``n_i`` times its estimate where the estimator
averages over samples (``sampled``, ``expected``, ``batch``), the estimate itself where it sums
(``reference``, the paper's code). So a client weighs as its samples do, as in FedAvg and in the
paper's code, and the estimator setting changes the estimator alone (Matena & Raffel's merge with
model weights ``lambda_i = n_i``).
"""

from __future__ import annotations

from common.aggregation.base import present
from common.aggregation.dense import FisherAvgAggregator, fisheravg
from common.wire.instructions import DenseStep
from common.wire.messages import RoundPlan
from common.wire.tensors import HEAD_BIAS, HEAD_WEIGHT
from server.strategies.dense import DenseStrategy
from server.strategies.fold import Fold


class FisherAvg(DenseStrategy):
    name = "fisheravg"

    def instruction(self) -> DenseStep:
        return DenseStep(send_fisher=True)

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, fisheravg(plan, self.spec, self.config), self.merge)

    def merge(self, plan: RoundPlan, aggregator: FisherAvgAggregator) -> None:
        self.add_to_delta({name: acc.result() for name, acc in aggregator.delta.items()})
        self.head_w = present(plan.get(HEAD_WEIGHT)) + aggregator.head.result()
        self.head_b = present(plan.get(HEAD_BIAS)) + aggregator.bias.result()
