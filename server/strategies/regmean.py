"""RegMean with full fine-tuning: every linear layer merged in closed form, the rest averaged.

A linear layer's weight on client i is ``W_i = W_g + delta_i`` (``W_g`` the global weight the
round started from), so RegMean over the clients is
``W = (sum_i W_i G_i)(sum_i G_i)^-1 = W_g + (sum_i delta_i G_i)(sum_i G_i)^-1``, with
``G_i = decay_gram(X_i^T X_i, gamma_backbone)`` the decayed Gram of the layer's input
(full Grams when ``gamma_backbone > 0``, diagonals otherwise). The delta form is what is
computed: it equals RegMean of the absolute weights whenever ``sum_i G_i`` is invertible,
and where it is not (inputs no client saw) it keeps ``W_g`` instead of zeroing the columns.

Every other backbone parameter (biases, norms, embeddings) is the sample-weighted mean of the
deltas. The head weight is RegMean of the clients' head weights with the head Gram
(``gamma_head``) and the bias the sample-weighted mean, exactly as in LoRM. The paper's OOS
RegMean baseline uses ``gamma_backbone = gamma_head = 0.5``.
"""

from __future__ import annotations

from common.aggregation.dense import RegMeanAggregator, regmean, weight_param
from common.run.config import RunConfig
from common.wire.instructions import DenseStep, GramKind
from common.wire.messages import ModelSpec, RoundPlan
from server.strategies.dense import DenseStrategy
from server.strategies.fold import Fold


class RegMean(DenseStrategy):
    name = "regmean"

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        for name, (d_out, d_in) in spec.layers.items():
            shape = spec.params.get(weight_param(name))
            if shape is None or tuple(shape) != (d_out, d_in):
                raise ValueError(
                    f"layer {name!r}: expected backbone parameter {weight_param(name)!r} of shape "
                    f"{(d_out, d_in)}, got {shape}"
                )

    def instruction(self) -> DenseStep:
        return DenseStep(gram=GramKind.FULL if self.config.gamma_backbone > 0 else GramKind.DIAG, head_gram=True)

    def open(self, plan: RoundPlan) -> Fold:
        return Fold(plan, regmean(plan, self.spec, self.config), self.merge)

    def merge(self, plan: RoundPlan, aggregator: RegMeanAggregator) -> None:
        step = {name: acc.result() for name, acc in aggregator.others.items()}
        step |= {weight_param(name): acc.result() for name, acc in aggregator.layers.items()}
        self.add_to_delta(step)
        self.head_w = aggregator.head.result()
        self.head_b = aggregator.bias.result()
