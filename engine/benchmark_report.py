"""The benchmark grid's tables and plots: ``results.md``, ``results.csv``, ``faa.png``,
``accuracy_<beta>.png``, built from the finished cells' ``metrics.json`` beside the paper's FAA.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported on first use (see _pyplot)
    from matplotlib.figure import Figure

JOINT = "joint"


def _by_beta(dataset: str, betas: tuple[float, ...], faa: dict[str, tuple[float, ...]]) -> dict:
    return {(dataset, method, beta): value for method, values in faa.items() for beta, value in zip(betas, values)}


# The paper's FAA (%), keyed by (config.dataset, method, beta); beta None: every beta (docs/METHOD.md §7).
PAPER_FAA: dict[tuple[str, str, float | None], float] = {
    ("clinc150", JOINT, None): 95.53,
    **_by_beta(
        "clinc150",
        (1.0, 0.5, 0.2),
        {
            "lorm": (84.78, 82.58, 77.67),
            "regmean": (74.16, 74.80, 70.78),
            "ties": (58.84, 54.13, 47.71),
            "ccvr": (39.18, 38.13, 30.36),
        },
    ),
    **_by_beta("cifar100", (0.5, 0.1, 0.05), {"lorm": (86.95, 81.75, 82.76)}),
    # Tables 1-2 (Table 1 of the paper; "CIFAR-100 ... CUB-200"): the competitors this project has.
    **_by_beta(
        "cifar100",
        (0.5, 0.1, 0.05),
        {
            "ewc": (78.46, 72.42, 64.51),
            "lwf": (62.87, 55.56, 47.09),
            "fisheravg": (76.10, 74.43, 65.31),
            "regmean": (59.80, 45.88, 39.08),
            "l2p": (83.88, 61.54, 55.00),
            "coda-p": (82.25, 61.82, 46.74),
            "ccvr": (79.95, 75.14, 65.3),
            "fedproto": (75.79, 70.02, 60.55),
            "target": (74.72, 72.32, 62.6),
            "pilora": (76.48, 75.81, 74.8),
        },
    ),
    **_by_beta(
        "imagenet-r",
        (0.5, 0.1, 0.05),
        {
            "ewc": (58.93, 48.15, 43.68),
            "lwf": (54.03, 41.02, 46.07),
            "fisheravg": (58.68, 50.82, 47.33),
            "regmean": (61.18, 57.00, 55.80),
            "l2p": (42.08, 23.85, 16.98),
            "coda-p": (61.18, 36.73, 25.82),
            "ccvr": (70.0, 62.6, 60.38),
            "fedproto": (58.52, 47.3, 52.93),
            "target": (54.65, 45.83, 41.32),
            "pilora": (53.67, 51.62, 49.37),
        },
    ),
    **_by_beta(
        "imagenet-a",
        (1.0, 0.5, 0.2),
        {
            "ewc": (10.86, 10.07, 8.89),
            "lwf": (8.89, 8.89, 7.90),
            "fisheravg": (11.59, 11.06, 10.14),
            "regmean": (8.56, 6.22, 4.34),
            "l2p": (20.14, 17.31, 16.85),
            "coda-p": (18.30, 14.48, 7.31),
            "ccvr": (39.5, 36.27, 35.94),
            "fedproto": (9.87, 9.22, 10.01),
            "target": (10.27, 11.39, 10.73),
            "pilora": (19.62, 18.7, 20.01),
        },
    ),
    **_by_beta(
        "eurosat",
        (1.0, 0.5, 0.2),
        {
            "ewc": (64.12, 59.30, 56.52),
            "lwf": (31.91, 21.26, 31.42),
            "fisheravg": (58.84, 59.94, 55.86),
            "regmean": (48.74, 51.73, 45.27),
            "l2p": (40.63, 51.78, 45.46),
            "coda-p": (73.38, 69.42, 66.69),
            "ccvr": (64.44, 57.93, 62.69),
            "fedproto": (58.79, 62.85, 64.17),
            "target": (52.74, 52.74, 45.11),
            "pilora": (48.35, 32.89, 31.22),
        },
    ),
    **_by_beta(
        "cars196",
        (1.0, 0.5, 0.2),
        {
            "ewc": (19.55, 18.02, 18.29),
            "lwf": (20.84, 22.72, 31.76),
            "fisheravg": (26.03, 24.60, 21.58),
            "regmean": (21.83, 20.36, 15.92),
            "l2p": (35.49, 31.00, 20.01),
            "coda-p": (28.04, 20.83, 14.53),
            "ccvr": (38.99, 37.81, 35.31),
            "fedproto": (26.08, 24.55, 22.75),
            "target": (28.65, 27.2, 26.13),
            "pilora": (37.57, 37.92, 36.95),
        },
    ),
    **_by_beta(
        "cub200",
        (1.0, 0.5, 0.2),
        {
            "ewc": (31.46, 29.60, 27.89),
            "lwf": (25.25, 21.11, 18.54),
            "fisheravg": (30.45, 28.39, 25.06),
            "regmean": (35.57, 32.84, 32.83),
            "l2p": (56.23, 47.31, 38.16),
            "coda-p": (42.53, 37.71, 29.19),
            "ccvr": (62.67, 59.48, 56.33),
            "fedproto": (30.22, 28.27, 26.01),
            "target": (39.3, 38.4, 34.79),
            "pilora": (61.11, 60.68, 60.39),
        },
    ),
    # The ablation table: ImageNet-R at beta 0.5, EuroSAT at beta 1.0.
    **_by_beta(
        "imagenet-r",
        (0.5,),
        {
            "fedavg": (57.65,),
            "fedavg-lora": (57.00,),
            "regmean": (61.18,),
            "lorm-avg-tasks": (75.08,),
            "lorm": (75.62,),
        },
    ),
    **_by_beta(
        "eurosat",
        (1.0,),
        {
            "fedavg": (41.04,),
            "fedavg-lora": (53.14,),
            "regmean": (48.74,),
            "lorm-avg-tasks": (71.40,),
            "lorm": (77.37,),
        },
    ),
}
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


def paper_faa(dataset: str, method: str, beta: float) -> float | None:
    for key in ((dataset, method, round(beta, 6)), (dataset, method, None)):
        if key in PAPER_FAA:
            return PAPER_FAA[key]
    return None


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


# ---------------------------------------------------------------------- the tables and plots


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


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0]) if rows else Row.__dataclass_fields__))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in asdict(row).items()})


def _distinct(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _machine_line(machine: dict) -> str:
    return (
        f"{machine['system']}, {machine['cpu']}, {machine['cores']} CPU cores ({machine['usable_cores']} usable), "
        f"GPU: {machine['gpu']}; Python {machine['python']}, torch {machine['torch']}"
    )


def _faa_text(row: Row) -> str:
    return f"{row.faa_mean:.2f}" + (f" ± {row.faa_std:.2f}" if row.faa_std is not None else "")


def _pivot(rows: list[Row]) -> list[str]:
    """The paper's layout: FAA per method (rows) and beta (columns), the paper's value in brackets."""
    lines = []
    for dataset in _distinct([r.dataset for r in rows]):
        mine = [r for r in rows if r.dataset == dataset]
        betas = sorted({r.beta for r in mine}, reverse=True)
        lines += [
            f"FAA (%) on {dataset}, mean ± std over seeds [paper]:",
            "",
            "| method | " + " | ".join(f"beta={b}" for b in betas) + " |",
            "|---|" + "---|" * len(betas),
        ]
        for method in sorted({r.method for r in mine}, key=_order):
            cells = []
            for b in betas:
                row = next((r for r in mine if r.method == method and r.beta == b), None)
                text = "-" if row is None else _faa_text(row)
                if row is not None and row.paper_faa is not None:
                    text += f" [{row.paper_faa:.2f}]"
                cells.append(text)
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def markdown(rows: list[Row], cells: list[dict], failed: list[tuple[str, str]], command: str, machine: dict) -> str:
    datasets = ", ".join(_distinct([r.dataset for r in rows])) or "-"
    commands = _distinct([c["command"] for c in cells if "command" in c])
    machines = _distinct([_machine_line(c["machine"]) for c in cells if "machine" in c])
    modes = ", ".join(_distinct([c.get("mode", "?") for c in cells]))
    lines = [f"# Benchmark: {datasets}", ""]
    lines += [f"- Grid command: `{c}`" for c in commands]
    if command not in commands:
        lines.append(f"- Report written by: `{command}`")
    # Cells from several machines: number the machines and name each row's, so that a wall time is
    # read against the machine that spent it.
    numbered = len(machines) > 1
    if numbered:
        lines += [f"- Machine {i}: {m}" for i, m in enumerate(machines, 1)]
    else:
        lines += [f"- Machine: {m}" for m in machines or [_machine_line(machine)]]
    lines += [f"- Mode: {modes}. Finished cells: {len(cells)}; failed: {len(failed)}.", ""]
    lines += _pivot(rows)
    lines += [
        "| dataset | method | beta | FAA (%) | paper FAA (%) | FAA weighted (%) | forgetting (%) "
        "| sent per client (MB) | wall time | seeds |" + (" machine |" if numbered else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if numbered else ""),
    ]
    groups = _groups(cells)
    for r in rows:
        faa = _faa_text(r)
        paper = "-" if r.paper_faa is None else f"{r.paper_faa:.2f}"
        line = (
            f"| {r.dataset} | {r.method} | {r.beta} | {faa} | {paper} | {r.faa_weighted_mean:.2f} "
            f"| {r.forgetting_mean:.2f} | {r.bytes_per_client_mean / 1e6:.3f} "
            f"| {_duration(r.wall_seconds_mean)} | {r.seeds} |"
        )
        if numbered:
            group = groups[(r.dataset, r.method, r.beta)]
            mine = _distinct([_machine_line(c["machine"]) for c in group if "machine" in c])
            line += " " + (", ".join(str(machines.index(m) + 1) for m in mine) or "-") + " |"
        lines.append(line)
    lines += [
        "",
        "FAA: the paper's final average accuracy, the mean over tasks of the accuracy on each after the "
        "last task; mean ± sample standard deviation over seeds. FAA weighted: accuracy over all test samples "
        "after the last task (the reference code's figure). Forgetting: mean over earlier tasks of the best "
        "accuracy minus the final one. Sent per client: tensor payload bytes one client uploads over the "
        "whole run (1 MB = 10^6 bytes). Wall time: mean per run (where the cells come from several machines, "
        "the column machine numbers the ones its cells ran on). `joint`: LoRM with one client holding all "
        "data and one task with all classes (the upper bound).",
    ]
    if failed:
        lines += ["", "Failed cells (no result; rerun the grid to retry them):", ""]
        lines += [f"- `{name}`: {error}" for name, error in failed]
    return "\n".join(lines) + "\n"


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


def write_report(out: Path, command: str, machine: dict) -> list[Row]:
    """``results.md``, ``results.csv``, ``faa.png`` and ``accuracy_<beta>.png`` from every finished cell."""
    cells = load_cells(out)
    rows = summarize(cells)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "results.csv")
    (out / "results.md").write_text(markdown(rows, cells, failed_cells(out), command, machine))
    if rows:
        plot_faa(rows, out / "faa.png")
        for beta in sorted({r.beta for r in rows}, reverse=True):
            plot_accuracy_curves(cells, beta, out / f"accuracy_{beta}.png")
    return rows
