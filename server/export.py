"""Write the result of a finished run in formats that need none of this project's code.

- :func:`export_adapter`: the merged backbone delta ``dW = B_cat @ A_cat`` of every LoRA layer
  (docs/METHOD.md §2.7, the low-rank form of the task merge) as one standard PEFT LoRA adapter of rank
  ``k = T * r``, loadable with ``PeftModel.from_pretrained(base, out_dir)``, or by hand:
  ``W = W0 + lora_scale * lora_B @ lora_A`` with safetensors alone;
- :func:`export_head`: the classifier head as a safetensors file;
- :func:`export_scoring`: the run's evaluation plan of the model (``scoring.safetensors``), which the card's
  ``scoring`` completes (:func:`scoring`): how the run's clients scored, for every method;
- :func:`export_card`: ``model.json`` (``common.wire.model_card``), written last: the classes in head order, the
  backbone and the preprocessing, so that the directory alone rebuilds and serves the model
  (:func:`model_card` fills it from what the coordinator knows);
- :func:`write_metrics`: the run summary as JSON.

Pure file I/O: no gRPC, no logging. Every file is written to a temporary file in the target
directory and moved into place with ``os.replace``, so a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from common.aggregation.declared import feature_stats_of
from common.aggregation.projection import described
from common.infra.files import atomic_write_bytes
from common.run.config import RunConfig, without_client_local
from common.run.partition import task_ranges
from common.run.schedule import configured_classes
from common.run.settings import DataSettings, ModelSettings
from common.wire.messages import LowRank, ModelSpec, RoundPlan
from common.wire.model_card import (
    CARD_FILE,
    HEAD_FILE,
    SCORING_FILE,
    Backbone,
    ModelCard,
    Preprocessing,
    Scoring,
    library_key,
)

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # the names PEFT looks for
ADAPTER_CONFIG = "adapter_config.json"
METRICS_FILE = "metrics.json"
PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the base model, as PEFT saves keys


def export_adapter(
    out_dir: str | os.PathLike,
    adapter: dict[str, LowRank],
    spec: ModelSpec,
    *,
    rank_per_task: int,
    lora_scale: float = 1.0,
) -> Path:
    """Write ``adapter`` as a PEFT LoRA adapter directory and return its path.

    ``adapter`` maps every layer of ``spec.layers`` (names relative to our backbone wrapper) to
    ``LowRank(b, a)`` with ``b: (d_out, k)``, ``a: (k, d_in)``, the same ``k`` for all layers
    (``k = T * rank_per_task`` after ``T`` tasks). The model it describes is
    ``W = W0 + lora_scale * b @ a`` per layer.

    Files written:

    - ``adapter_model.safetensors``: ``base_model.model.<name>.lora_A.weight: (k, d_in)`` and
      ``base_model.model.<name>.lora_B.weight: (d_out, k)``, float32, where ``<name>`` is the
      layer name without ``spec.export_prefix`` (i.e. relative to the library model);
    - ``adapter_config.json``: ``r = k`` and ``lora_alpha = k * lora_scale``, so that PEFT's
      scaling ``lora_alpha / r`` equals ``lora_scale``; ``target_modules`` lists every layer.

    Raises ``ValueError`` naming the layer when a layer is missing or unknown, a shape does not
    match ``spec``, a factor is not finite, or the ranks disagree.
    """
    if rank_per_task < 1:
        raise ValueError(f"`rank_per_task` should be a positive integer, got {rank_per_task}")
    if not math.isfinite(lora_scale) or lora_scale == 0.0:
        raise ValueError(f"`lora_scale` should be finite and non-zero, got {lora_scale}")
    rank, factors = _checked_factors(adapter, spec)
    if rank % rank_per_task != 0:
        raise ValueError(f"adapter rank {rank} is not a multiple of rank_per_task {rank_per_task}")

    tensors: dict[str, Tensor] = {}
    for name, (b, a) in factors.items():
        key = PEFT_PREFIX + _strip_prefix(name, spec.export_prefix)
        tensors[f"{key}.lora_A.weight"] = a  # (k, d_in)
        tensors[f"{key}.lora_B.weight"] = b  # (d_out, k)
    metadata = {
        "format": "pt",
        "lorm.rank_per_task": str(rank_per_task),
        "lorm.tasks": str(rank // rank_per_task),
        "lorm.lora_scale": repr(float(lora_scale)),
    }

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / ADAPTER_WEIGHTS, safetensors_bytes(tensors, metadata=metadata))
    config = _lora_config(spec, rank, lora_scale, [_strip_prefix(n, spec.export_prefix) for n in factors])
    atomic_write_bytes(out / ADAPTER_CONFIG, (json.dumps(config, indent=2) + "\n").encode())
    return out


def export_head(out_dir: str | os.PathLike, head_w: Tensor, head_b: Tensor) -> Path:
    """Write ``head.safetensors`` with ``weight: (num_classes, feature_dim)`` and ``bias: (num_classes,)``.

    Both are stored as float32; the head computes ``logits = features @ weight.T + bias``.
    Returns the file's path.
    """
    if head_w.dim() != 2 or head_b.dim() != 1 or head_b.shape[0] != head_w.shape[0]:
        raise ValueError(
            f"head must be weight (num_classes, feature_dim) and bias (num_classes,), "
            f"got weight {tuple(head_w.shape)} and bias {tuple(head_b.shape)}"
        )
    tensors = {"weight": _float32(head_w), "bias": _float32(head_b)}
    for key, t in tensors.items():
        if not torch.isfinite(t).all():
            raise ValueError(f"head {key} has non-finite values")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / HEAD_FILE
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata={"format": "pt"}))
    return path


def export_dense_delta(path: str | os.PathLike, delta: dict[str, Tensor], spec: ModelSpec) -> Path:
    """Full fine-tuning baselines: ``delta.safetensors`` with the model ``W0 + delta``.

    Keys are the backbone library model's parameter names (``spec.export_prefix`` stripped,
    the LoRA wrapper's ``.base.`` removed), so ``W0 + delta`` is a plain ``state_dict`` update
    of, e.g., the transformers model. Every parameter of ``spec.params`` must be present,
    shaped as there, and finite.
    """
    missing = [n for n in spec.params if n not in delta]
    unknown = [n for n in delta if n not in spec.params]
    if missing or unknown:
        raise ValueError(f"dense delta: missing parameter(s) {missing[:3]}, unknown {unknown[:3]}")
    tensors: dict[str, Tensor] = {}
    for name, shape in spec.params.items():
        t = _float32(delta[name])
        if tuple(t.shape) != tuple(shape) or not torch.isfinite(t).all():
            raise ValueError(
                f"dense delta {name!r}: expected finite values of shape {tuple(shape)}, got shape {tuple(t.shape)}"
            )
        tensors[library_key(name, spec.layers, spec.export_prefix)] = t
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, safetensors_bytes(tensors, metadata={"format": "pt", "lorm.kind": "dense_delta"}))
    return out


def export_tensors(out_dir: str | os.PathLike, kind: str, named: dict[str, Tensor]) -> Path:
    """``<kind>.safetensors``: a method's own part of the model by name, float32 (``Strategy.exports``):
    L2P's and CODA-P's prompt pool (``prompts``), FedProto's and PILoRA's class prototypes (``prototypes``).
    With the head, the backbone delta or adapter, it is the whole trained model."""
    return _write_kind(out_dir, kind, {name: _float32(t) for name, t in named.items()})


def export_scoring(out_dir: str | os.PathLike, plan: RoundPlan) -> Path:
    """``scoring.safetensors``: the tensors of ``plan``, the run's evaluation of the model, by wire name
    (``common/wire/tensors.py``), as its clients received them: each in its own dtype, every float one finite."""
    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in plan.tensors.items()}
    return _write_kind(out_dir, SCORING_FILE.removesuffix(".safetensors"), tensors)


def _write_kind(out_dir: str | os.PathLike, kind: str, tensors: dict[str, Tensor]) -> Path:
    """``<kind>.safetensors`` holding ``tensors`` as they are, refused (nothing written) when a float one is not
    finite."""
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise ValueError(f"{kind}: non-finite values in {bad[:3]}")
    path = Path(out_dir) / f"{kind}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata={"format": "pt", "lorm.kind": kind}))
    return path


def scoring(plan: RoundPlan, config: RunConfig, spec: ModelSpec) -> Scoring:
    """The card's ``scoring``: what of ``plan`` its tensors do not hold, the run's configuration without the
    client-local settings (paths on some machine), and the random projection's seed and fingerprint when the
    method's features step has one (``common/aggregation/projection.py``)."""
    mapped = feature_stats_of(config).features
    width = mapped.feature_width(spec.feature_dim)
    return Scoring(
        instruction=plan.instruction.KIND,
        fields=json.loads(plan.instruction.to_json()),
        task=plan.task,
        round=plan.round,
        class_range=list(plan.class_range),
        seen_classes=plan.seen_classes,
        seed=plan.seed,
        config=json.loads(without_client_local(config).to_json()),
        projection=described(config.seed, mapped.rp_dim, width) if mapped.rp_dim else {},
    )


def model_card(
    config: RunConfig,
    spec: ModelSpec,
    head_w: Tensor,
    *,
    weights: str,
    tasks_trained: int,
    parts: list[str],
    privacy: dict[str, Any] | None = None,
    scoring: Scoring | None = None,
) -> ModelCard:
    """The card of the model the run has after ``tasks_trained`` tasks, from the coordinator's knowledge: its
    configuration and the clients' model description. The class names are the configuration's where it fixes
    them (``data.classes``: the schedule, which may have grown past what the clients described), else the
    clients'; ``max_length`` the one the clients resolved, else the configuration's. What neither knows (a
    description of an older client) stays ``None``."""
    data = config.section(DataSettings)
    classes = configured_classes(config)
    if classes is None and spec.classes is not None:
        classes = list(spec.classes)
    return ModelCard(
        classes=classes,
        backbone=Backbone(config.backbone, config.model_seed, spec.base_model, config.section(ModelSettings).weights),
        preprocessing=Preprocessing(
            max_length=spec.max_length or config.max_length or None,
            image_transforms=data.transforms if config.dataset == "imagefolder" else config.dataset,
            image_size=data.image_size,
        ),
        weights=weights,
        lora_scale=float(config.lora_scale),
        num_classes=spec.num_classes,
        feature_dim=int(head_w.shape[1]),
        tasks=[[lo, hi] for lo, hi in task_ranges(spec.num_classes, config.num_tasks, config.task_sizes)],
        tasks_trained=tasks_trained,
        method=config.method,
        run_id=config.run_id,
        parts=sorted(parts),
        privacy=dict(privacy or {}),
        scoring=scoring,
    )


def export_card(out_dir: str | os.PathLike, card: ModelCard) -> Path:
    """Write ``model.json``. Written after every file it describes: its presence marks a whole export."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / CARD_FILE
    atomic_write_bytes(path, card.to_json().encode())
    return path


def write_metrics(out_dir: str | os.PathLike, summary: dict[str, Any]) -> Path:
    """Write ``summary`` as ``metrics.json`` (strict JSON: NaN and infinities become ``null``).

    Raises ``TypeError`` for values JSON cannot hold, before anything is written. Returns the
    file's path.
    """
    text = json.dumps(_json_safe(summary), indent=2, allow_nan=False) + "\n"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / METRICS_FILE
    atomic_write_bytes(path, text.encode())
    return path


def _checked_factors(adapter: dict[str, LowRank], spec: ModelSpec) -> tuple[int, dict[str, tuple[Tensor, Tensor]]]:
    """Validate ``adapter`` against ``spec``; return the common rank ``k`` and float32
    ``(b: (d_out, k), a: (k, d_in))`` per layer, in ``spec`` order."""
    if not spec.layers:
        raise ValueError("spec has no LoRA layers: nothing to export")
    missing = [n for n in spec.layers if n not in adapter]
    if missing:
        raise ValueError(f"adapter is missing layer(s) {missing}; expected every layer of the spec")
    unknown = [n for n in adapter if n not in spec.layers]
    if unknown:
        raise ValueError(f"adapter has layer(s) {unknown} that are not in the spec")
    rank: int | None = None
    factors: dict[str, tuple[Tensor, Tensor]] = {}
    for name, (d_out, d_in) in spec.layers.items():
        b, a = adapter[name].b, adapter[name].a
        k = b.shape[-1] if b.dim() == 2 else -1
        if b.dim() != 2 or a.dim() != 2 or b.shape[0] != d_out or a.shape != (k, d_in) or k < 1:
            raise ValueError(
                f"layer {name!r}: expected B ({d_out}, k) and A (k, {d_in}) with k >= 1, "
                f"got B {tuple(b.shape)} and A {tuple(a.shape)}"
            )
        if rank is not None and k != rank:
            raise ValueError(
                f"layer {name!r} has rank {k}, but earlier layers have rank {rank}; an adapter has one rank"
            )
        rank = k
        b32, a32 = _float32(b), _float32(a)
        for label, t in (("B", b32), ("A", a32)):
            if not torch.isfinite(t).all():
                raise ValueError(f"layer {name!r}: factor {label} has non-finite values")
        factors[name] = (b32, a32)
    assert rank is not None
    return rank, factors


def _lora_config(spec: ModelSpec, rank: int, lora_scale: float, targets: list[str]) -> dict[str, Any]:
    """The ``adapter_config.json`` fields that fix how PEFT applies the adapter."""
    alpha = rank * lora_scale
    return {
        "peft_type": "LORA",
        "task_type": None,  # a bare base model (PeftModel), no task head
        "base_model_name_or_path": spec.base_model or None,  # None: the base is given when loading
        "revision": None,
        "inference_mode": True,
        "r": rank,
        "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,  # scaling alpha / r = lora_scale
        "lora_dropout": 0.0,
        "target_modules": targets,  # exact names: PEFT matches a name equal to an entry
        "bias": "none",
        "fan_in_fan_out": False,  # torch Linear layout: W (d_out, d_in)
        "use_rslora": False,  # rsLoRA would scale by alpha / sqrt(r)
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def _strip_prefix(name: str, prefix: str) -> str:
    if not name.startswith(prefix) or len(name) == len(prefix):
        raise ValueError(f"layer {name!r} does not start with the export prefix {prefix!r}")
    return name[len(prefix) :]


def _float32(t: Tensor) -> Tensor:
    # A fresh contiguous copy: safetensors refuses tensors that share storage or are strided.
    return t.detach().to(device="cpu", dtype=torch.float32).contiguous().clone()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
