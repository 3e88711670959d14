"""Stored cells compared with planned ones: a configuration as lorm-bench compares cells (:func:`_comparable`:
today's fields, the settings sections the run reads, each at the default of the code that ran it, as
``lab/provenance.py`` reads it, without settings that have no effect), the twin a cell may reuse instead of
running (:func:`_twin_key`) and what changed in a stored cell's configuration (:func:`_config_changes`). The
grid's runner (``lab/runner.py``) reuses and warns by them."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from common.methods import registry, sections, split_invariant
from common.methods.checks import validate
from common.run.config import RunConfig, current_keys
from common.run.settings import DataSettings, DpSettings, ModelSettings, RobustSettings, SecAggSettings
from lab.provenance import defaults_then

# Every RunConfig field's default value, as a configuration's JSON holds it.
FIELD_DEFAULTS = {
    f.name: json.loads(json.dumps(f.default if f.default_factory is dataclasses.MISSING else f.default_factory()))
    for f in dataclasses.fields(RunConfig)
}


@functools.cache
def _setting_defaults() -> dict[str, dict[str, Any]]:
    """Every settings section's defaults in this code, as a configuration's JSON holds them."""
    return {name: json.loads(json.dumps(dataclasses.asdict(cls()))) for name, cls in sections().items()}


def _fields(config: dict) -> dict:
    """A stored configuration's fields by today's RunConfig: one it predates at its default (a field is added with
    the behaviour that was there before it), ``method`` under its earlier name too; without the run's name."""
    return {k: v for k, v in ({**FIELD_DEFAULTS, **current_keys(config)}).items() if k != "run_id"}


def _read_sections(values: dict) -> list[str]:
    """The settings sections a run of ``values`` (:func:`_fields`) reads: the data's and the model's; its method's own;
    the guard's, secure aggregation's and DP's where the run turns them on (a section this code cannot parse counts)."""
    set_values = values.get("settings") or {}
    read = [DataSettings.section, ModelSettings.section]
    own = registry().get(values.get("method", ""))
    if own is not None and own.settings is not None:
        read.append(own.settings.section)
    for optional in (RobustSettings, SecAggSettings, DpSettings):
        try:
            on = optional.parse(set_values.get(optional.section, {})).enabled
        except (ValueError, TypeError):
            on = True
        if on:
            read.append(optional.section)
    return read


def _comparable(config: dict, then: dict[tuple[str, str], Any] | None = None) -> dict:
    """A cell's configuration as cells are compared (a changed grid, a twin): :func:`_fields`, and each settings
    section the run reads (:func:`_read_sections`) whole, a setting the configuration leaves unset at the default
    of the code that ran it (``then``: :func:`defaults_then` of a stored cell; none for a configuration this code
    runs), without the settings that have no effect beside the others (``Settings.inert``, e.g. ``ridge.lambda_rule``
    of one head). A section the run does not read is left out: a default changed there changed nothing for it."""
    values = _fields(config)
    set_values = values.get("settings") or {}
    settings: dict[str, Any] = {}
    for name in _read_sections(values):
        section = {**_setting_defaults()[name], **{k: v for (s, k), v in (then or {}).items() if s == name}}
        mine = set_values.get(name, {})
        if not isinstance(mine, dict):  # not an object of settings: compared as it is
            settings[name] = mine
            continue
        section |= mine
        with contextlib.suppress(ValueError, TypeError):  # a value this code refuses (or an unknown one): all kept
            for key in sections()[name].parse(section).inert():
                section.pop(key, None)
        settings[name] = section
    for name in set(set_values) - set(sections()):  # a section this code does not know: compared as it is
        settings[name] = set_values[name]
    return values | {"settings": settings}


def stored_split_invariant(config: dict) -> bool:
    """``common.methods.split_invariant`` of a stored configuration (a cell's ``config``): false for a method this
    checkout no longer has."""
    values = _fields(config)
    return values.get("method") in registry() and split_invariant(validate(RunConfig.from_dict(values)))


def _twin_key(config: dict, then: dict[tuple[str, str], Any] | None = None) -> str:
    """A configuration as lorm-bench finds a twin to reuse, one comparable string: :func:`_comparable`, without
    ``beta`` where the figures are the same at every beta (:func:`stored_split_invariant`: a frozen head's sums
    are the same under any split of its samples)."""
    return _key(_comparable(config, then), config)


def _key(values: dict, config: dict) -> str:
    """:func:`_twin_key` of ``config`` from its :func:`_comparable` ``values``."""
    if stored_split_invariant(config):
        values = {k: v for k, v in values.items() if k != "beta"}
    return json.dumps(values, sort_keys=True)


def stored_twin_key(metrics: dict) -> str:
    """:func:`_twin_key` of a stored cell (its metrics), read with the defaults of the code that ran it."""
    return _twin_key(metrics.get("config", {}), defaults_then(metrics))


def _config_changes(stored: dict, planned: RunConfig) -> list[str]:
    """The fields (``settings.SECTION.KEY`` for a setting) in which a stored cell's configuration (its metrics)
    differs from the one planned for it; none where the cell is the planned one's twin (another beta's run)."""
    planned_config, stored_config = json.loads(planned.to_json()), stored.get("config", {})
    want, have = _comparable(planned_config), _comparable(stored_config, defaults_then(stored))
    if _key(have, stored_config) == _key(want, planned_config):  # a twin's copy: its run's beta, the same figures
        return []
    changed = sorted(k for k in set(want) | set(have) if k != "settings" and want.get(k) != have.get(k))
    for section in sorted(set(want["settings"]) | set(have["settings"])):
        mine, theirs = want["settings"].get(section, {}), have["settings"].get(section, {})
        if not (isinstance(mine, dict) and isinstance(theirs, dict)):
            changed += [f"settings.{section}"] if mine != theirs else []
            continue
        changed += [f"settings.{section}.{k}" for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    return changed


def finished_runs(out: Path) -> list[tuple[str, dict]]:
    """(name, metrics) of every cell in the folder that ran (not one reused from a twin), to reuse for a twin
    (:func:`_twin_key`: an identical configuration, as joint's at every beta, or a frozen head's at another beta):
    this grid's, and any from an earlier call with other methods or betas."""
    done = [
        (str(path.parent.relative_to(out / "cells")), json.loads(path.read_text()))
        for path in sorted((out / "cells").glob("*/*/*/metrics.json"))
    ]
    return [(name, m) for name, m in done if "config" in m and "reused_from" not in m]
