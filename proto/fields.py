"""The wire's enums and the field checks every converter shares.

A phase travels as ``pb.Phase``; a value the contract does not name, ``PHASE_UNSPECIFIED`` included,
is a :class:`WireError` naming its field, as is a negative count or an empty identifier. The envelope
(:mod:`proto.codec`), secure-aggregation (:mod:`proto.secagg_codec`) and status
(:mod:`proto.status_codec`) converters check what they decode with these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from common.wire.messages import Phase
from common.wire.tensors import WireError
from proto import lorm_pb2 as pb

_PHASES: dict[Phase, pb.Phase] = {
    Phase.TRAIN: pb.PHASE_TRAIN,
    Phase.TASK_GRAM: pb.PHASE_TASK_GRAM,
    Phase.EVALUATE: pb.PHASE_EVALUATE,
    Phase.DONE: pb.PHASE_DONE,
    Phase.FEATURES: pb.PHASE_FEATURES,
}


def phase_to_proto(phase: Phase) -> pb.Phase:
    return _PHASES[Phase(phase)]


def phase_from_proto(value: int, field: str = "phase") -> Phase:
    """The :class:`Phase` of a wire enum value; ``PHASE_UNSPECIFIED`` and unknown values are errors."""
    return _enum_from_proto(_PHASES, pb.Phase.Name, value, field)


def _enum_from_proto(mapping: Mapping[Any, int], wire_name: Callable[[int], str], value: int, field: str) -> Any:
    for member, wire in mapping.items():
        if wire == value:
            return member
    raise WireError(field, f"expected one of {[wire_name(w) for w in mapping.values()]}, got {value}")


def non_negative(**values: int) -> None:
    for field, value in values.items():
        if value < 0:
            raise WireError(field, f"expected a non-negative integer, got {value}")


def non_empty(**values: str) -> None:
    for field, value in values.items():
        if not value:
            raise WireError(field, "expected a non-empty string")
