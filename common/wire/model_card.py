"""The exported model's card, ``model.json``: what, besides its tensors, rebuilds the model and serves it.

An export is one directory. The coordinator writes the tensors first and this card last (atomically), so a
directory with a ``model.json`` holds a whole export (a reader watching it never sees half of one):

- ``model.json``: this card (format ``lorm-model``, version :data:`VERSION`);
- the backbone delta: ``adapter/`` (a PEFT LoRA adapter, ``W = W0 + lora_scale * B @ A``),
  ``delta.safetensors`` (``W = W0 + delta``), or none (``W0``);
- ``head.safetensors``: ``logits = features @ weight.T + bias``, ``weight: (num_classes, feature_dim)``;
- a method's own parts by kind (``prompts.safetensors``, ``prototypes.safetensors``, ...), listed in
  ``parts``;
- ``scoring.safetensors`` and the card's ``scoring``: the run's evaluation of the model, whole: the plan its
  clients scored with (its tensors by wire name, ``common/wire/tensors.py``, and its instruction), the run's
  configuration (the method's settings: layers, pooling, normalisation, projection, ensemble, prompts, ...) and,
  for a random projection, its seed and fingerprint (``common/aggregation/projection.py``). A server scores with
  the method's own client half on it (``client/scoring.py``), as the run's clients did. Exports of earlier
  versions have no ``scoring``; their adapter or delta and head are read as that plan.

The card names the classes in head order, the backbone (a name the project's ``build_backbone`` resolves:
``minilm``, ``tiny-bert`` with its ``model_seed``, a local model directory, ``bert:NAME``, ``timm:NAME``)
and the preprocessing (text: tokens kept per sample; images: the transform and its side). A value the
exporter did not know is ``null``, and :meth:`ModelCard.missing` says which: a reader refuses such a card
by name rather than guess. Pure JSON and dataclasses: no torch, no files.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

FORMAT = "lorm-model"
VERSION = 2  # a change an older reader would misread raises it; readers refuse versions they do not know
# version 1 named the method ``strategy`` (the run configuration's earlier key); this reader reads it too
READ_VERSIONS = (1, 2)
CARD_FILE = "model.json"
ADAPTER_DIR = "adapter"
DELTA_FILE = "delta.safetensors"
HEAD_FILE = "head.safetensors"
SCORING_FILE = "scoring.safetensors"
WEIGHTS = ("adapter", "delta", "none")  # how the backbone differs from W0


@dataclass(frozen=True)
class Backbone:
    """The pretrained (or seeded random) encoder the delta applies to."""

    name: str  # RunConfig.backbone: a key of client.backbone_builders.BACKBONES, a local directory, bert:/t5:/timm:NAME
    model_seed: int  # seeds random-init backbones (tiny-bert, tiny-t5, tiny-vit): the same W0 everywhere
    base_model: str = ""  # where the clients loaded the weights from (hub name or their local path), for the record
    weights_file: str = ""  # timm ViTs: the setting model.weights (a local file), "" for the hub


@dataclass(frozen=True)
class Preprocessing:
    """How a raw sample becomes the backbone's input; the backbone's kind decides which half applies."""

    max_length: int | None  # text: tokens kept per sample (padded to it), None: unknown to the exporter
    image_transforms: str = ""  # images: the evaluation transform of this dataset's transforms (client.images)
    image_size: int = 0  # images: the setting data.image_size (0: the backbone's)


@dataclass(frozen=True)
class Scoring:
    """The run's evaluation plan of the exported model (its tensors in :data:`SCORING_FILE`), and what its clients'
    scoring read besides: the run's configuration and, for a random projection, what
    :func:`common.aggregation.projection.check` draws again."""

    instruction: str  # the plan's instruction kind (common.wire.instructions.Instruction.KIND)
    fields: dict[str, Any]  # its fields, as the wire sends them (Instruction.to_json)
    task: int  # the evaluated task, 0-based
    round: int
    class_range: list[int]  # [lo, hi) of the evaluated task
    seen_classes: int
    seed: int
    config: dict[str, Any]  # the run's configuration (RunConfig.to_json), client-local settings left out
    projection: dict[str, Any] = field(default_factory=dict)  # {}: no projection


@dataclass(frozen=True)
class ModelCard:
    """``model.json``: the classes, backbone and preprocessing of an export, and what its files hold."""

    classes: list[str] | None  # head row i is class classes[i]; None: unknown to the exporter
    backbone: Backbone
    preprocessing: Preprocessing
    weights: str  # one of WEIGHTS
    lora_scale: float  # the adapter's W0 + lora_scale * B @ A (also in adapter/adapter_config.json)
    num_classes: int  # the head's rows
    feature_dim: int  # the head's input width
    tasks: list[list[int]]  # the run's tasks as [lo, hi) class ranges
    tasks_trained: int  # how many of them the model has learned: it scores classes 0..seen_classes-1
    method: str  # the method that trained it (RunConfig.method)
    run_id: str
    parts: list[str] = field(default_factory=list)  # a method's own parts: <kind>.safetensors beside the card
    # The run's differential-privacy statement, as metrics.json's "privacy" (epsilon, delta, mode, unit, what is
    # public; docs/PRIVACY.md) for the tasks this model learned; {}: no budget, no guarantee.
    privacy: dict[str, Any] = field(default_factory=dict)
    # how the run's clients scored the model; None: an export of an earlier version (its head on the backbone's
    # features, W0 plus its delta)
    scoring: Scoring | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.weights not in WEIGHTS:
            problems.append(f"weights {self.weights!r} is not one of {list(WEIGHTS)}")
        if self.num_classes < 1 or self.feature_dim < 1:
            problems.append(f"num_classes {self.num_classes} and feature_dim {self.feature_dim} must be positive")
        if self.classes is not None and len(self.classes) != self.num_classes:
            problems.append(f"{len(self.classes)} class names for a head of {self.num_classes} classes")
        if self.classes is not None and len(set(self.classes)) != len(self.classes):
            problems.append("class names repeat")
        bounds = [b for lo_hi in self.tasks for b in lo_hi]
        if (
            not self.tasks
            or any(len(t) != 2 or t[0] >= t[1] for t in self.tasks)
            or bounds[0] != 0
            or bounds[-1] != self.num_classes
            or any(a != b for a, b in zip(bounds[1:-1:2], bounds[2:-1:2]))
        ):
            problems.append(f"tasks {self.tasks} are not contiguous [lo, hi) ranges over 0..{self.num_classes}")
        if not 1 <= self.tasks_trained <= len(self.tasks):
            problems.append(f"tasks_trained {self.tasks_trained} is not in 1..{len(self.tasks)}")
        if self.preprocessing.max_length is not None and self.preprocessing.max_length < 1:
            problems.append(f"max_length {self.preprocessing.max_length} must be positive")
        scoring = self.scoring
        if scoring is not None and (
            len(scoring.class_range) != 2
            or scoring.seen_classes != self.seen_classes
            or list(scoring.class_range) != self.tasks[self.tasks_trained - 1]
        ):
            problems.append(
                f"scoring evaluates classes {scoring.class_range} of {scoring.seen_classes} seen, the card's last task "
                f"learned is {self.tasks[self.tasks_trained - 1]} of {self.seen_classes}"
            )
        if problems:
            raise ValueError("model card: " + "; ".join(problems))

    @property
    def seen_classes(self) -> int:
        """The classes of the tasks learned so far: predictions are the argmax over these rows only."""
        return self.tasks[self.tasks_trained - 1][1]

    def missing(self) -> list[str]:
        """What a reader needs and the exporter did not know, each with where it comes from ([]: complete)."""
        gaps = []
        if self.classes is None:
            gaps.append(
                "the class names (neither the run's configuration nor its clients' model description named them: "
                "set data.classes, or run clients of this version)"
            )
        if self.preprocessing.max_length is None:
            gaps.append(
                "the tokens kept per sentence (the run's max_length was 0 and its clients' model description did "
                "not say what they chose: set max_length, or run clients of this version)"
            )
        return gaps

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, **asdict(self)}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ModelCard:
        """Inverse of :meth:`to_json`; ``ValueError`` naming what is wrong (not a card, another version, a field)."""
        try:
            v = json.loads(text)
        except ValueError as err:
            raise ValueError(f"{CARD_FILE} is not JSON ({err})") from err
        if not isinstance(v, dict) or v.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} card: expected a JSON object with format {FORMAT!r}")
        if v.get("version") not in READ_VERSIONS:
            raise ValueError(
                f"{FORMAT} version {v.get('version')!r}: this reader knows versions {READ_VERSIONS}; use the project "
                "version that exported it, or export the model again"
            )
        try:
            return cls(
                classes=None if v["classes"] is None else [str(c) for c in v["classes"]],
                backbone=Backbone(**_fields(v["backbone"], Backbone)),
                preprocessing=Preprocessing(**_fields(v["preprocessing"], Preprocessing)),
                weights=str(v["weights"]),
                lora_scale=float(v["lora_scale"]),
                num_classes=int(v["num_classes"]),
                feature_dim=int(v["feature_dim"]),
                tasks=[[int(lo), int(hi)] for lo, hi in v["tasks"]],
                tasks_trained=int(v["tasks_trained"]),
                method=str(v["method" if v["version"] >= 2 else "strategy"]),
                run_id=str(v["run_id"]),
                parts=[str(p) for p in v.get("parts", [])],
                privacy=_privacy(v.get("privacy", {})),
                scoring=_scoring(v.get("scoring")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{CARD_FILE}: {type(err).__name__}: {err}") from err


def library_key(name: str, layers: tuple[str, ...] | list[str] | dict[str, Any], prefix: str) -> str:
    """A backbone parameter's name in ``delta.safetensors``: the library model's (``prefix``, the backbone wrapper's
    path to it, stripped; a LoRA-wrapped linear's ``.base.`` removed), so that ``W0 + delta`` is a plain
    ``state_dict`` update of, e.g., the transformers model. ``layers``: the LoRA-wrapped layers' names."""
    key = name
    for layer in layers:
        if name.startswith(f"{layer}.base."):
            key = f"{layer}." + name[len(layer) + len(".base.") :]
            break
    if prefix:
        if not key.startswith(prefix) or len(key) == len(prefix):
            raise ValueError(f"parameter {key!r} does not start with the export prefix {prefix!r}")
        key = key[len(prefix) :]
    return key


def _fields(value: Any, cls: type) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{cls.__name__.lower()} must be a JSON object, got {type(value).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise TypeError(f"{cls.__name__.lower()} has no field {unknown[0]!r}; its fields: {sorted(known)}")
    return value


def _scoring(value: Any) -> Scoring | None:
    if value is None:
        return None
    given = _fields(value, Scoring)
    for name in ("fields", "config", "projection"):
        if not isinstance(given.get(name, {}), dict):
            raise TypeError(f"scoring {name} must be a JSON object")
    return Scoring(
        instruction=str(given["instruction"]),
        fields=dict(given["fields"]),
        task=int(given["task"]),
        round=int(given["round"]),
        class_range=[int(b) for b in given["class_range"]],
        seen_classes=int(given["seen_classes"]),
        seed=int(given["seed"]),
        config=dict(given["config"]),
        projection=dict(given.get("projection", {})),
    )


def _privacy(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"privacy: expected an object (the run's privacy statement), got {type(value).__name__}")
    return dict(value)
