"""The client half of every LoRA method: train the plan's factors and the head, then a Gram pass.

Sends the trained factors (``LoraStep.train_factors``), the head (``send_head``), the Grams
of the LoRA layers' inputs (``gram``) and of the head's input (``head_gram``),
recorded in the view ``W0 + extra + view_scale * s B A`` over the shard with the training
augmentation, as in the reference.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from client.dpsgd import gradient_noise
from client.methods.base import Client, ClientMethod, private_noise, sent_head, set_view
from common.adapters.lora import GramRecorder
from common.privacy.gaussian import Release, add_gram_noise, noise_floor_lambda
from common.privacy.ledger import BudgetExceeded
from common.run.settings import DpSettings
from common.wire.instructions import GramKind, LoraStep, Mode, TrainInstruction
from common.wire.messages import RoundPlan
from common.wire.tensors import pack

GRAM_BATCH = 64  # no gradients in a Gram pass: larger batches, same sums


class LoRATrainer(ClientMethod):
    """LoRA factors ``B: (d_out, r)``, ``A: (r, d_in)`` per layer, and the head, trained with ACE."""

    mode = Mode.LORA

    def trainable(self, client: Client, plan: RoundPlan) -> list[torch.nn.Parameter]:
        layers, trained = client.model.lora(), plan.expect(LoraStep).train_factors
        for layer in layers.values():
            layer.set_trainable(trained)
        return [getattr(layer, f"lora_{f}") for layer in layers.values() for f in trained]

    def outputs(self, client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
        set_view(client, plan)
        grams, head_gram = gram_pass(client, plan, shard, seed)
        trained = plan.expect(LoraStep).train_factors
        factors = (
            {
                name: {f: getattr(layer, f"lora_{f}").detach().cpu().clone() for f in trained}
                for name, layer in client.model.lora().items()
            }
            if trained
            else {}
        )
        return pack(factors=factors, grams=grams, head=sent_head(client.model, plan), head_gram=head_gram)


@torch.no_grad()
def gram_pass(client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> tuple[dict[str, Tensor], Tensor | None]:
    """Grams over the shard: per LoRA layer ``(d_in,)`` or ``(d_in, d_in)`` (``plan.gram``), and the
    head input's ``(F, F)`` (``plan.head_gram``), float64; with the training augmentation as in the reference."""
    step = plan.expect(TrainInstruction)
    if not step.sends_grams:
        return {}, None
    config, model = client.config, client.model
    modules: dict = dict(model.lora()) if step.gram != GramKind.NONE else {}
    full = {name: step.gram == GramKind.FULL for name in modules}
    if step.head_gram:
        modules["<head>"] = model.head
        full["<head>"] = True
    dp = config.section(DpSettings)
    private = dp.local and shard.numel() > 0
    recorder = GramRecorder(modules, full, energy_clip=dp.gram_clip if private else None)
    generator = torch.Generator().manual_seed(seed ^ 0x5EED)
    model.eval()
    per_pass = -(-shard.numel() // GRAM_BATCH)
    with recorder.recording():
        for done_passes in range(config.gram_passes):
            for batch, start in enumerate(range(0, shard.numel(), GRAM_BATCH)):
                inputs, _ = client.train.batch(
                    shard[start : start + GRAM_BATCH],
                    client.device,
                    train=True,
                    generator=generator,
                    padded=config.gram_padding,
                )
                # Padding tokens are not inputs: their rows are left out of the Grams, unless the
                # run counts them as the reference does (gram_padding).
                recorder.row_mask = None if config.gram_padding else inputs.get("attention_mask")
                model(inputs)
                if client.on_batch is not None:
                    client.on_batch(done_passes * per_pass + batch + 1, config.gram_passes * per_pass)
    grams = {name: g.cpu() for name, g in recorder.result().items()}
    if private:
        noise_grams(client, plan, grams)
    head_gram = grams.pop("<head>", None)
    return grams, head_gram


def noise_grams(client: Client, plan: RoundPlan, grams: dict[str, Tensor]) -> None:
    """One Gram release under the run's budget (``common/privacy/training.py``), in place: the ``M`` Grams, each
    sample's energy clipped to ``c = dp.gram_clip`` in each of the ``P = gram_passes`` passes over the shard (each
    with its own augmentation), move by at most ``P sqrt(M) c`` together, so every entry gets ``N(0, (z_G P sqrt(M)
    c)^2)`` (symmetric on a full Gram). Then post-processing that reads no data: a diagonal clamped at 0, a full Gram
    plus ``lambda I`` at ``dp.lambda_scale`` times its noise's spectral norm, so that the merges' solves stay
    positive definite."""
    config = client.config
    dp = config.section(DpSettings)
    noise = private_noise(client, plan)
    sigma = noise.gram_multiplier * config.gram_passes * math.sqrt(len(grams)) * dp.gram_clip
    if not sigma > 0:  # the last check before the Grams leave: no plan or setting may send them un-noised
        raise BudgetExceeded(f"dp: a Gram release of task {plan.task} with noise deviation {sigma}: refused")
    source = gradient_noise(dp.seed, client.index, plan.task, plan.round, kind=f"gram/{plan.phase.value}")
    for name in sorted(grams):  # a fixed order of draws
        gram = grams[name]
        if gram.dim() == 1:
            gram.add_(source.normal(tuple(gram.shape)).mul_(sigma)).clamp_(min=0.0)
        else:
            add_gram_noise(gram, sigma, source)
            width = gram.shape[-1]
            gram.diagonal().add_(noise_floor_lambda(Release(1.0, sigma), width, dp.lambda_scale))
