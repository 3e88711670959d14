"""The summary table that opens ``docs/RESULTS.md``, and the figures of README's "which method to use"
table, built from the committed full-data cells (``docs/results/clinc150-full/cells``).

One row per method (a bench label such as ``ridge@3layers``) and one FAA column per β (1.0, 0.5, 0.2):
the mean ± sample std over the cell's seeds, "—" where no cell was run. Beside them the seeds per β,
the megabytes one client sent over the run, the most memory an in-process cell held (where it was
logged), and the provenance: the host each β ran on (lettered by :func:`hosts`, which the cost table of
``lab/cost_table.py`` shares) and the commits of the cells. ``lab/results_summary.py`` writes it into
``docs/RESULTS.md``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from lab.report import _machine_line
from lab.rows import METHOD_ORDER

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "docs" / "results" / "clinc150-full"
BETAS = (1.0, 0.5, 0.2)
START = "<!-- summary: written by `python -m lab.results_summary` from docs/results/clinc150-full/cells -->"
END = "<!-- end of summary -->"
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
    from lab.twins import stored_split_invariant  # the methods' registry, only where a copy is keyed

    runs: dict[str, dict[int, list[str]]] = {}  # label -> seed -> its accuracy matrix at each β it ran
    for cell in cells:
        if not cell.get("reused_from") and stored_split_invariant(cell["config"]):
            runs.setdefault(cell["method"], {}).setdefault(int(cell["seed"]), []).append(json.dumps(cell["accuracy"]))
    twice = {label: seeds for label, seeds in runs.items() if any(len(found) > 1 for found in seeds.values())}
    agree = sorted(label for label, seeds in twice.items() if all(len(set(found)) == 1 for found in seeds.values()))
    return agree, sorted(set(twice) - set(agree))


def _listed(letters: list[str]) -> str:
    """``A``, ``A and B``, ``A, B and D``."""
    return letters[0] if len(letters) == 1 else f"{', '.join(letters[:-1])} and {letters[-1]}"
