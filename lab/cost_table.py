"""The cost table of ``docs/RESULTS.md``: what every in-process cell of the full data cost (``clinc150-full`` and
its side sets: reruns, the GPU check, diagnostics): its time, peak memory, host and threads, and which times
compare. Its hosts are lettered as the summary's (``lab/summary_table.py``); ``lab/results_summary.py`` writes
it into ``docs/RESULTS.md``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lab.report import _machine_line
from lab.rows import cell_seconds, load_cells
from lab.summary_table import FULL, _listed, by_method, hosts

COSTS_START = (
    "<!-- costs: written by `python -m lab.results_summary` from the cells under docs/results/clinc150-full* -->"
)
COSTS_END = "<!-- end of costs -->"


def cost_sets(results: Path = FULL.parent) -> dict[str, list[dict]]:
    """The full-data cells per set, named by their directory under ``docs/results``: ``clinc150-full`` (the
    summary's) first, then the side sets (``clinc150-full-rerun``, ``clinc150-full-diag/batch32``, ...)."""
    full = results / FULL.name
    sides = sorted(p.parent for p in results.glob(f"{FULL.name}*/**/cells") if p.parent != full)
    return {str(d.relative_to(results)): load_cells(d) for d in (full, *sides)}


def _in_order(cells: list[dict]) -> list[dict]:
    """``cells`` in the summary's row order, then by β as its columns (highest first), then by seed."""
    return [
        cell
        for row in by_method(cells).values()
        for beta in sorted(row, reverse=True)
        for cell in sorted(row[beta], key=lambda c: int(c["seed"]))
    ]


def _peak_gb(cell: dict) -> str:
    """The cell's peak resident memory in GB; a resumed cell's is its last part's."""
    rss = cell.get("peak_rss_bytes")
    if not rss:
        return "not logged"
    return f"{float(rss) / 1e9:.2f}" + (" (last part)" if cell.get("resumes") else "")


def _compares(cell: dict, host: str) -> str:
    """The group whose times this cell's time compares with: one host, one number of threads; none when
    resumed (its parts' times are summed, each part beside whatever ran then)."""
    if cell.get("resumes"):
        return f"no: {int(cell['resumes']) + 1} parts summed"
    threads = int(cell["config"]["threads"])
    return f"within {host}, {threads} thread{'s' if threads > 1 else ''}"


def _logged_by(logged: int, ran: int) -> str:
    """Which cells logged their peak memory: all of them, or how many (the others ran before the log began)."""
    if logged == ran:
        return f"every one of the {ran} cells that ran"
    return f"{logged} of the {ran} cells that ran (those run before the log began have none)"


def costs(sets: dict[str, list[dict]], order: Sequence[str] = ()) -> str:
    """The cost table of every in-process cell of ``sets`` (the summary's set first), between its markers:
    host letters as the summary's (:func:`hosts`), hosts it does not name listed under the table."""
    every = [cell for cells in sets.values() for cell in cells]
    main = next(iter(sets), None)
    summary = hosts(sets[main], order) if main is not None else {}
    letter = hosts(every, [*order, *(m for m in summary if m not in order)])  # the summary's letters first
    ran = [cell for cell in every if not cell.get("reused_from")]  # a twin's copy is no run of its own
    logged = sum(1 for cell in ran if cell.get("peak_rss_bytes"))
    gpus = sorted({letter[_machine_line(c["machine"])] for c in every if c["machine"]["gpu"] != "none"})
    one = len(gpus) == 1
    on_gpu = f" (host{'' if one else 's'} {_listed(gpus)} {'has' if one else 'have'} a GPU)" if gpus else ""
    lines = [
        COSTS_START,
        "",
        "Which times compare. A cell's time is its wall time (a resumed cell's: the engine's computing time "
        "summed over its parts); its peak memory is the most the one process held at once (resident set, "
        f"coordinator and clients together, GPU memory not counted), logged by {_logged_by(logged, len(ran))}. "
        "What else ran on its host "
        f"meanwhile is recorded by {sum(1 for cell in ran if cell.get('beside'))} of them (`lorm-bench --beside`); "
        "the sections below say many others shared their host with other cells, sweeps or test runs: every "
        "time is an upper bound of the cell's own. Two times compare only within one "
        "group of the last column (the same host and the same number of threads), and then only as upper "
        f"bounds; times of different hosts never compare{on_gpu}, nor does a resumed cell's. "
        "Peak memory is the process's own (what ran beside it adds nothing to it), so it compares across the hosts "
        "without a GPU.",
        "",
        "| cell | β | seed | time (min) | peak memory (GB) | host | threads | ran beside it | time compares |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, cells in sets.items():
        where = "" if name == main else f" ({name})"
        for cell in _in_order(cells):
            host = letter[_machine_line(cell["machine"])]
            if cell.get("reused_from"):  # a twin's figures, listed once under the twin
                minutes, peak, beside = "—", "—", f"the run of `{cell['reused_from']}`, reused"
                compares = "no: not run again"
            else:
                minutes, peak, compares = f"{cell_seconds(cell) / 60:.1f}", _peak_gb(cell), _compares(cell, host)
                beside = cell.get("beside") or "not recorded"
            lines.append(
                f"| `{cell['method']}`{where} | {float(cell['beta'])} | {cell['seed']} | {minutes} | {peak} | {host} "
                f"| {cell['config']['threads']} | {beside} | {compares} |"
            )
    named = list(summary.values())
    if named:
        lines += ["", f"Host{'s' if len(named) > 1 else ''} {_listed(named)}: as in the summary."]
    lines += [f"- Host {letter[m]}: {m}" for m in letter if m not in summary]
    lines += ["", COSTS_END]
    return "\n".join(lines)
