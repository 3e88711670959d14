"""The names of the tensors that plans and updates carry: the names every layer of the system agrees on.

No protobuf here. A tensor is ``<kind>/<name>``, or ``<kind>/<layer>/<part>`` for the factor kinds
(part ``B`` or ``A``); the head's names are fixed. Plans and updates hold their tensors flat, by these
names (``RoundPlan.tensors``, ``ClientUpdate.tensors``); the wire codec (``proto/codec.py``) sends them
as they are, the coordinator validates (``common/aggregation/validate.py``) and stages
(``server/store.py``) them in the same form.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

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
# A tensor is "<kind>/<name>" or, for the kinds of PARTED, "<kind>/<layer>/<part>"; the head's are fixed.
# Layer and parameter names are dotted module names, never empty. The kinds below are the ones the shared
# client halves use; a method may send any other kind ("<kind>/<name>"), declared by its step
# (common/aggregation/declared.py or its slice): no list here names every kind a message may carry.

LORA, EXTRA, FACTOR, GRAM, DELTA, FISHER, STAT = "lora", "extra", "factor", "gram", "delta", "fisher", "stat"
ANCHOR = "anchor"  # a plan's reference weights (W0 + anchor): EWC's penalty centre, LwF's teacher
PROMPT = "prompt"  # a plan's prompt pool (L2P, CODA-Prompt), by name
VECTOR = "vector"  # a plan's adapter vectors per layer: VeRA's vector/<layer>/B (lb) and /A (ld); (IA)^3's and /E
MASKED = "masked"  # secure aggregation: an update's running sums, fixed point and masked (int64 bits of Z_2^64)
HEAD = "head"
HEAD_WEIGHT, HEAD_BIAS, HEAD_GRAM = "head/weight", "head/bias", "head/gram"
PARTS = ("B", "A")
VECTOR_PARTS = PARTS + ("E",)  # a plan's adapter vectors: each side's trained one, and "E" the frozen extra
PARTED = {LORA: PARTS, EXTRA: PARTS, FACTOR: PARTS, VECTOR: VECTOR_PARTS}  # kind -> the parts of its layers
HEAD_NAMES = (HEAD_WEIGHT, HEAD_BIAS, HEAD_GRAM)


class UpTo(int):
    """An expected dimension of any size from 0 up to this bound (the rows of a Gram factor,
    ``min(samples, width)``); an ``int``, so byte limits count the bound."""

    def __repr__(self) -> str:
        return f"<={int(self)}"


def shape_fits(shape: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """``shape`` is ``want``, where an :class:`UpTo` dimension takes any size up to its bound."""
    return len(shape) == len(want) and all(0 <= s <= w if isinstance(w, UpTo) else s == w for s, w in zip(shape, want))


def tensor_name(kind: str, layer: str, part: str | None = None) -> str:
    """The wire name of a tensor: ``lora/<layer>/B``, ``gram/<layer>``, ``<kind>/<name>``."""
    if not kind or "/" in kind or kind == HEAD:
        raise WireError("tensors.name", f"expected a kind without '/' other than 'head', got {kind!r}")
    if not layer:
        raise WireError("tensors.name", f"a {kind} tensor needs a non-empty layer name")
    if kind in PARTED and part in PARTED[kind]:
        return f"{kind}/{layer}/{part}"
    if kind not in PARTED and part is None:
        return f"{kind}/{layer}"
    raise WireError("tensors.name", f"no tensor kind {kind!r} with part {part!r}")


def parse_tensor_name(name: str) -> tuple[str, str | None, str | None]:
    """Inverse of :func:`tensor_name`: ``(kind, layer, part)``, e.g. ``("lora", "q", "B")``, ``("gram", "q",
    None)``, ``("head", None, "bias")``; ``WireError`` for a name of neither form."""
    if name in HEAD_NAMES:
        return HEAD, None, name.split("/", 1)[1]
    kind, _, rest = name.partition("/")
    if kind in PARTED:
        layer, _, part = rest.rpartition("/")
        if layer and part in PARTED[kind]:
            return kind, layer, part
    elif kind and kind != HEAD and rest:
        return kind, rest, None
    raise WireError(
        "tensors.name",
        f"expected <kind>/<name>, {'|'.join(PARTED)}/<layer>/<part> or {'|'.join(HEAD_NAMES)}, got {name!r}",
    )


def layered(kind: str, by_layer: dict[str, dict[str, Tensor]]) -> dict[str, Tensor]:
    """``<kind>/<layer>/<part>`` tensors of ``layer -> part -> tensor``."""
    return {tensor_name(kind, layer, part): t for layer, parts in by_layer.items() for part, t in parts.items()}


def low_rank_tensors(kind: str, factors: dict[str, Any]) -> dict[str, Tensor]:
    """``<kind>/<layer>/B`` and ``/A`` of ``layer -> LowRank``."""
    return layered(kind, {layer: {"B": f.b, "A": f.a} for layer, f in factors.items()})


def named_tensors(kind: str, named: dict[str, Tensor]) -> dict[str, Tensor]:
    """``<kind>/<name>`` tensors of ``name -> tensor``."""
    return {tensor_name(kind, name): t for name, t in named.items()}


def head_tensors(weight: Tensor | None, bias: Tensor | None) -> dict[str, Tensor]:
    """The head's tensors, when it is there (``weight (C, F)`` and ``bias (C,)`` travel together)."""
    return {} if weight is None or bias is None else {HEAD_WEIGHT: weight, HEAD_BIAS: bias}


def without_head(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """``tensors`` less the head's."""
    return {name: t for name, t in tensors.items() if name not in HEAD_NAMES}


def pack(
    *,
    factors: dict[str, dict[str, Tensor]] | None = None,
    grams: dict[str, Tensor] | None = None,
    delta: dict[str, Tensor] | None = None,
    fisher: dict[str, Tensor] | None = None,
    stats: dict[str, Tensor] | None = None,
    head: dict[str, Tensor] | None = None,
    head_gram: Tensor | None = None,
) -> dict[str, Tensor]:
    """An update's tensors under their wire names, from what the shared client halves compute: trained factors
    (``layer -> part``), Grams, dense deltas, Fisher and feature statistics by name, the head (:func:`sent_head`)
    and its input's Gram."""
    tensors = layered(FACTOR, factors or {}) | named_tensors(GRAM, grams or {}) | named_tensors(DELTA, delta or {})
    tensors |= named_tensors(FISHER, fisher or {}) | named_tensors(STAT, stats or {}) | (head or {})
    return tensors | ({HEAD_GRAM: head_gram} if head_gram is not None else {})
