"""The client half of ``lorm-vera``: train one VeRA vector per layer and the head, then its merge statistics.

The plan carries the shared vectors (``plan.vectors``: ``lb`` as side ``"B"``, ``ld`` as ``"A"``);
the frozen ``B, A`` are the layers' own, rebuilt from the run's seed (``common/adapters/vera.py``). After
training, a Gram pass in the view ``W0 + extra + view_scale * s diag(lb) B diag(ld) A`` (as LoRM's),
and each layer's Gram is reduced on this side to what the merge needs
(``common.merges.vectors.vera_statistic``): the dense Gram never leaves the client.
"""

from __future__ import annotations

import torch
from torch import Tensor

from client.methods.base import Client, load_head, sent_head
from client.methods.lora import LoRATrainer, gram_pass
from common.adapters.vera import VeRALinear
from common.merges.grams import decay_gram
from common.merges.vectors import vera_statistic
from common.methods.vera import VeraSettings
from common.wire.instructions import LoraStep, Mode
from common.wire.messages import Phase, RoundPlan
from common.wire.tensors import EXTRA, VECTOR, pack


def vera_layers(client: Client) -> dict[str, VeRALinear]:
    layers = client.model.lora()
    wrong = [name for name, layer in layers.items() if not isinstance(layer, VeRALinear)]
    if wrong:
        raise TypeError(f"lorm-vera needs VeRA layers, but {wrong[0]!r} is a {type(layers[wrong[0]]).__name__}")
    return layers  # type: ignore[return-value]


def _view(client: Client, plan: RoundPlan, scale: float, with_extra: bool, load: bool = True) -> None:
    """The vectors at ``scale`` (0 for layers the plan leaves out), and the plan's extra if asked; ``load``:
    the plan's shared vectors, else the layers' own (after training: this client's trained ones)."""
    shared, extras = plan.by_layer(VECTOR), plan.low_rank(EXTRA) if with_extra else {}
    for name, layer in vera_layers(client).items():
        vectors = shared.get(name)
        if vectors is not None and load:
            layer.load_vectors(vectors["B"], vectors["A"])
        layer.scale = scale if vectors is not None else 0.0
        extra = extras.get(name)
        layer.set_extra(extra.b if extra else None, extra.a if extra else None)


class VeRATrainer(LoRATrainer):
    """VeRA's ``lb: (d_out,)`` or ``ld: (r,)`` per layer (the trained factors), and the head, trained with ACE."""

    mode = Mode.LORA

    def load(self, client: Client, plan: RoundPlan) -> None:
        _view(client, plan, client.config.lora_scale, plan.expect(LoraStep).train_extra)  # training view: W0 + s delta
        load_head(client.model, plan)

    def trainable(self, client: Client, plan: RoundPlan) -> list[torch.nn.Parameter]:
        layers, sides = vera_layers(client), plan.expect(LoraStep).train_factors
        for layer in layers.values():
            layer.set_trainable(sides)
        return [layer.vector(side) for layer in layers.values() for side in sides]

    def outputs(self, client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
        layers, step, shared = vera_layers(client), plan.expect(LoraStep), plan.by_layer(VECTOR)
        trained = {
            name: {s: layer.vector(s).detach().cpu().clone() for s in step.train_factors}
            for name, layer in layers.items()
        }
        # The Gram pass sees this client's trained vectors, as LoRM's sees its trained factors.
        _view(client, plan, client.config.lora_scale * step.view_scale, True, load=False)
        grams, head_gram = gram_pass(client, plan, shard, seed)
        if plan.phase == Phase.TRAIN:
            form, gamma = client.config.section(VeraSettings).form, client.config.gamma_backbone
            grams = {
                name: vera_statistic(
                    side,
                    form,
                    decay_gram(grams[name], gamma),
                    layer.lora_B.detach().cpu(),
                    layer.lora_A.detach().cpu(),
                    shared[name]["B"],
                    shared[name]["A"],
                )
                for name, layer in layers.items()
                for side in step.train_factors
            }
        return pack(factors=trained, grams=grams, head=sent_head(client.model, plan), head_gram=head_gram)
