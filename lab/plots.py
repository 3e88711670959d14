"""The benchmark grid's plots: ``faa.png`` (FAA per beta and method beside the paper's) and
``accuracy_<beta>.png`` (the mean accuracy over the tasks seen after each task), drawn from the rows and cells of
``lab/rows.py``; matplotlib is imported on first use (:func:`_pyplot`), which RESULTS' plots
(``lab/summary_plots.py``) share with :func:`_save`."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from lab.rows import Row, _groups, _order, mean_seen_accuracy

if TYPE_CHECKING:  # matplotlib is imported on first use (see _pyplot)
    from matplotlib.figure import Figure


def _pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend, imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_faa(rows: list[Row], path: Path) -> None:
    """Grouped bars: FAA per beta (groups) and method (bars), std error bars, the paper's FAA as markers."""
    plt = _pyplot()
    betas = sorted({r.beta for r in rows}, reverse=True)
    methods = sorted({r.method for r in rows}, key=_order)
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(betas) * len(methods) ** 0.5 + 3), 4), dpi=120)
    paper_labelled = False
    for k, method in enumerate(methods):
        mine = {r.beta: r for r in rows if r.method == method}
        xs = [i + (k - (len(methods) - 1) / 2) * width for i, b in enumerate(betas) if b in mine]
        ours = [mine[b] for b in betas if b in mine]
        ax.bar(xs, [r.faa_mean for r in ours], width, yerr=[r.faa_std or 0.0 for r in ours], capsize=3, label=method)
        known = [(x, r.paper_faa) for x, r in zip(xs, ours) if r.paper_faa is not None]
        if known:
            ax.scatter(
                [x for x, _ in known],
                [p for _, p in known],
                marker="D",
                color="red",
                edgecolors="black",
                zorder=3,
                s=36,
                label=None if paper_labelled else "paper",
            )
            paper_labelled = True
    ax.set_xticks(range(len(betas)))
    ax.set_xticklabels([f"beta={b}" for b in betas])
    ax.set_ylabel("FAA (%)")
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("FAA per method and beta (mean ± std over seeds)")
    _save(fig, plt, path)


def plot_accuracy_curves(cells: list[dict], beta: float, path: Path) -> None:
    """Mean-over-seen-tasks accuracy after each task, one line per method; one-task runs
    (``joint``) as a horizontal line. The legend stands beside the axes, as tall as the methods need, and
    past ten methods the lines change style as well as colour, so that each stays told apart."""
    plt = _pyplot()
    groups = {key: group for key, group in _groups(cells).items() if key[2] == beta}
    fig, ax = plt.subplots(figsize=(9, max(4.0, 0.17 * len(groups) + 1.0)), dpi=120)
    several = len({key[0] for key in groups}) > 1
    tasks = max((len(c["accuracy"]) for group in groups.values() for c in group), default=1)
    styles, markers = ("-", "--", ":", "-."), ("o", "s", "^", "D")
    lowest = 100.0
    for k, ((dataset, method, _), group) in enumerate(groups.items()):
        curve = mean_seen_accuracy(group)
        lowest = min([lowest, *curve])
        label = f"{dataset}/{method}" if several else method
        if len(curve) == 1 and tasks > 1:
            ax.axhline(curve[0], linestyle="--", color="gray", label=f"{label} (all classes at once)")
        else:
            style = {"linestyle": styles[k // 10 % 4], "marker": markers[k // 10 % 4], "color": f"C{k % 10}"}
            ax.plot(range(len(curve)), curve, ms=4, lw=1.2, label=label, **style)
    ax.set_xlabel("after training task")
    ax.set_ylabel("mean accuracy over seen tasks (%)")
    ax.set_xticks(range(tasks))
    ax.set_ylim(max(0.0, 10 * (lowest // 10) - 5), 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.set_title(f"beta={beta}: accuracy across tasks (mean over seeds)")
    _save(fig, plt, path)


def _save(fig: Figure, plt: ModuleType, path: Path) -> None:
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
