"""Planning a benchmark grid: the method labels it takes (``NAME`` or ``NAME@VARIANT``), the method configuration
(``--method-config``: overrides per method, per beta and per preset), each cell's run configuration
(:func:`cell_config`) and the grid's cells (:func:`plan_grid`). ``lab/benchmark.py`` is the command line that
plans a grid here and runs it (``lab/runner.py``)."""

from __future__ import annotations

import json
import math
from typing import Any

from common.methods.checks import validate
from common.run.arguments import key_path, merged
from common.run.config import RunConfig
from common.run.presets import PRESETS
from lab.cells import Cell
from lab.rows import JOINT
from server.strategies import STRATEGIES

# Keys the grid itself sets in every cell; a method configuration may not.
GRID_KEYS = ("method", "beta", "seed", "run_id")


def known_methods() -> list[str]:
    return sorted(STRATEGIES) + [JOINT]


def method_of(label: str) -> str:
    """The method a grid label names: ``NAME``, or ``NAME@VARIANT`` (the same method with the overrides the
    method config gives under the whole label, e.g. ``lorm-vera@appendix``); ``ValueError`` if unknown."""
    name, _, variant = label.partition("@")
    if name not in known_methods() or ("@" in label and not variant):
        raise ValueError(f"unknown method {label!r}; known: {known_methods()} (a variant: NAME@VARIANT)")
    return name


def load_method_config(path: str | None) -> dict[str, dict[str, Any]]:
    """``{method: {key: value, "beta=<b>": {key: value}, "preset=<name>": {...}}}`` from a JSON file, checked.

    A ``preset=<name>`` object holds overrides of the same form (plain keys and ``beta=`` objects) that apply only to
    a grid run from that ``--preset``: a choice made on one protocol's held-out samples (LoRM's head γ at β 0.2 on
    the full data) without changing the cells of another protocol (the quick one, whose held-out samples chose
    otherwise)."""
    if not path:
        return {}
    with open(path) as f:
        values = json.load(f)
    if not isinstance(values, dict):
        raise ValueError(
            f"--method-config {path}: expected a JSON object {{method: {{key: value}}}}, got {type(values).__name__}"
        )
    for method, overrides in values.items():
        try:
            method_of(method)
        except ValueError as err:
            raise ValueError(f"--method-config {path}: {err}") from None
        if not isinstance(overrides, dict):
            raise ValueError(f"--method-config {path}: {method}: expected an object, got {overrides!r}")
        _check_overrides(overrides, f"--method-config {path}: {method}", path, presets=True)
    return values


def _check_overrides(overrides: dict[str, Any], where: str, path: str, presets: bool) -> None:
    for key, value in overrides.items():
        if key.startswith("preset="):
            name = key.partition("=")[2]
            if not presets:
                raise ValueError(f"{where}.{key}: a preset's overrides cannot hold another preset's")
            if name not in PRESETS:
                raise ValueError(f"{where}.{key}: unknown preset {name!r}; known: {sorted(PRESETS)}")
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key}: expected an object, got {value!r}")
            _check_overrides(value, f"{where}.{key}", path, presets=False)
            continue
        if key.startswith("beta="):
            _beta_of(key, path)
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key}: expected an object, got {value!r}")
        keys = value if key.startswith("beta=") else {key: value}
        fixed = sorted(set(keys) & set(GRID_KEYS))
        if fixed:
            raise ValueError(f"{where}: {fixed} are set by the grid, not per method")


def _beta_of(key: str, path: str) -> float:
    try:
        return float(key.partition("=")[2])
    except ValueError:
        raise ValueError(f"--method-config {path}: expected 'beta=<number>', got {key!r}") from None


def _applied(values: dict[str, Any], overrides: dict[str, Any], beta: float) -> dict[str, Any]:
    """``values`` < the plain overrides < those for ``beta`` (``preset=`` objects aside)."""
    # Objects (settings sections, legacy extra) merge key by key at any depth, never replace.
    values = merged(values, {k: v for k, v in overrides.items() if not k.startswith(("beta=", "preset="))})
    for key, per_beta in overrides.items():
        if key.startswith("beta=") and math.isclose(_beta_of(key, "method config"), beta):
            values = merged(values, per_beta)
    return values


def cell_config(
    base: RunConfig,
    method: str,
    beta: float,
    seed: int,
    method_config: dict[str, dict[str, Any]],
    preset_name: str = "",
) -> RunConfig:
    """Base < the method's overrides < its overrides for ``beta`` < its ``preset=<preset_name>`` overrides (plain,
    then for ``beta``) < the grid's (strategy, beta, seed)."""
    overrides = method_config.get(method, {})
    values = _applied(json.loads(base.to_json()), overrides, beta)
    values = _applied(values, overrides.get(f"preset={preset_name}", {}), beta)  # no "preset=" key loads
    run_id = f"{base.run_id}-{method.replace('@', '-')}-b{beta}-s{seed}"
    values.update(method=method_of(method), beta=beta, seed=seed, run_id=run_id)
    if method_of(method) == JOINT:
        # One client holds everything, one task has every class; beta then splits nothing, so
        # it is pinned and the joint cells of all betas share one configuration (a variant,
        # joint@VARIANT, is the same upper bound with its own overrides, e.g. a learning rate).
        values.update(method="lorm", num_clients=1, num_tasks=1, task_sizes=[], beta=1.0)
    return validate(RunConfig.from_dict(values))


def plan_grid(
    base: RunConfig,
    methods: list[str],
    betas: list[float],
    seeds: list[int],
    method_config: dict[str, dict[str, Any]],
    preset_name: str = "",
) -> list[Cell]:
    for label in methods:
        if "@" in label and label not in method_config:
            # a variant is its overrides: without them the label would run its plain method under another name
            variants = sorted(v for v in method_config if v.partition("@")[0] == method_of(label) and "@" in v)
            raise ValueError(
                f"--methods {label}: no such variant in --method-config (variants of {method_of(label)} there: "
                f"{', '.join(variants) or 'none'})"
            )
    return [
        Cell(m, b, s, cell_config(base, m, b, s, method_config, preset_name))
        for m in methods
        for b in betas
        for s in seeds
    ]


def overridden_sets(base: RunConfig, cells: list[Cell], sets: list[str]) -> list[str]:
    """One line per cell where the method config sets a ``--set`` key to another value (it takes
    precedence: ``--set`` is the grid's base, the method config each method's own), so that a
    command-line value the grid does not use is never silent."""
    values = json.loads(base.to_json())
    per_cell = [(cell, json.loads(cell.config.to_json())) for cell in cells if method_of(cell.method) != JOINT]
    lines = []
    for key in dict.fromkeys(item.partition("=")[0] for item in sets):
        path = key_path(key)
        if path[0] in GRID_KEYS:
            continue
        wanted = _at(values, path)
        for cell, cell_values in per_cell:
            got = _at(cell_values, path)
            if got != wanted:
                lines.append(
                    f"--set {key}={json.dumps(wanted)} is overridden by --method-config for {cell.method} at "
                    f"beta {cell.beta:g}, seed {cell.seed}: {key}={json.dumps(got)}"
                )
    return lines


def _at(values: Any, path: list[str]) -> Any:
    for part in path:
        values = values.get(part) if isinstance(values, dict) else None
    return values
