"""What the robust mode (``server/robust.py``) measures of an update, and how it scales one: functions of tensors.

Each tensor of an update has a role (:func:`tensor_role`: a second or first moment, a trained change, a norm, a
count) that says what is measured of it against the step's median (:func:`measure`) and how it is scaled onto its
bound (:func:`scaled`); :func:`reweigh` makes a whole update the statistics of another number of samples. The
screen (:mod:`server.robust_screen`) measures and clips with these, and the attacks of ``engine.attacks`` forge
their updates with them.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from common.aggregation.declared import GRAM_FACTOR
from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import (
    DELTA,
    FACTOR,
    FISHER,
    GRAM,
    HEAD_BIAS,
    HEAD_GRAM,
    HEAD_WEIGHT,
    LORA,
    STAT,
    parse_tensor_name,
    tensor_name,
)

SECOND, FIRST, CHANGE, NORM, COUNT = "second moment", "first moment", "change", "norm", "count"
SAMPLES = "num_samples"  # the verdict's key for the update's claimed sample count (its reweighing)
CLASS_SUM, CLASS_COUNT = tensor_name(STAT, "class_sum"), tensor_name(STAT, "class_count")


def tensor_role(name: str, tensor: Tensor) -> str:
    """How the guard measures the tensor ``name`` of an update (one of the roles above)."""
    kind, layer, _ = parse_tensor_name(name)
    if name == HEAD_GRAM or kind == GRAM:
        return SECOND
    if kind == STAT:
        assert layer is not None
        if layer.endswith("count"):
            return COUNT
        is_square = tensor.dim() == 2 and tensor.shape[0] == tensor.shape[1]
        return SECOND if layer.endswith(GRAM_FACTOR) or is_square else FIRST
    if kind in (FACTOR, DELTA) or name in (HEAD_WEIGHT, HEAD_BIAS):
        return CHANGE
    if kind == FISHER:
        return NORM
    return COUNT  # nothing else is summed: leave it as sent


def plan_starts(plan: RoundPlan) -> dict[str, Tensor]:
    """What each trained tensor started from in this step, under the update's names (a dense
    ``delta`` is a change already; factors a plan does not hand out start at zero)."""
    starts: dict[str, Tensor] = {}
    for layer, low_rank in plan.low_rank(LORA).items():
        starts[tensor_name(FACTOR, layer, "B")] = low_rank.b
        starts[tensor_name(FACTOR, layer, "A")] = low_rank.a
    return starts | {name: t for name, t in plan.tensors.items() if name in (HEAD_WEIGHT, HEAD_BIAS)}


def change(name: str, tensor: Tensor, starts: dict[str, Tensor]) -> Tensor:
    """``tensor`` minus its start (float64), or the tensor itself when nothing started it."""
    start = starts.get(name)
    t = tensor.to(torch.float64)
    return t - start.to(tensor.dtype).to(torch.float64) if start is not None and start.shape == tensor.shape else t


def scaled(name: str, tensor: Tensor, starts: dict[str, Tensor], factor: float) -> Tensor:
    """``tensor`` with its :func:`measure` times ``|factor|``: a change scaled around its start, a
    Gram factor by ``sqrt(factor)`` (so that its Gram is times ``factor``), anything else times ``factor``."""
    role = tensor_role(name, tensor)
    if role == CHANGE:
        moved = change(name, tensor, starts)
        return (tensor.to(torch.float64) - moved + moved * factor).to(tensor.dtype)  # start + factor (t - start)
    if role == SECOND and name.endswith(GRAM_FACTOR):
        return tensor * math.sqrt(factor)
    return tensor * factor


def measure(role: str, name: str, tensor: Tensor, starts: dict[str, Tensor], samples: int) -> float:
    """The scalar the bound applies to (see ``server/robust.py``'s docstring)."""
    t = tensor.to(torch.float64)
    per_sample = 1.0 / max(samples, 1)
    if role == SECOND:
        if name.endswith(GRAM_FACTOR):
            return float(t.square().sum()) * per_sample  # tr(R^T R)
        return float((t if t.dim() == 1 else t.diagonal()).sum()) * per_sample
    if role == FIRST:
        return float(t.norm()) * per_sample
    if role == CHANGE:
        return float(change(name, tensor, starts).norm())
    return float(t.norm())


def is_sum(name: str, tensor: Tensor) -> bool:
    """Whether ``name`` is a sum over the client's samples (zero when it has none): a Gram or Gram factor, a
    class count, or a class's sums (``stat/<prefix>class_*``), as :func:`reweigh` scales them."""
    kind, layer, _ = parse_tensor_name(name)
    return tensor_role(name, tensor) == SECOND or (kind == STAT and layer is not None and "class_" in layer)


def is_count(name: str) -> bool:
    """Whether a bound's ``name`` is a count (the claimed samples, or a class count), not a tensor's."""
    return name == SAMPLES or name.startswith(CLASS_COUNT)


def apportion(counts: Tensor, total: int) -> Tensor:
    """Whole counts proportional to ``counts: (C,)`` that sum to ``total`` (largest remainders, ties to
    the lower class); a class with no count keeps none."""
    if float(counts.sum()) <= 0.0:
        return counts.clone()
    exact = counts.to(torch.float64) * (total / float(counts.sum()))
    whole = exact.floor()
    short = int(total - float(whole.sum()))
    if short > 0:
        order = sorted(range(len(exact)), key=lambda k: (-float(exact[k] - whole[k]), k))
        for k in order[:short]:
            whole[k] += 1.0
    return whole.to(counts.dtype)


def reweigh(update: ClientUpdate, samples: int) -> ClientUpdate:
    """``update`` as the statistics of ``samples`` samples instead of its ``num_samples``: with
    ``w = samples / num_samples``, every Gram times ``w`` (a Gram factor ``sqrt(w)``), each class count
    apportioned to sum to ``samples`` (held-out counts in the same ratio per class, never above the
    class's count) and each class's sums (``stat/<prefix>class_*``) scaled as its count, so that its
    class means stay as they were; trained tensors, means (a Fisher, prototypes) and the loss are not
    sums over samples and stay. The attacks of ``engine.attacks`` inflate with it (``w > 1``); the
    guard clips a count with it (``w < 1``)."""
    if samples == update.num_samples:
        return update
    w = samples / max(update.num_samples, 1)
    tensors = dict(update.tensors)
    ratios: dict[str, Tensor] = {}  # count name -> per-class ratio new / old
    counts = {name: t for name, t in tensors.items() if tensor_role(name, t) == COUNT and name.startswith(STAT + "/")}
    main = counts.get(CLASS_COUNT)
    for name, count in counts.items():
        if name == CLASS_COUNT or main is None or count.shape != main.shape:
            new = apportion(count, samples) if name == CLASS_COUNT else apportion(count, round(float(count.sum()) * w))
        else:  # held-out counts: the main count's ratio per class, whole, never above it
            kept = apportion(main, samples)
            new = torch.minimum((count.to(torch.float64) * kept / main.clamp(min=1)).floor().to(count.dtype), kept)
        ratios[name] = torch.where(count > 0, new.to(torch.float64) / count.clamp(min=1), 0.0)
        tensors[name] = new
    for name, t in tensors.items():
        role = tensor_role(name, t)
        if name in counts:
            continue
        count_name = name[: name.rfind("class_")] + "class_count" if "class_" in name else ""
        if role in (FIRST, SECOND) and count_name in ratios and t.shape[:1] == ratios[count_name].shape:
            ratio = ratios[count_name].reshape(-1, *([1] * (t.dim() - 1)))  # (C, 1, ...): each class's rows
            tensors[name] = (t.to(torch.float64) * ratio).to(t.dtype)
        elif role == SECOND:
            tensors[name] = scaled(name, t, {}, w)
    return dataclasses.replace(dataclasses.replace(update, tensors=tensors), num_samples=samples)
