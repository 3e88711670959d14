"""The benchmark grid's finished cells read back as rows: one per (dataset, method, beta) over its seeds, in the
tables' method order, beside the paper's FAA (``lab/paper.py``), and the few formats every table and log line
shares (a percentage, a duration, a cell's running time). ``lab/report.py`` writes them as ``results.md`` and
``results.csv``, ``lab/plots.py`` draws them."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from lab.paper import paper_faa

JOINT = "joint"

# Row order of the tables: the upper bound, the baselines, then LoRM's variants.
METHOD_ORDER = (
    JOINT,
    "fedavg",
    "fedavg-lora",
    "fisheravg",
    "regmean",
    "ties",
    "ccvr",
    "fedproto",
    "target",
    "pilora",
    "ewc",
    "lwf",
    "l2p",
    "coda-p",
    "lorm-b-only",
    "lorm-avg-tasks",
    "lorm",
)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def cell_seconds(cell: dict) -> float:
    """A cell's running time: its wall time, or, for an in-process run that went on from a committed step
    (``resumes`` in its summary), the engine's computing time summed over its parts (``seconds``): the
    wall time of the last part alone would understate it."""
    if cell.get("resumes") and cell.get("mode") == "inprocess" and "seconds" in cell:
        return float(cell["seconds"])
    return float(cell["wall_seconds"])


@dataclass
class Row:
    """One (dataset, method, beta) over its finished seeds; means and sample std over seeds."""

    dataset: str
    method: str
    beta: float
    seeds: int
    faa_mean: float
    faa_std: float | None  # sample std (n - 1); None with one seed
    faa_weighted_mean: float
    forgetting_mean: float
    bytes_per_client_mean: float  # tensor payload one client sent over the whole run
    wall_seconds_mean: float  # of cell_seconds: a resumed in-process cell counts every part
    paper_faa: float | None


def load_cells(out: Path) -> list[dict]:
    """Every finished cell's metrics, in path order."""
    return [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*/beta*/seed*/metrics.json"))]


def failed_cells(out: Path) -> list[tuple[str, str]]:
    """(cell, last line of its error) for cells with an error and no result."""
    failed = []
    for path in sorted((out / "cells").glob("*/beta*/seed*/error.txt")):
        if not (path.parent / "metrics.json").exists():
            lines = path.read_text().strip().splitlines() or [""]
            failed.append((str(path.parent.relative_to(out / "cells")), lines[-1]))
    return failed


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _order(method: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def _groups(cells: list[dict]) -> dict[tuple[str, str, float], list[dict]]:
    groups: dict[tuple[str, str, float], list[dict]] = {}
    for cell in cells:
        groups.setdefault((cell["config"]["dataset"], cell["method"], float(cell["beta"])), []).append(cell)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][2], _order(kv[0][1]))))


def summarize(cells: list[dict]) -> list[Row]:
    rows = []
    for (dataset, method, beta), group in _groups(cells).items():
        faa = [_number(c["faa"]) for c in group]
        rows.append(
            Row(
                dataset,
                method,
                beta,
                len(group),
                _mean(faa),
                statistics.stdev(faa) if len(faa) > 1 else None,
                _mean([_number(c["faa_weighted"]) for c in group]),
                _mean([_number(c["forgetting"]) for c in group]),
                _mean([float(c["bytes_per_client"]) for c in group]),
                _mean([cell_seconds(c) for c in group]),
                paper_faa(dataset, method, beta),
            )
        )
    return rows


def mean_seen_accuracy(cells: list[dict]) -> list[float]:
    """After each task: accuracy averaged over the tasks seen so far, then over the cells."""
    curves = [[_mean([_number(a) for a in row]) for row in c["accuracy"]] for c in cells]
    return [_mean([curve[t] for curve in curves]) for t in range(min(len(curve) for curve in curves))]
