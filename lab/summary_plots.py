"""RESULTS' two plots, drawn beside the full-data cells: ``summary_faa.png`` (FAA per method and β with the seeds'
std) and ``summary_bytes.png`` (MB per client against FAA at β 0.5, the communication-accuracy
:func:`frontier`), in the summary's row order (``lab/summary_table.py``); matplotlib as the grid's plots load it
(``lab/plots.py``)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from lab.plots import _pyplot, _save
from lab.summary_table import BETAS, UPPER_BOUND, by_method

BETA_COLOURS = {1.0: "tab:blue", 0.5: "tab:orange", 0.2: "tab:green"}


def _mean_std(group: list[dict]) -> tuple[float, float]:
    values = [float(c["faa"]) for c in group]
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def plot_faa(cells: list[dict], path: Path) -> None:
    """One line per method, FAA at each β it ran as a dot with the seeds' std as error bar."""
    plt = _pyplot()
    rows = by_method(cells)
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.2), dpi=120)
    for k, beta in enumerate(BETAS):
        ys, xs, errs = [], [], []
        for i, row in enumerate(rows.values()):
            if beta in row:
                mean, std = _mean_std(row[beta])
                ys.append(i + (k - 1) * 0.22)
                xs.append(mean)
                errs.append(std)
        ax.errorbar(xs, ys, xerr=errs, fmt="o", ms=4, capsize=3, color=BETA_COLOURS[beta], label=f"β {beta}")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(rows), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("FAA (%), mean ± std over seeds")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("CLINC150, full data: FAA per method and β (no dot: not measured)", fontsize=9)
    _save(fig, plt, path)


def frontier(points: dict[str, tuple[float, float]]) -> list[str]:
    """The labels no other point beats on both axes (fewer MB and higher FAA), by MB; the upper bound left out."""
    best, out = -math.inf, []
    for label, (_mb, faa_) in sorted(points.items(), key=lambda kv: (kv[1][0], -kv[1][1])):
        if faa_ > best and label.split("@", 1)[0] != UPPER_BOUND:
            best = faa_
            out.append(label)
    return out


def plot_bytes(cells: list[dict], path: Path, beta: float = 0.5) -> None:
    """MB one client sent over the run (log scale) against FAA at ``beta``: the communication-accuracy frontier
    as a line; a point's label is left off where an earlier label sits close by."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    points, stds = {}, {}
    for label, row in by_method(cells).items():
        if beta in row:
            mean, stds[label] = _mean_std(row[beta])
            points[label] = (statistics.mean(float(c["bytes_per_client"]) / 1e6 for c in row[beta]), mean)
    edge = frontier(points)
    ax.plot([points[k][0] for k in edge], [points[k][1] for k in edge], "-", color="tab:red", lw=1, label="frontier")
    labelled: list[tuple[float, float]] = []
    for label in edge + sorted(set(points) - set(edge), key=lambda k: -points[k][1]):
        mb, mean = points[label]
        on_edge = label in edge
        ax.errorbar(
            [mb], [mean], yerr=[stds[label]], fmt="o", ms=4, capsize=3, color="tab:red" if on_edge else "tab:blue"
        )
        spot = (math.log10(mb), mean / 4)
        if on_edge or all(math.dist(spot, other) > 0.2 for other in labelled):
            ax.annotate(label, (mb, mean), fontsize=6, xytext=(3, 2), textcoords="offset points")
            labelled.append(spot)
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per client over the run (log scale)")
    ax.set_ylabel(f"FAA (%) at β {beta}, mean ± std over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(
        f"CLINC150, full data, β {beta}: bytes against FAA (crowded labels left off: see the table)", fontsize=9
    )
    _save(fig, plt, path)
