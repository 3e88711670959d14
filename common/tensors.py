"""Updates as flat dicts of named tensors: the names every layer of the system agrees on.

No protobuf here. A per-layer tensor is ``<kind>/<layer>/<part>`` (part ``B`` or ``A``) or
``<kind>/<layer>``; the head's names are fixed. The wire codec (``proto/codec.py``) sends
these names and tensors; the coordinator validates (``server/strategies/validate.py``) and
stages (``server/store.py``) updates in the same flat form.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from common.messages import ClientUpdate

# Cap on the tensor bytes one stream may declare, so that a lying header cannot make the
# receiver allocate without bound. The largest real update, full float64 Grams of a
# ViT-B/16 (4 adapted layers per block), is about 1.1 GB. Receivers may pass their own.
DEFAULT_MAX_TOTAL_BYTES = 2 << 30


class WireError(ValueError):
    """A message that breaks the wire contract; ``field`` names the offending protobuf field."""

    def __init__(self, field: str, message: str, tensor: str | None = None) -> None:
        self.field = field
        self.tensor = tensor
        where = f" (tensor {tensor!r})" if tensor is not None else ""
        super().__init__(f"{field}{where}: {message}")


# Tensor names
#
# Per-layer tensors are "<kind>/<layer>/<part>" (part "B" or "A") or "gram/<layer>"; the
# head's are fixed. Layer names are dotted module names and never empty.

LORA, EXTRA, FACTOR, GRAM, DELTA, FISHER, STAT = "lora", "extra", "factor", "gram", "delta", "fisher", "stat"
ANCHOR = "anchor"  # a plan's reference weights (W0 + anchor): EWC's penalty centre, LwF's teacher
PROMPT = "prompt"  # a plan's prompt pool (L2P, CODA-Prompt), by name
PROTO = "proto"  # a plan's global prototypes (FedProto): proto/mean, proto/count
VECTOR = "vector"  # a plan's adapter vectors per layer: VeRA's vector/<layer>/B (lb) and /A (ld); (IA)^3's and /E
MASKED = "masked"  # secure aggregation: an update's running sums, fixed point and masked (int64 bits of Z_2^64)
HEAD_WEIGHT, HEAD_BIAS, HEAD_GRAM = "head/weight", "head/bias", "head/gram"
PARTS = ("B", "A")
VECTOR_PARTS = PARTS + ("E",)  # a plan's adapter vectors: each side's trained one, and "E" the frozen extra
_FACTOR_KINDS = (LORA, EXTRA, FACTOR, VECTOR)
_NAMED_KINDS = (GRAM, DELTA, FISHER, STAT, ANCHOR, PROMPT, PROTO, MASKED)  # "<kind>/<layer or parameter name>"

# What each message may carry: the one list the codec, the validation and the flattening below read.
UPDATE_FIELDS = {
    FACTOR: "factors",
    GRAM: "grams",
    DELTA: "delta",
    FISHER: "fisher",
    STAT: "stats",
    MASKED: "masked",
}  # kind -> field
UPDATE_HEAD = {HEAD_WEIGHT: "head_weight", HEAD_BIAS: "head_bias", HEAD_GRAM: "head_gram"}  # name -> field
# shared factors, frozen extra, dense delta, anchor, Fisher, prompt pool, prototypes, adapter vectors
PLAN_KINDS = (LORA, EXTRA, DELTA, ANCHOR, FISHER, PROMPT, PROTO, VECTOR)
PLAN_HEAD = (HEAD_WEIGHT, HEAD_BIAS)


class UpTo(int):
    """An expected dimension of any size from 0 up to this bound (the rows of a Gram factor,
    ``min(samples, width)``); an ``int``, so byte limits count the bound."""

    def __repr__(self) -> str:
        return f"<={int(self)}"


def shape_fits(shape: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """``shape`` is ``want``, where an :class:`UpTo` dimension takes any size up to its bound."""
    return len(shape) == len(want) and all(0 <= s <= w if isinstance(w, UpTo) else s == w for s, w in zip(shape, want))


def tensor_name(kind: str, layer: str, part: str | None = None) -> str:
    """The wire name of a per-layer tensor: ``lora/<layer>/B``, ``gram/<layer>``, ..."""
    if not layer:
        raise WireError("tensors.name", f"a {kind} tensor needs a non-empty layer name")
    if kind in _NAMED_KINDS and part is None:
        return f"{kind}/{layer}"
    if kind in _FACTOR_KINDS and part in (VECTOR_PARTS if kind == VECTOR else PARTS):
        return f"{kind}/{layer}/{part}"
    raise WireError("tensors.name", f"no tensor kind {kind!r} with part {part!r}")


def parse_tensor_name(name: str) -> tuple[str, str | None, str | None]:
    """Inverse of :func:`tensor_name`: ``(kind, layer, part)``, e.g. ``("head", None, "bias")``."""
    if name in (HEAD_WEIGHT, HEAD_BIAS, HEAD_GRAM):
        return "head", None, name.split("/", 1)[1]
    kind, _, rest = name.partition("/")
    if kind in _NAMED_KINDS and rest:
        return kind, rest, None
    layer, _, part = rest.rpartition("/")
    if kind in _FACTOR_KINDS and layer and part in (VECTOR_PARTS if kind == VECTOR else PARTS):
        return kind, layer, part
    expected = (
        "lora|extra|factor/<layer>/B|A, vector/<layer>/B|A|E, gram|delta|fisher|stat|anchor|prompt|proto|masked/<name> "
        "or head/weight|bias|gram"
    )
    raise WireError("tensors.name", f"expected {expected}, got {name!r}")


def update_tensors(update: ClientUpdate) -> dict[str, Tensor]:
    """Every tensor of an update under its wire name (also how the coordinator stages it)."""
    tensors: dict[str, Tensor] = {}
    for layer, parts in update.factors.items():
        for part, tensor in parts.items():
            tensors[tensor_name(FACTOR, layer, part)] = tensor
    for kind, field in UPDATE_FIELDS.items():
        if kind != FACTOR:
            for name, tensor in getattr(update, field).items():
                tensors[tensor_name(kind, name)] = tensor
    for name, field in UPDATE_HEAD.items():
        tensor = getattr(update, field)
        if tensor is not None:
            tensors[name] = tensor
    return tensors


def update_nbytes(update: ClientUpdate) -> int:
    """Tensor payload bytes of an update: what the wire carries, less its ~0.1 % framing (no names built)."""
    fields = [getattr(update, field) for kind, field in UPDATE_FIELDS.items() if kind != FACTOR]
    tensors = [t for parts in update.factors.values() for t in parts.values()]
    tensors += [t for named in fields for t in named.values()]
    tensors += [t for t in (getattr(update, field) for field in UPDATE_HEAD.values()) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def update_from_tensors(tensors: dict[str, Tensor], **scalars: Any) -> ClientUpdate:
    """Inverse of :func:`update_tensors`, given the update's scalar fields."""
    factors: dict[str, dict[str, Tensor]] = {}
    named: dict[str, dict[str, Tensor]] = {kind: {} for kind in UPDATE_FIELDS if kind != FACTOR}
    for name, tensor in tensors.items():
        kind, layer, part = parse_tensor_name(name)
        if kind == FACTOR and layer is not None and part is not None:
            factors.setdefault(layer, {})[part] = tensor
        elif kind in named and layer is not None:
            named[kind][layer] = tensor
    fields: dict[str, Any] = {UPDATE_FIELDS[FACTOR]: factors} | {UPDATE_FIELDS[k]: v for k, v in named.items()}
    head: dict[str, Any] = {field: tensors.get(name) for name, field in UPDATE_HEAD.items()}
    return ClientUpdate(**fields, **head, **scalars)


def with_tensors(update: ClientUpdate, tensors: dict[str, Tensor]) -> ClientUpdate:
    """``update``'s scalar fields with ``tensors`` (wire names) in place of its own."""
    return update_from_tensors(
        tensors,
        run_id=update.run_id,
        client_id=update.client_id,
        client_index=update.client_index,
        task=update.task,
        round=update.round,
        phase=update.phase,
        num_samples=update.num_samples,
        train_loss=update.train_loss,
    )
