"""The summary table that opens ``docs/RESULTS.md``, and the figures of README's "which method to use"
table, built from the committed full-data cells (``docs/results/clinc150-full/cells``).

One row per method (a bench label such as ``ridge@3layers``) and one FAA column per β (1.0, 0.5, 0.2):
the mean ± sample std over the cell's seeds, "—" where no cell was run. Beside them the seeds per β,
the megabytes one client sent over the run, the most memory an in-process cell held (where it was
logged), and the provenance: the host each β ran on and the commits of the cells.

A second table gives what every in-process cell of the full data cost (``clinc150-full`` and its side sets:
reruns, the GPU check, diagnostics): its time, peak memory, host and threads, and which times compare.

``python -m engine.results_summary`` rewrites both tables between their markers in ``docs/RESULTS.md`` and
draws its two plots beside the cells (``summary_faa.png``: FAA per method and β with the seeds' std;
``summary_bytes.png``: MB per client against FAA at β 0.5); ``--check`` exits 1 when a committed table
differs from the cells (tests/test_docs.py runs the same comparison). Hosts are lettered by
``docs/results/hosts.json`` (the machines in letter order), to which a run of this module appends a new host, so
that the letters the prose quotes stay put.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.benchmark_report import METHOD_ORDER, _machine_line, _pyplot, _save, cell_seconds, load_cells

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "docs" / "results" / "clinc150-full"
RESULTS = ROOT / "docs" / "RESULTS.md"
BETAS = (1.0, 0.5, 0.2)
START = "<!-- summary: written by `python -m engine.results_summary` from docs/results/clinc150-full/cells -->"
END = "<!-- end of summary -->"
COSTS_START = (
    "<!-- costs: written by `python -m engine.results_summary` from the cells under docs/results/clinc150-full* -->"
)
COSTS_END = "<!-- end of costs -->"
HOSTS = "hosts.json"  # the machines in letter order, beside the cells' folders
MISSING = "—"
# Row order: the upper bound, the trained competitors, LoRM's family, then the closed-form heads.
ORDER = (*METHOD_ORDER, "ncm", "ridge", "lorm-ridge", "lorm-ncm", "lorm-ridge-first")
# Not a federated method (one client holds all data): shown, never counted as a column's best.
UPPER_BOUND = "joint"

Cells = dict[float, list[dict]]  # beta -> the finished seeds' metrics


def by_method(cells: list[dict]) -> dict[str, Cells]:
    """The cells per bench label and beta, in the table's row order."""
    table: dict[str, Cells] = {}
    for cell in cells:
        table.setdefault(cell["method"], {}).setdefault(float(cell["beta"]), []).append(cell)

    def order(label: str) -> tuple[int, str]:
        base = label.split("@", 1)[0]
        return (ORDER.index(base) if base in ORDER else len(ORDER), label)

    return {label: table[label] for label in sorted(table, key=order)}


def faa(group: list[dict]) -> str:
    """``83.67 ± 0.60`` over several seeds, ``87.49`` over one, "—" over none."""
    if not group:
        return MISSING
    values = [float(c["faa"]) for c in group]
    text = f"{statistics.mean(values):.2f}"
    return text + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")


def megabytes(row: Cells) -> str:
    """MB one client sent over the run; a range where the betas' partitions differ."""
    values = sorted({round(float(c["bytes_per_client"]) / 1e6, 1) for group in row.values() for c in group})
    return f"{values[0]:,.1f}" + (f"–{values[-1]:,.1f}" if len(values) > 1 else "")


def peak_memory(row: Cells) -> str:
    """The most memory (GB) the row's cells held on hosts without a GPU (a GPU host's resident set holds its CUDA
    runtime too, so the two do not compare), or, where none logged it there, on GPU hosts, marked; and how many of
    the row's cells the figure covers when not all."""
    cells = [c for group in row.values() for c in group]
    logged = [c for c in cells if c.get("peak_rss_bytes")]
    if not logged:
        return MISSING
    cpu = [c for c in logged if c["machine"]["gpu"] == "none"]
    counted = cpu or logged
    text = f"{max(float(c['peak_rss_bytes']) for c in counted) / 1e9:.1f}"
    notes = [] if len(counted) == len(cells) else [f"{len(counted)} of {len(cells)} cells"]
    notes += [] if cpu else ["GPU host"]
    return f"{text} ({'; '.join(notes)})" if notes else text


def commits(row: Cells) -> str:
    """The distinct commits of the row's cells (7 hex digits); cells from before commits were recorded
    count as "unrecorded", and a tree with changes is marked."""
    names = []
    for beta in BETAS:
        for cell in row.get(beta, []):
            code = cell.get("code")
            name = "unrecorded" if code is None else code["commit"][:7] + (" (changed)" if code["changed"] else "")
            names.append(name)
    return ", ".join(f"`{n}`" if n != "unrecorded" else n for n in dict.fromkeys(names))


def hosts(cells: list[dict], order: Sequence[str] = ()) -> dict[str, str]:
    """The letter of every machine the cells name (host A, B, C, ...): the machines of ``order`` (the committed
    ``docs/results/hosts.json``) keep their letters for good, whether or not these cells name them; a machine it
    lacks comes after them, GPUs first, then by its description. In letter order."""
    machines = {_machine_line(c["machine"]): c["machine"]["gpu"] == "none" for c in cells}
    new = sorted((m for m in machines if m not in order), key=lambda line: (machines[line], line))
    letter = {m: chr(ord("A") + i) for i, m in enumerate([*order, *new])}
    return {m: letter[m] for m in sorted(machines, key=letter.__getitem__)}


def host_order(results: Path = FULL.parent) -> list[str]:
    """The committed machines in letter order (``hosts.json`` beside the cells' folders; none if absent)."""
    path = results / HOSTS
    return list(json.loads(path.read_text())) if path.exists() else []


def _host_letters(group: list[dict], letter: dict[str, str]) -> str:
    if not group:
        return MISSING
    return "+".join(dict.fromkeys(letter[_machine_line(c["machine"])] for c in group))


def _best(values: dict[str, str], highest: bool) -> set[str]:
    """The labels whose figure is the column's best (several where they tie), the upper bound left out."""
    numbers = {
        label: float(text.split(" ")[0].split("–")[0].replace(",", ""))
        for label, text in values.items()
        if text != MISSING and label.split("@", 1)[0] != UPPER_BOUND
    }
    if not numbers:
        return set()
    best = max(numbers.values()) if highest else min(numbers.values())
    return {label for label, value in numbers.items() if value == best}


def _cpu_only(row: Cells) -> bool:
    return all(c["machine"]["gpu"] == "none" for group in row.values() for c in group)


def _bold(text: str, bold: bool) -> str:
    return f"**{text}**" if bold else text


def figures(row: Cells) -> list[str]:
    """The figure columns README's table quotes: FAA at β 1.0 / 0.5 / 0.2, MB sent per client, peak GB."""
    return [" / ".join(faa(row.get(b, [])) for b in BETAS), megabytes(row), peak_memory(row)]


def summary(cells: list[dict], order: Sequence[str] = ()) -> str:
    """The table, its key and the hosts (lettered as :func:`hosts` says), between the markers."""
    rows = by_method(cells)
    machines = hosts(cells, order)
    columns = {f"faa{b}": {label: faa(row.get(b, [])) for label, row in rows.items()} for b in BETAS}
    columns["mb"] = {label: megabytes(row) for label, row in rows.items()}
    columns["gb"] = {label: peak_memory(row) for label, row in rows.items()}
    # Memory is compared only where every cell logged it on a host without a GPU (a GPU's memory is not in it).
    columns["gb"] = {
        label: text for label, text in columns["gb"].items() if "cells" not in text and _cpu_only(rows[label])
    }
    best = {name: _best(values, highest=name.startswith("faa")) for name, values in columns.items()}
    columns["gb"] = {label: peak_memory(row) for label, row in rows.items()}
    lines = [
        START,
        "",
        "| method | FAA β 1.0 | FAA β 0.5 | FAA β 0.2 | seeds (β 1.0 / 0.5 / 0.2) | MB sent per client "
        "| peak memory (GB) | host (β 1.0 / 0.5 / 0.2) | commits |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, row in rows.items():
        cells_ = [_bold(columns[name][label], label in best[name]) for name in ("faa1.0", "faa0.5", "faa0.2")]
        seeds = " / ".join(str(len(row[b])) if b in row else MISSING for b in BETAS)
        where = " / ".join(_host_letters(row.get(b, []), machines) for b in BETAS)
        mb = _bold(columns["mb"][label], label in best["mb"])
        gb = _bold(columns["gb"][label], label in best["gb"])
        lines.append(f"| `{label}` | {' | '.join(cells_)} | {seeds} | {mb} | {gb} | {where} | {commits(row)} |")
    lines += [
        "",
        "CLINC150, full training set (15,000) and test set (4,500), 10 clients, 5 tasks of 30 intents, "
        "all-MiniLM-L6-v2 unless the label names `mpnet`. FAA: the mean over tasks of each task's accuracy "
        "after the last, in %, mean ± sample std where several seeds ran. "
        f"{MISSING}: no cell at that β (not measured). Bold: the column's best (highest FAA, fewest bytes, "
        "least memory among rows whose every cell logged it on a host without a GPU), "
        f"`{UPPER_BOUND}` (one client holding all data, the upper bound) left out. MB: tensor "
        "payload one client sent over the whole run (10^6 bytes). Peak memory: the most the in-process run "
        "held at once (resident set of the one process, clients and coordinator together; GPU memory not "
        "counted), over the row's cells on hosts without a GPU, or where none logged it there over its GPU "
        "hosts' (marked: their resident set holds the CUDA runtime too), with how many cells that covers when not "
        "all (the others ran on a GPU host, or before the memory was logged). Host: where each β's cells ran, times of "
        "different hosts are not comparable. Commits: the code that ran the row's cells." + _reused_key(cells),
        "",
    ]
    lines += [f"- Host {letter}: {m}" for m, letter in machines.items()]
    plots = "results/clinc150-full"
    lines += [
        "",
        f"Plots from the same cells: [FAA per method and β]({plots}/summary_faa.png) (error bars: the seeds' std), "
        f"[bytes against FAA at β 0.5]({plots}/summary_bytes.png) (the communication-accuracy frontier), and the "
        "mean accuracy over the tasks seen after each task (the paper's curve) at "
        + ", ".join(f"[β {b}]({plots}/accuracy_{b}.png)" for b in BETAS)
        + ".",
        "",
        END,
    ]
    return "\n".join(lines)


def _reused_key(cells: list[dict]) -> str:
    """The key's sentences on cells that lorm-bench copied from a twin instead of running them: of the same
    configuration (``joint``: its one client holds all data, so β is not in its configuration), or of another β
    whose figures are the same by construction (``reused_why`` "split-invariant": a frozen head's sums); or nothing."""
    same, split = (
        sorted({f"`{c['method']}`" for c in cells if c.get("reused_from") and (c.get("reused_why") == why)})
        for why in (None, "split-invariant")
    )
    lines = []
    if same:
        lines.append(
            f" {_listed(same)}: a run at one β, copied to each β where it did not run (its configuration is the same "
            "at every β; lorm-bench copies such a twin instead of running it again)."
        )
    if split:
        agree, differ = split_checks(cells)
        ran = (
            f"{_listed([f'`{x}`' for x in agree])} ran at several β and agree to the last digit"
            if agree
            else "none ran twice"
        )
        lines.append(
            f" {_listed(split)}: a run at one β, copied to each β where it did not run: a frozen head's sums are the "
            "same under any split of the samples over the clients, and its held-out samples are chosen by global "
            f"index, so its figures are the same at every β (of the frozen heads, {ran}"
            + (f"; {_listed([f'`{x}`' for x in differ])} differ" if differ else "")
            + ")."
        )
    return "".join(lines)


def split_checks(cells: list[dict]) -> tuple[list[str], list[str]]:
    """The labels whose figures are the same at every β by construction (``common.methods.split_invariant``) and
    that ran (not reused) at more than one β for a seed: those whose accuracy matrices agree exactly at every β,
    and those where one differs."""
    from engine.cells import stored_split_invariant  # the engine's run machinery, only where a copy is keyed

    runs: dict[str, dict[int, list[str]]] = {}  # label -> seed -> its accuracy matrix at each β it ran
    for cell in cells:
        if not cell.get("reused_from") and stored_split_invariant(cell["config"]):
            runs.setdefault(cell["method"], {}).setdefault(int(cell["seed"]), []).append(json.dumps(cell["accuracy"]))
    twice = {label: seeds for label, seeds in runs.items() if any(len(found) > 1 for found in seeds.values())}
    agree = sorted(label for label, seeds in twice.items() if all(len(set(found)) == 1 for found in seeds.values()))
    return agree, sorted(set(twice) - set(agree))


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


def _listed(letters: list[str]) -> str:
    """``A``, ``A and B``, ``A, B and D``."""
    return letters[0] if len(letters) == 1 else f"{', '.join(letters[:-1])} and {letters[-1]}"


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


def replaced(text: str, table: str, start: str = START, end: str = END) -> str:
    """``text`` with the block between the markers (markers included) replaced by ``table``."""
    head, sep, rest = text.partition(start)
    if not sep or end not in rest:
        raise ValueError(f"docs/RESULTS.md has no block between {start!r} and {end!r}")
    return head + table + rest.split(end, 1)[1]


def generated(text: str, results: Path = FULL.parent, sets: dict[str, list[dict]] | None = None) -> str:
    """``text`` (docs/RESULTS.md) with both tables written afresh from the cells under ``results`` (``sets``: its
    :func:`cost_sets`, when already loaded), the hosts lettered by its ``hosts.json``."""
    order = host_order(results)
    sets = cost_sets(results) if sets is None else sets
    text = replaced(text, summary(sets[FULL.name], order))
    return replaced(text, costs(sets, order), COSTS_START, COSTS_END)


def record_hosts(results: Path = FULL.parent, sets: dict[str, list[dict]] | None = None) -> None:
    """Append to ``hosts.json`` the machines its cells name that it lacks (``sets``: its :func:`cost_sets`, when
    already loaded), so that each keeps its letter when cells of a new host come (their letters follow the
    committed ones)."""
    order = host_order(results)
    every = [cell for cells in (cost_sets(results) if sets is None else sets).values() for cell in cells]
    machines = [*order, *(m for m in hosts(every, order) if m not in order)]
    if machines != order:
        (results / HOSTS).write_text(json.dumps(machines, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/RESULTS.md's tables differ from the cells")
    args = parser.parse_args(argv)
    text = RESULTS.read_text()
    if args.check:
        if generated(text) != text:
            print("docs/RESULTS.md's tables differ from the cells: run python -m engine.results_summary")
            return 1
        return 0
    sets = cost_sets()  # the cells, loaded once: the hosts, both tables and the plots
    record_hosts(sets=sets)
    RESULTS.write_text(generated(text, sets=sets))
    cells = sets[FULL.name]
    plot_faa(cells, FULL / "summary_faa.png")
    plot_bytes(cells, FULL / "summary_bytes.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
