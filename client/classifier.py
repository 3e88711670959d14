"""The run's model: a backbone (``client.backbone_builders``) with LoRA on its target layers, the method's
adapter layers (VeRA, (IA)^3) and one linear head, ``ClassifierModel``; ``build_model`` builds it for a run,
``model_spec`` describes it as the coordinator knows it.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from client.backbone_builders import build_backbone
from client.backbones import Backbone
from common.adapters.lora import LoRALinear, apply_lora, lora_layers
from common.methods import method
from common.run.config import RunConfig
from common.wire.messages import ModelSpec


class ClassifierModel(nn.Module):
    """Backbone with LoRA on its target layers, and one ``Linear(feature_dim, num_classes)`` head."""

    def __init__(self, backbone: Backbone, num_classes: int, rank: int, lora_scale: float = 1.0) -> None:
        super().__init__()
        self.backbone = backbone
        self.layer_names = apply_lora(backbone, backbone.target_rule, rank, lora_scale)
        self.head = nn.Linear(backbone.feature_dim, num_classes)
        self._pristine: dict[str, Tensor] | None = None

    def lora(self) -> dict[str, LoRALinear]:
        return lora_layers(self.backbone)

    def layer_shapes(self) -> dict[str, tuple[int, int]]:
        """``name -> (d_out, d_in)`` of every LoRA layer, in module order."""
        return {name: (m.out_features, m.in_features) for name, m in self.lora().items()}

    def dense_params(self) -> dict[str, nn.Parameter]:
        """The backbone's own weights (everything but LoRA factors): what full fine-tuning trains."""
        return {n: p for n, p in self.backbone.named_parameters() if ".lora_" not in n}

    def pristine(self) -> dict[str, Tensor]:
        """A CPU copy of the backbone weights ``W0``, taken the first time it is asked for.

        Full fine-tuning changes the weights in place; every step first restores ``W0``
        (plus the plan's delta) from this copy. It is asked for before any such change.
        """
        if self._pristine is None:
            self._pristine = {n: p.detach().cpu().clone() for n, p in self.dense_params().items()}
        return self._pristine

    def forward(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        features = self.backbone(**inputs)  # (batch, feature_dim)
        return self.head(features), features  # (batch, num_classes), (batch, feature_dim)


def model_spec(
    model: ClassifierModel, classes: tuple[str, ...] | None = None, max_length: int | None = None
) -> ModelSpec:
    """``model`` as the coordinator knows it; ``classes`` (head order) and ``max_length`` (tokens kept, 0 for a
    model that reads no text) are the data's, which the model does not hold."""
    backbone = model.backbone
    return ModelSpec(
        model.layer_shapes(),
        backbone.feature_dim,
        model.head.out_features,
        backbone.export_prefix,
        backbone.base_model,
        {n: tuple(p.shape) for n, p in model.dense_params().items()},
        classes,
        max_length,
    )


def reads_text(model: ClassifierModel) -> bool:
    """Whether the backbone takes tokens (else pixels)."""
    return "pixel_values" not in inspect.signature(model.backbone.forward).parameters


def build_model(config: RunConfig, num_classes: int) -> ClassifierModel:
    """The run's model: its backbone, the method's adapter layers (``common.methods.Method.apply_adapter``), a head."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.model_seed)
        model = ClassifierModel(build_backbone(config), num_classes, config.rank, config.lora_scale)
    apply = method(config.method).apply_adapter
    if apply is not None:  # the method's own layers in place of LoRA's (VeRA, (IA)^3)
        apply(model.backbone, config)
    return model
