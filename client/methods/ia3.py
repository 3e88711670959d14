"""The client half of ``lorm-ia3``: train each layer's (IA)^3 vector and the head, then its merge statistic.

The plan carries the current vector of the trained side (``plan.vectors[layer]["B"]`` on the
output, ``["A"]`` on the input) and the frozen ``"E"`` (earlier tasks, for Gram passes and
evaluation). Training sees ``W0 + s dW`` as LoRM's does; the Gram pass
``W0 + extra + view_scale * s dW`` with this client's trained vector; each layer's Gram is then
reduced here to the weights of the exact merge (``common.merges.vectors.ia3_statistic``), with
``W0`` that only clients hold.
"""

from __future__ import annotations

import torch
from torch import Tensor

from client.methods.base import Client, load_head, sent_head
from client.methods.lora import LoRATrainer, gram_pass
from common.adapters.ia3 import IA3Linear
from common.merges.grams import decay_gram
from common.merges.vectors import ia3_statistic
from common.methods.ia3 import Ia3Settings
from common.wire.instructions import LoraStep, Mode
from common.wire.messages import Phase, RoundPlan
from common.wire.tensors import VECTOR, pack


def ia3_layers(client: Client) -> dict[str, IA3Linear]:
    layers = client.model.lora()
    wrong = [name for name, layer in layers.items() if not isinstance(layer, IA3Linear)]
    if wrong:
        raise TypeError(f"lorm-ia3 needs (IA)^3 layers, but {wrong[0]!r} is a {type(layers[wrong[0]]).__name__}")
    return layers  # type: ignore[return-value]


class IA3Trainer(LoRATrainer):
    """The (IA)^3 vector of every target layer, and the head, trained with ACE."""

    mode = Mode.LORA

    def load(self, client: Client, plan: RoundPlan) -> None:
        # Training sees W0 + s dW (LoRM's view); evaluation sees W0 + the merged model, in "E".
        with_extra = plan.expect(LoraStep).train_extra or plan.phase == Phase.EVALUATE
        vectors = plan.by_layer(VECTOR)
        for name, layer in ia3_layers(client).items():
            parts = vectors.get(name, {})
            vector = parts.get(layer.side)
            layer.load_vector(
                vector if vector is not None else torch.zeros_like(layer.lora_l),
                parts.get("E") if with_extra else None,
            )
            layer.scale = client.config.lora_scale if vector is not None else 0.0
        load_head(client.model, plan)

    def trainable(self, client: Client, plan: RoundPlan) -> list[torch.nn.Parameter]:
        layers, sides = ia3_layers(client), plan.expect(LoraStep).train_factors
        for layer in layers.values():
            layer.set_trainable(sides)
        return [layer.lora_l for layer in layers.values() if layer.side in sides]

    def outputs(self, client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
        layers, step, vectors = ia3_layers(client), plan.expect(LoraStep), plan.by_layer(VECTOR)
        trained = {
            name: {layer.side: layer.lora_l.detach().cpu().clone()}
            for name, layer in layers.items()
            if layer.side in step.train_factors
        }
        for name, layer in layers.items():  # the Gram-pass view, with this client's trained vector
            layer.scale = client.config.lora_scale * step.view_scale if name in vectors else 0.0
            layer.set_extra_vector(vectors.get(name, {}).get("E"))
        grams, head_gram = gram_pass(client, plan, shard, seed)
        form, gamma = client.config.section(Ia3Settings).form, client.config.gamma_backbone
        stats = {
            name: ia3_statistic(layer.side, form, decay_gram(grams[name], gamma), layer.base.weight.detach().cpu())
            for name, layer in layers.items()
            if name in grams
        }
        return pack(factors=trained, grams=stats, head=sent_head(client.model, plan), head_gram=head_gram)
