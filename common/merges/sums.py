"""An accumulator's running sums as named tensors, and back: what secure aggregation adds up.

Every merge that secure aggregation supports keeps only running sums of per-client
terms (``common/merges/regmean.py``). A class opts in by naming them:

- ``SUMS``: attributes that are sums: a tensor, a float or int (a sample count, a weight), or a
  dict of tensors;
- ``PARTS``: attributes that are accumulators themselves (or dicts of them), walked in turn.

A client folds its own update into a fresh accumulator and reads :func:`running_sums`: these are
its terms, computed by the very code that folds updates on the coordinator. The coordinator
unmasks only their sum over clients and :func:`load_running_sums` it into a fresh accumulator,
which then solves as if it had folded every update itself. ``count`` attributes (how many were
folded) are set to the number of clients summed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

DTYPE = torch.float64


def summable(obj: Any) -> bool:
    """Whether ``obj`` and every part of it declare their running sums (``SUMS``/``PARTS``)."""
    return not_summable(obj) is None


def not_summable(obj: Any, path: str = "") -> str | None:
    """The first of ``obj`` and its parts that does not declare its running sums, as ``path (type)``; ``None``
    when all do."""
    if not (hasattr(type(obj), "SUMS") and hasattr(type(obj), "PARTS")):
        return f"{path.rstrip('/') or 'itself'} ({type(obj).__name__})"
    for name in type(obj).PARTS:
        part = getattr(obj, name)
        items = part.items() if isinstance(part, dict) else [("", part)]
        for key, p in items:
            found = not_summable(p, f"{path}{name}" + (f"/{key}" if key else "") + "/")
            if found is not None:
                return found
    return None


def _require(obj: Any) -> None:
    if not summable(obj):
        raise TypeError(f"{type(obj).__name__} does not declare its running sums (SUMS, PARTS)")


def running_sums(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every running sum of ``obj`` and its parts: ``path -> float64 tensor`` (scalars 0-d)."""
    _require(obj)
    out: dict[str, Tensor] = {}
    for name in type(obj).SUMS:
        value = getattr(obj, name)
        if value is None:
            raise ValueError(f"{type(obj).__name__}.{name}: nothing folded yet")
        if isinstance(value, dict):
            out |= {f"{prefix}{name}/{k}": t.detach().to(DTYPE) for k, t in value.items()}
        else:
            out[f"{prefix}{name}"] = torch.as_tensor(value, dtype=DTYPE).detach().clone()
    for name in type(obj).PARTS:
        part = getattr(obj, name)
        if isinstance(part, dict):
            for k, p in part.items():
                out |= running_sums(p, f"{prefix}{name}/{k}/")
        else:
            out |= running_sums(part, f"{prefix}{name}/")
    return out


def load_running_sums(obj: Any, sums: dict[str, Tensor], count: int, prefix: str = "") -> None:
    """Set ``obj``'s running sums from ``sums`` (the layout :func:`running_sums` gives) as if ``count``
    updates had been folded; ``KeyError`` naming the first missing sum."""
    _require(obj)
    for name in type(obj).SUMS:
        value = getattr(obj, name)
        if isinstance(value, dict):
            for k in value:
                value[k] = sums[f"{prefix}{name}/{k}"].to(DTYPE).clone()
        elif isinstance(value, int) and not isinstance(value, bool):
            setattr(obj, name, int(round(float(sums[f"{prefix}{name}"]))))
        elif isinstance(value, float):
            setattr(obj, name, float(sums[f"{prefix}{name}"]))
        else:  # a tensor, or None before the first fold
            setattr(obj, name, sums[f"{prefix}{name}"].to(DTYPE).clone())
    for name in type(obj).PARTS:
        part = getattr(obj, name)
        if isinstance(part, dict):
            for k, p in part.items():
                load_running_sums(p, sums, count, f"{prefix}{name}/{k}/")
        else:
            load_running_sums(part, sums, count, f"{prefix}{name}/")
    if not isinstance(getattr(type(obj), "count", None), property) and isinstance(getattr(obj, "count", None), int):
        obj.count = count
