"""An exported model rebuilt from its directory alone (``common/wire/model_card.py``), ready to classify.

The backbone is built as the run's clients built it (``client.backbones.build_backbone`` from the card's
backbone name, seed and ``max_length``), when the card names one of the project's own backbones
(``client.backbones.BACKBONES``); an export is data, and a hub repository, a local directory or a weights file it
names would be code and weights of its author's choosing, so such a source is built only when the operator names it
(``source``, ``lorm-serve --backbone`` and ``--weights``: :func:`backbone_source`); the export's delta is added
to its weights once (``W = W0 + lora_scale * B @ A`` per adapted layer, or ``W = W0 + delta``), so a forward pass
costs what the plain backbone's does; the head scores the classes learned so far:
``p = softmax(features @ W_head[:seen].T + b_head[:seen])``, and a prediction is the argmax of ``p`` with
its probability as the score (the class the run's evaluation counts for the sample: it takes the same argmax).
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor, nn

from client.backbones import BACKBONES, Backbone, build_backbone
from client.images import image_size, image_transforms, open_rgb
from client.worker import resolve_device
from common.methods import registry
from common.run.config import RunConfig
from common.run.settings import DataSettings
from common.wire.model_card import ADAPTER_DIR, CARD_FILE, DELTA_FILE, HEAD_FILE, ModelCard

PEFT_PREFIX = "base_model.model."  # server/export.py writes adapter keys under it, as PEFT does


class ExportError(ValueError):
    """The directory is not an export this module can serve; the message says what is wrong and why."""


@dataclass(frozen=True)
class Prediction:
    index: int  # the head row: classes[index]
    label: str
    score: float  # its probability among the classes learned so far


def read_card(export: Path) -> ModelCard:
    """The card of ``export``, refused by name when absent, malformed, incomplete or not servable here."""
    path = export / CARD_FILE
    if not path.is_file():
        raise ExportError(f"{export} has no {CARD_FILE}: not a finished export (the coordinator writes it last)")
    try:
        card = ModelCard.from_json(path.read_text())
    except ValueError as err:
        raise ExportError(f"{path}: {err}") from err
    if card.missing():
        raise ExportError(f"{path} does not name {' and '.join(card.missing())}; export a run that fixes them")
    # what this module rebuilds: the head on the backbone's own features, head(backbone(x)) with the backbone
    # W0 plus the exported delta; the registry says which methods' clients score so (Method.servable)
    method = registry().get(card.method)
    if method is None or not method.servable or card.parts:
        raise ExportError(
            f"{path}: method {card.method!r} classifies with more than the head on the backbone's features "
            f"(parts {card.parts or (method.client if method else 'unknown')}); only methods whose clients train "
            "LoRA or every weight and score with the head are served"
        )
    return card


class Classifier:
    """An export's model on ``device``: :meth:`predict` takes raw samples (sentences, or images as paths,
    bytes, PIL images or :meth:`prepare`'s tensors) and returns one :class:`Prediction` each."""

    def __init__(
        self, export: str | Path, device: str = "auto", source: str | None = None, weights: str | None = None
    ) -> None:
        self.path = Path(export)
        self.card = card = read_card(self.path)
        self.classes: list[str] = card.classes or []  # read_card refused a card without them
        name, weights_file = backbone_source(card, self.path, source, weights)
        config = RunConfig(
            backbone=name,
            model_seed=card.backbone.model_seed,
            max_length=card.preprocessing.max_length or 1,
            settings={
                "data": {"image_size": card.preprocessing.image_size},
                "model": {"weights": weights_file},
            },
        )
        backbone = build_backbone(config)
        self.kind = "image" if "pixel_values" in inspect.signature(backbone.forward).parameters else "text"
        if self.kind == "image":
            self.image_size = size = image_size(config.section(DataSettings))
            self.transform = image_transforms(card.preprocessing.image_transforms, size).test
        _add_delta(backbone, self.path, card)
        head = load_file(str(self.path / HEAD_FILE))
        weight, bias = head["weight"], head["bias"]  # (num_classes, feature_dim), (num_classes,)
        if tuple(weight.shape) != (card.num_classes, backbone.feature_dim) or tuple(bias.shape) != (card.num_classes,):
            raise ExportError(
                f"{self.path / HEAD_FILE}: expected weight ({card.num_classes}, {backbone.feature_dim}) and bias "
                f"({card.num_classes},) for backbone {card.backbone.name!r}, got {tuple(weight.shape)} and "
                f"{tuple(bias.shape)}"
            )
        seen = card.seen_classes
        self.device = resolve_device(device)
        self.backbone = backbone.to(self.device).eval()
        self.head = nn.Linear(backbone.feature_dim, seen).to(self.device)
        with torch.no_grad():
            self.head.weight.copy_(weight[:seen])
            self.head.bias.copy_(bias[:seen])

    def describe(self) -> dict[str, Any]:
        """What the server reports of the model it serves."""
        card = self.card
        return {
            "path": str(self.path),
            "run_id": card.run_id,
            "method": card.method,
            "backbone": card.backbone.name,
            "tasks_trained": card.tasks_trained,
            "tasks": len(card.tasks),
            "classes": self.classes[: card.seen_classes],
            "kind": self.kind,
        }

    def encode(self, samples: Sequence[Any]) -> dict[str, Tensor]:
        """Sentences tokenised as in training (padded to ``max_length``), or images through the test transform."""
        if self.kind == "text":
            if not all(isinstance(s, str) for s in samples):
                raise TypeError("this model classifies sentences: every input must be a string")
            return self.backbone.encode(list(samples))
        pixels = [s if isinstance(s, Tensor) else self.prepare(_image(s)) for s in samples]
        if any(p.shape != (3, self.image_size, self.image_size) for p in pixels):
            raise RuntimeError("an image was prepared for the export served before this one: send it again")
        return {"pixel_values": torch.stack(pixels)}  # (batch, 3, H, W)

    def prepare(self, image: Image.Image) -> Tensor:
        """An RGB image as the model takes it, ``(3, H, W)`` at its input size (the evaluation transform): the
        server prepares each image as it decodes it, so that a large one is not held until its batch runs."""
        return self.transform(image)

    @torch.inference_mode()
    def probabilities(self, inputs: dict[str, Tensor]) -> Tensor:
        """``(batch, seen_classes)``: softmax of the head's logits over the classes learned so far."""
        features = self.backbone(**{k: v.to(self.device) for k, v in inputs.items()})  # (batch, feature_dim)
        return torch.softmax(self.head(features).float(), dim=1)

    def predict(self, samples: Sequence[Any]) -> list[Prediction]:
        if not samples:
            return []
        best, index = self.probabilities(self.encode(samples)).max(dim=1)
        return [Prediction(int(i), self.classes[int(i)], float(p)) for p, i in zip(best.tolist(), index.tolist())]


def _image(sample: Any) -> Image.Image:
    if isinstance(sample, Image.Image):
        return sample.convert("RGB")
    if isinstance(sample, (bytes, bytearray)):
        with Image.open(io.BytesIO(sample)) as image:
            return image.convert("RGB")
    return open_rgb(sample)  # a path


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backbone`` and ``--weights``: the operator's own source for an export whose card names a backbone that is
    not one of the project's (a hub repository, a local directory) or a weights file."""
    parser.add_argument(
        "--backbone",
        default=None,
        metavar="SOURCE",
        help="build the export's backbone from SOURCE (a local directory, bert:/t5:/timm:NAME); needed when the "
        "card names a source other than the project's own backbones, which is never followed on the card's word",
    )
    parser.add_argument(
        "--weights", default=None, metavar="FILE", help="the backbone's weights file (timm ViTs), instead of the card's"
    )


def backbone_source(card: ModelCard, export: Path, backbone: str | None, weights: str | None) -> tuple[str, str]:
    """The backbone and weights file to build ``card``'s model from: the card's when it names one of the project's
    own backbones and no weights file, else the operator's (``backbone``, ``weights``); ``ExportError`` naming the
    card's source when it would be followed on the card's word alone."""
    name = backbone or card.backbone.name
    weights_file = weights if weights is not None else card.backbone.weights_file
    if backbone is None and name not in BACKBONES:
        raise ExportError(
            f"{export}: the card names backbone {name!r:.200}, not one of this project's ({', '.join(BACKBONES)}): an "
            "export's card does not choose the code and weights a server loads; pass the source yourself "
            "(--backbone SOURCE) if it is the one the run trained"
        )
    if weights is None and weights_file:
        raise ExportError(
            f"{export}: the card names the weights file {weights_file!r:.200}: pass it yourself (--weights FILE) "
            "if it is the one the run trained"
        )
    return name, weights_file


@torch.no_grad()
def _add_delta(backbone: Backbone, export: Path, card: ModelCard) -> None:
    """Fold the export's backbone delta into the weights, checking every name and shape against the backbone."""
    prefix = backbone.export_prefix
    if card.weights == "adapter":
        folder = export / ADAPTER_DIR
        config = json.loads((folder / "adapter_config.json").read_text())
        scale = config["lora_alpha"] / config["r"]  # PEFT's scaling, as server/export.py writes it
        if not math.isclose(scale, card.lora_scale, rel_tol=1e-9):
            raise ExportError(f"{folder}: adapter scaling {scale} differs from the card's lora_scale {card.lora_scale}")
        with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as f:
            keys = set(f.keys())
            layers = sorted(
                {k[len(PEFT_PREFIX) : -len(".lora_A.weight")] for k in keys if k.endswith(".lora_A.weight")}
            )
            if not layers or keys != {f"{PEFT_PREFIX}{n}.lora_{s}.weight" for n in layers for s in "AB"}:
                raise ExportError(f"{folder}: expected lora_A and lora_B of each layer, got {sorted(keys)[:4]}")
            for name in layers:
                linear = _linear(backbone, prefix + name, folder)
                b, a = (
                    f.get_tensor(f"{PEFT_PREFIX}{name}.lora_B.weight"),
                    f.get_tensor(f"{PEFT_PREFIX}{name}.lora_A.weight"),
                )
                if b.shape[0] != linear.out_features or a.shape[1] != linear.in_features or b.shape[1] != a.shape[0]:
                    raise ExportError(
                        f"{folder}: layer {name!r} is {tuple(linear.weight.shape)}, its factors B {tuple(b.shape)} "
                        f"and A {tuple(a.shape)}"
                    )
                linear.weight.add_((scale * b @ a).to(linear.weight))  # (d_out, k) @ (k, d_in)
    elif card.weights == "delta":
        delta = load_file(str(export / DELTA_FILE))
        params = dict(backbone.named_parameters())
        unknown = [k for k in delta if prefix + k not in params]
        if unknown:
            raise ExportError(
                f"{export / DELTA_FILE}: parameters {unknown[:3]} are not in backbone {card.backbone.name!r}"
            )
        for key, d in delta.items():
            p = params[prefix + key]
            if p.shape != d.shape:
                raise ExportError(
                    f"{export / DELTA_FILE}: {key!r} is {tuple(d.shape)}, the backbone's {tuple(p.shape)}"
                )
            p.add_(d.to(p))


def _linear(backbone: Backbone, name: str, where: Path) -> nn.Linear:
    try:
        module = backbone.get_submodule(name)
    except AttributeError as err:
        raise ExportError(f"{where}: layer {name!r} is not in the backbone") from err
    if not isinstance(module, nn.Linear):
        raise ExportError(f"{where}: layer {name!r} is a {type(module).__name__}, not a Linear layer")
    return module
