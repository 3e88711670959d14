"""The programs' configuration flags: ``--preset``, ``--config FILE`` and repeatable ``--set KEY=VALUE``.

Every program that starts or describes a run (``lorm-server``, ``lorm-sim``, ``lorm-launch``, ``lorm-bench``, the
client's ``--model-spec``) reads its :class:`~common.run.config.RunConfig` through these: the flags, the dotted
``--set`` keys (``ridge.rp_dim=5000`` is one key of a settings section) and the order in which the sources merge.
What they build is checked as its sibling :mod:`common.run.config` checks any configuration; the checks against the
methods' registry are the caller's (``common.methods.checks.validate``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from common.run.config import LEGACY_METHOD_KEY, RunConfig, current_keys
from common.run.presets import preset


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` (JSON) and repeatable ``--set KEY=VALUE`` overrides of :class:`RunConfig`."""
    parser.add_argument("--preset", default="", help="start from a named configuration (common/run/presets.py)")
    parser.add_argument("--config", help="JSON file with RunConfig values")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one RunConfig value (parsed as JSON when possible, else a string); a "
        "dotted KEY changes one key of a setting (ridge.rp_dim=5000, data.synthetic_test=5), "
        "and an object merges into the one there, key by key",
    )


def merged(values: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``changes`` on top; where both hold an object, merged key by key (at any depth)."""
    out = dict(values)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def key_path(key: str) -> list[str]:
    """The path of a ``--set`` key in a configuration's values.

    ``a.b.c`` names key ``c`` of object ``b`` of field ``a``; in a dotted key, a first part that
    is no :class:`RunConfig` field is a settings section: ``ridge.rp_dim`` is ``settings.ridge.rp_dim``.
    """
    parts = key.split(".")
    if parts[0] == LEGACY_METHOD_KEY:
        parts[0] = "method"
    if len(parts) > 1 and parts[0] not in {f.name for f in dataclasses.fields(RunConfig)}:
        parts = ["settings", *parts]
    if not all(parts):
        raise ValueError(f"--set expects KEY or dotted KEY.PART=VALUE, got key {key!r}")
    return parts


def set_value(values: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """``values`` with the dotted ``key`` (:func:`key_path`) set to ``value`` (merged when both are objects)."""
    parts = key_path(key)
    change: Any = value
    for part in reversed(parts):
        change = {part: change}
    return merged(values, change)


def config_from_args(
    args: argparse.Namespace,
    base: dict[str, Any] | None = None,
    then: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> RunConfig:
    """Defaults < ``base`` < ``--preset`` < ``--config`` file < ``--set`` overrides (objects merge key by key),
    and last ``then`` (e.g. the schedule of ``--task``), before the configuration is built (its own fields checked;
    its settings are the caller's to check, ``common.methods.checks.validate``)."""
    values = current_keys(dict(base or {}))
    if args.preset:
        values = merged(values, current_keys(preset(args.preset)))
    if args.config:
        with open(args.config) as f:
            values = merged(values, current_keys(json.load(f)))
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        values = set_value(values, key, value)
    return RunConfig.from_dict(then(values) if then is not None else values)
