"""Environment variables that were renamed: the new name read first, the old one still read, with a warning."""

from __future__ import annotations

import os
from collections.abc import Mapping


def renamed_variable(new: str, old: str, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """``(value, warning)`` of the variable ``new``, or of ``old`` (its former name) when only that is set;
    ``warning`` is ``""`` unless ``old`` is set. ``ValueError`` when both are set to different values: which
    one was meant cannot be told."""
    env = os.environ if environ is None else environ
    value, former = env.get(new, ""), env.get(old, "")
    if not former:
        return value, ""
    if value and value != former:
        raise ValueError(
            f"${new}={value!r} and ${old}={former!r} differ: ${old} is the old name of ${new}; unset ${old}"
        )
    return value or former, f"${old} is the old name of ${new}: set ${new} instead (${old} is read for now)"
