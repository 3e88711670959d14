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

from torch import Tensor

from common.config import FISHER_SUMMED
from common.declared import HEAD_FISHER, Shapes
from common.dense_merge import FisherMeanAccumulator
from common.messages import ClientUpdate, DenseStep, ModelSpec, RoundPlan
from common.tensors import DELTA, FISHER, HEAD_BIAS, HEAD_WEIGHT
from server.strategies.base import Aggregator, present
from server.strategies.dense import DenseStrategy, head_delta


class FisherAvgAggregator(Aggregator):
    PARTS = ("delta", "head", "bias")  # its running sums (common/sums.py): what secure aggregation adds up

    def __init__(self, plan: RoundPlan, declared: Shapes, spec: ModelSpec, summed: bool) -> None:
        super().__init__(plan, declared)
        self.spec = spec
        self.summed = summed  # the estimator sums over samples (``reference``) rather than averaging
        self.delta = {name: FisherMeanAccumulator(tuple(shape)) for name, shape in spec.params.items()}
        self.head = FisherMeanAccumulator((spec.num_classes, spec.feature_dim))
        self.bias = FisherMeanAccumulator((spec.num_classes,))

    def _fold(self, update: ClientUpdate) -> None:
        n = update.num_samples
        scale = 1.0 if self.summed else float(n)  # the Fisher of the shard, not of one sample

        fisher, delta = update.named(FISHER), update.named(DELTA)

        def shard(name: str) -> Tensor:
            return fisher[name] * scale

        for name, acc in self.delta.items():
            acc.fold(delta[name], shard(name), n)
        dw, db = head_delta(update, self.plan)
        self.head.fold(dw, shard(HEAD_FISHER[0]), n)
        self.bias.fold(db, shard(HEAD_FISHER[1]), n)


class FisherAvg(DenseStrategy):
    name = "fisheravg"

    def instruction(self) -> DenseStep:
        return DenseStep(send_fisher=True)

    def aggregator(self, plan: RoundPlan) -> Aggregator:
        return FisherAvgAggregator(plan, self.declared(plan), self.spec, summed=self.config.fisher in FISHER_SUMMED)

    def aggregate(self, plan: RoundPlan, aggregator: Aggregator) -> None:
        assert isinstance(aggregator, FisherAvgAggregator)
        self.add_to_delta({name: acc.result() for name, acc in aggregator.delta.items()})
        self.head_w = present(plan.get(HEAD_WEIGHT)) + aggregator.head.result()
        self.head_b = present(plan.get(HEAD_BIAS)) + aggregator.bias.result()
