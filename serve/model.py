"""An exported model rebuilt from its directory alone (``common/wire/model_card.py``), ready to classify.

An export holds the plan its run's clients evaluated the model with (``scoring.safetensors`` and the card's
``scoring``: the tensors, the instruction and the run's configuration). This module builds the model as a client
builds it (``client.classifier.build_model``: the card's backbone, seed and ``max_length``, the method's adapter
layers) and scores with the method's own client half in that plan's view (``client/scoring.py``, which the clients'
evaluation calls too), so every method is served and a prediction is the class the run's evaluation counts: the
argmax over the classes learned so far, with its softmax probability as the score. An export of an earlier version
(no ``scoring``) is its head on the backbone's features with its adapter or delta: those are read as that plan.

The backbone is built from the card's name only when it is one of the project's own backbones
(``client.backbone_builders.BACKBONES``); an export is data, and a hub repository, a local directory or a weights
file it names would be code and weights of its author's choosing, so such a source is built only when the operator
names it (``source``, ``lorm-serve --backbone`` and ``--weights``: :func:`backbone_source`). A random projection is
drawn again from its seed and checked against the card's fingerprint (``common/aggregation/projection.py``).
"""

from __future__ import annotations

import argparse
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
from torch import Tensor

from client.backbone_builders import BACKBONES
from client.classifier import ClassifierModel, build_model, reads_text
from client.images import image_size, image_transforms, open_rgb
from client.methods import ClientMethod
from client.methods.dense import DenseTrainer
from client.scoring import ServedModel, scoring_half, seen_logits, trimmed
from client.worker import resolve_device
from common.aggregation.projection import check as check_projection
from common.methods import registry
from common.methods.checks import validate
from common.run.config import RunConfig
from common.run.settings import DataSettings
from common.wire.instructions import DenseStep, Instruction, LoraStep
from common.wire.messages import LowRank, Phase, RoundPlan
from common.wire.model_card import (
    ADAPTER_DIR,
    CARD_FILE,
    DELTA_FILE,
    HEAD_FILE,
    SCORING_FILE,
    ModelCard,
    library_key,
)
from common.wire.tensors import DELTA, EXTRA, HEAD_WEIGHT, head_tensors, low_rank_tensors, named_tensors

PEFT_PREFIX = "base_model.model."  # server/export.py writes adapter keys under it, as PEFT does
# the methods whose exports an earlier version (no card ``scoring``) wrote as the head on the backbone's features,
# W0 plus the adapter or delta: how their clients scored, so the files are read as that plan
EARLIER_EXPORTS = frozenset(
    {"lorm", "lorm-b-only", "lorm-avg-tasks", "lorm-seq", "fedavg-lora", "fedavg", "regmean", "fisheravg"}
    | {"head-only", "ewc", "fedprox", "lwf", "target", "ties", "lorm-vera"}
)


class ExportError(ValueError):
    """The directory is not an export this module can serve; the message says what is wrong and why."""


@dataclass(frozen=True)
class Prediction:
    index: int  # the head row: classes[index]
    label: str
    score: float  # its probability among the classes learned so far


def read_card(export: Path) -> ModelCard:
    """The card of ``export``, refused by name when absent, malformed, incomplete, or of a method this version does
    not have."""
    path = export / CARD_FILE
    if not path.is_file():
        raise ExportError(f"{export} has no {CARD_FILE}: not a finished export (the coordinator writes it last)")
    try:
        card = ModelCard.from_json(path.read_text())
    except ValueError as err:
        raise ExportError(f"{path}: {err}") from err
    if card.missing():
        raise ExportError(f"{path} does not name {' and '.join(card.missing())}; export a run that fixes them")
    if card.method not in registry():
        raise ExportError(
            f"{path}: method {card.method!r:.100} is not one of this version's ({len(registry())} methods): serve it "
            "with the project version that trained it"
        )
    if card.scoring is None and (card.method not in EARLIER_EXPORTS or card.parts):
        raise ExportError(
            f"{path}: an export of an earlier version without its scoring plan, of method {card.method!r}"
            + (f" with parts {card.parts}" if card.parts else "")
            + ", whose clients scored with more than the head on the backbone's features: serve it with the project "
            "version that exported it"
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
        config = served_config(card, self.path, name, weights_file)
        half: ClientMethod | None = None
        if card.scoring is None:  # an earlier export: the head on the backbone's features, as its clients scored
            model = build_model(config, card.num_classes)
            plan = earlier_plan(card, self.path, model)
            half = DenseTrainer() if card.weights == "delta" else ClientMethod()
        else:
            plan = scoring_plan(card, self.path)
            head = plan.get(HEAD_WEIGHT)
            model = build_model(config, int(head.shape[0]) if head is not None else card.num_classes)
        self.plan = plan
        self.kind = "text" if reads_text(model) else "image"
        if self.kind == "image":
            self.image_size = size = image_size(config.section(DataSettings))
            self.transform = image_transforms(card.preprocessing.image_transforms, size).test
        if card.scoring is not None and card.scoring.projection:
            try:
                check_projection(card.scoring.projection)
            except ValueError as err:
                raise ExportError(f"{self.path / CARD_FILE}: {err}") from err
        self.device = resolve_device(device)
        self.served = ServedModel(config, model, self.device, half)
        try:
            self.half = scoring_half(self.served, plan)
            self.probabilities(self.encode([self._probe()]))  # every shape met once, here, not at a first request
        except (RuntimeError, ValueError, KeyError, IndexError, AssertionError) as err:
            raise ExportError(
                f"{self.path}: its scoring plan does not fit backbone {card.backbone.name!r} and method "
                f"{card.method!r} ({type(err).__name__}: {str(err)[:300]})"
            ) from err
        self.backbone = model.backbone

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
            return self.served.model.backbone.encode(list(samples))
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
        """``(batch, seen_classes)``: softmax of the method's scores over the classes learned so far (the batch's
        padding trimmed as a client's evaluation trims it)."""
        batch = {k: v.to(self.device) for k, v in trimmed(inputs).items()}
        return torch.softmax(seen_logits(self.half, self.served, self.plan, batch).float(), dim=1)

    def predict(self, samples: Sequence[Any]) -> list[Prediction]:
        if not samples:
            return []
        best, index = self.probabilities(self.encode(samples)).max(dim=1)
        return [Prediction(int(i), self.classes[int(i)], float(p)) for p, i in zip(best.tolist(), index.tolist())]

    def _probe(self) -> Any:
        if self.kind == "text":
            return "a"
        return torch.zeros(3, self.image_size, self.image_size)


def served_config(card: ModelCard, export: Path, backbone: str, weights_file: str) -> RunConfig:
    """The run's configuration as its clients held it (the card's ``scoring``; an earlier export: what its card
    names), built from the backbone the server chose (:func:`backbone_source`) and the ``max_length`` the clients
    resolved."""
    prep = card.preprocessing
    if card.scoring is None:
        return validate(
            RunConfig(
                backbone=backbone,
                model_seed=card.backbone.model_seed,
                max_length=prep.max_length or 1,
                method=card.method,
                lora_scale=card.lora_scale,
                settings={"data": {"image_size": prep.image_size}, "model": {"weights": weights_file}},
            )
        )
    try:
        config = validate(RunConfig.from_dict(dict(card.scoring.config)))
    except (TypeError, ValueError) as err:
        raise ExportError(f"{export / CARD_FILE}: scoring config: {err}") from err
    if config.method != card.method:
        raise ExportError(f"{export / CARD_FILE}: scoring config is of method {config.method!r}, not {card.method!r}")
    model = dict(config.settings.get("model", {})) | {"weights": weights_file}
    return config.replace(
        backbone=backbone,
        model_seed=card.backbone.model_seed,
        max_length=prep.max_length or 1,
        settings={**config.settings, "model": model},
    )


def scoring_plan(card: ModelCard, export: Path) -> RoundPlan:
    """The plan that evaluated the exported model: the card's ``scoring`` with ``scoring.safetensors``."""
    scoring = card.scoring
    assert scoring is not None
    path = export / SCORING_FILE
    try:
        instruction = Instruction.from_wire(scoring.instruction, json.dumps(scoring.fields), registry)
        tensors = load_file(str(path))
    except (OSError, ValueError) as err:  # safetensors' own errors are ValueErrors or OSErrors
        raise ExportError(f"{path}: {err}") from err
    if instruction.MODE is None:
        raise ExportError(f"{export / CARD_FILE}: scoring instruction {scoring.instruction!r} is no step's")
    return RoundPlan(
        run_id=card.run_id,
        phase=Phase.EVALUATE,
        task=scoring.task,
        round=scoring.round,
        class_range=(scoring.class_range[0], scoring.class_range[1]),
        seen_classes=scoring.seen_classes,
        instruction=instruction,
        tensors=tensors,
        seed=scoring.seed,
    )


def earlier_plan(card: ModelCard, export: Path, model: ClassifierModel) -> RoundPlan:
    """An earlier export's files (no card ``scoring``) as the plan that evaluated them: the head, and the adapter as
    the view ``extra`` (``lora_scale * B``, ``A``) or the delta by ``model``'s parameter names."""
    lo, hi = card.tasks[card.tasks_trained - 1]
    return RoundPlan(
        run_id=card.run_id,
        phase=Phase.EVALUATE,
        task=card.tasks_trained - 1,
        round=0,
        class_range=(lo, hi),
        seen_classes=card.seen_classes,
        instruction=DenseStep() if card.weights == "delta" else LoraStep(),
        tensors=_earlier_tensors(card, export, model),
    )


def _earlier_tensors(card: ModelCard, export: Path, probe: ClassifierModel) -> dict[str, Tensor]:
    head = load_file(str(export / HEAD_FILE))
    if set(head) != {"weight", "bias"}:
        raise ExportError(f"{export / HEAD_FILE}: expected weight and bias, got {sorted(head)[:4]}")
    weight, bias = head["weight"], head["bias"]
    width = probe.backbone.feature_dim
    if tuple(weight.shape) != (card.num_classes, width) or tuple(bias.shape) != (card.num_classes,):
        raise ExportError(
            f"{export / HEAD_FILE}: expected weight ({card.num_classes}, {width}) and bias ({card.num_classes},) "
            f"for backbone {card.backbone.name!r}, got {tuple(weight.shape)} and {tuple(bias.shape)}"
        )
    tensors = head_tensors(weight, bias)
    prefix = probe.backbone.export_prefix
    if card.weights == "adapter":
        folder = export / ADAPTER_DIR
        adapter_config = json.loads((folder / "adapter_config.json").read_text())
        scale = adapter_config["lora_alpha"] / adapter_config["r"]  # PEFT's scaling, as server/export.py writes it
        if not math.isclose(scale, card.lora_scale, rel_tol=1e-9):
            raise ExportError(f"{folder}: adapter scaling {scale} differs from the card's lora_scale {card.lora_scale}")
        with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as f:
            keys = set(f.keys())
            layers = sorted(
                {k[len(PEFT_PREFIX) : -len(".lora_A.weight")] for k in keys if k.endswith(".lora_A.weight")}
            )
            if not layers or keys != {f"{PEFT_PREFIX}{n}.lora_{s}.weight" for n in layers for s in "AB"}:
                raise ExportError(f"{folder}: expected lora_A and lora_B of each layer, got {sorted(keys)[:4]}")
            unknown = [n for n in layers if prefix + n not in probe.lora()]
            if unknown:
                raise ExportError(f"{folder}: layer {unknown[0]!r} is not in the backbone")
            factors = {
                prefix + n: LowRank(
                    scale * f.get_tensor(f"{PEFT_PREFIX}{n}.lora_B.weight"),
                    f.get_tensor(f"{PEFT_PREFIX}{n}.lora_A.weight"),
                )
                for n in layers
            }
        return tensors | low_rank_tensors(EXTRA, factors)
    if card.weights == "delta":
        delta = load_file(str(export / DELTA_FILE))
        names = {library_key(n, tuple(probe.lora()), prefix): n for n in probe.dense_params()}
        unknown = [k for k in delta if k not in names]
        if unknown:
            raise ExportError(
                f"{export / DELTA_FILE}: parameters {unknown[:3]} are not in backbone {card.backbone.name!r}"
            )
        return tensors | named_tensors(DELTA, {names[k]: d for k, d in delta.items()})
    return tensors


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
