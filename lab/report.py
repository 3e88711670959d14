"""The benchmark grid's report: ``results.md`` (the paper's layout, FAA per method and beta beside the paper's
value, then one row per (dataset, method, beta) with its cost and provenance) and ``results.csv``, from the rows
of ``lab/rows.py``, and the plots of ``lab/plots.py`` beside them (:func:`write_report`)."""

from __future__ import annotations

import csv
from dataclasses import asdict
from pathlib import Path

from lab.plots import plot_accuracy_curves, plot_faa
from lab.rows import Row, _duration, _groups, _order, failed_cells, load_cells, summarize


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
