"""A frozen dataclass from decoded JSON, each value checked against its field's annotation.

A field is annotated ``bool``, ``int``, ``float``, ``str``, an ``Enum`` (taken by its value), or
``tuple[X, ...]`` / ``list[X]`` of those. A value is taken only when it is of its field's kind: a bool is
never a number, an int is a float too (converted), a list's items are each of the item's kind, and a float is
finite unless the caller leaves that to the class. Whatever one field cannot say alone (ranges, fields that
exclude each other) is the class's own ``__post_init__``'s, which raises as it does.

Every refusal is a ``ValueError`` that names the field as the caller names it (``setting ridge.rp_dim``,
``instruction 'lora' field 'view_scale'``), what it expects and what came, its type and its value.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeVar

D = TypeVar("D")


def parse_fields(
    cls: type[D], values: Mapping[str, Any], owner: str, name: Callable[[str], str], finite: bool = True
) -> D:
    """``cls(**values)``, every value of ``values`` (a decoded JSON object) checked by :func:`coerce`; ``ValueError``
    for a key that is no field of ``cls`` (naming it as ``name(key)`` and every field of ``owner``) or a value
    of another kind. Fields ``values`` leaves out take their defaults."""
    hints = typing.get_type_hints(cls)
    known = sorted(f.name for f in dataclasses.fields(typing.cast(Any, cls)))
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown {name(unknown[0])}; {owner} has {known}")
    return cls(**{key: coerce(name(key), hints[key], value, finite) for key, value in values.items()})


def coerce(where: str, kind: Any, value: Any, finite: bool = True) -> Any:
    """``value`` as ``kind`` when it is one (an int, never a bool, is a float too; a float must be finite when
    ``finite``); else ``ValueError`` naming ``where``, the kind expected, and the type and value that came."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            return origin(coerce(f"{where}[{i}]", args[0], v, finite) for i, v in enumerate(value))
    elif isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"{where} expects one of {[m.value for m in kind]}, got {value!r}") from None
    elif kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if finite and not math.isfinite(value):
            raise ValueError(f"{where} expects a finite number, got {value!r}")
        return float(value)
    elif kind in (int, str, bool) and type(value) is kind:
        return value
    raise ValueError(f"{where} expects {type_name(kind)}, got {type(value).__name__} {value!r}")


def type_name(kind: Any) -> str:
    """``int``, ``tuple[float, ...]``: an annotation as one writes it."""
    return str(getattr(kind, "__name__", kind)) if typing.get_origin(kind) is None else str(kind).replace("typing.", "")
