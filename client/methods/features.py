"""The client half of the closed-form heads: no training, statistics of the frozen features.

``FeatureStatistics`` sends the sums of ``client/features.py`` (class sums and counts, and
with ``plan.head_gram`` the Gram factor and the held-out statistics) of the current task's
shard in the plan's view ``W0 + extra``, and evaluates the plan's head ``(C, F')`` on the
mapped features. ``LoRAThenFeatures`` serves the LoRM + closed-form head methods, whose
LoRA steps train as LoRM's and whose features steps and evaluations are feature statistics;
``DenseThenFeatures`` serves CCVR, which fine-tunes as FedAvg and sends its Gaussians' sums in
a features step at each task's end.
"""

from __future__ import annotations

from torch import Tensor

from client.features import feature_logits, feature_stats
from client.methods.base import Client, ClientMethod, load_lora, set_view, step_update
from client.methods.dense import DenseTrainer
from client.methods.lora import LoRATrainer
from common.wire.instructions import FeaturesStep, Mode
from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import DELTA, STAT, named_tensors


class FeatureStatistics(ClientMethod):
    """Sums of the frozen features; the head of a features plan is ``(C, F')``, never loaded into the model."""

    mode = Mode.FEATURES

    def load(self, client: Client, plan: RoundPlan) -> None:
        # the backbone view only (W0 + delta + extra; delta: CCVR's fine-tuned backbone): the model's
        # head has width F, the plan's F'
        load_lora(client, plan, delta=plan.named(DELTA) or None)

    def update(self, client: Client, plan: RoundPlan) -> ClientUpdate:
        """The statistics of the shard (any phase: a features step trains nothing); ``train_loss`` is NaN."""
        shard = client.shards[plan.task]
        client.model.to(client.device)
        self.load(client, plan)
        set_view(client, plan)
        stats = feature_stats(
            client.model,
            client.train,
            shard,
            client.config,
            client.device,
            plan.class_range,
            gram=plan.expect(FeaturesStep).head_gram,
            plan=plan,
        )
        return step_update(client, plan, named_tensors(STAT, stats), float("nan"))

    def logits(self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
        return feature_logits(client.model, inputs, plan, client.config)


class LoRAThenFeatures(ClientMethod):
    """LoRA plans as :class:`LoRATrainer`, features plans as :class:`FeatureStatistics`."""

    halves = {Mode.LORA: LoRATrainer(), Mode.FEATURES: FeatureStatistics()}

    def serves(self, plan: RoundPlan) -> ClientMethod:
        if plan.mode not in self.halves:
            asked = plan.mode.value if plan.mode is not None else f"no mode ({plan.instruction.KIND!r})"
            raise ValueError(
                f"{type(self).__name__} serves {[m.value for m in self.halves]} plans; this plan asks for {asked!r}"
            )
        return self.halves[plan.mode]


class DenseThenFeatures(LoRAThenFeatures):
    """Full fine-tuning plans as :class:`DenseTrainer`, features plans as :class:`FeatureStatistics` (CCVR)."""

    halves = {Mode.FULL: DenseTrainer(), Mode.FEATURES: FeatureStatistics()}
