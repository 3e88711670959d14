"""The summary table that opens ``docs/RESULTS.md``, and the figures of README's "which method to use"
table, built from the committed full-data cells (``docs/results/clinc150-full/cells``).

The summary is ``lab/summary_table.py``'s (one row per method, one FAA column per β, with seeds, bytes, memory
and provenance), the second table ``lab/cost_table.py``'s (what every in-process cell of the full data cost:
``clinc150-full`` and its side sets, its time, peak memory, host and threads, and which times compare).

``python -m lab.results_summary`` rewrites both tables between their markers in ``docs/RESULTS.md`` and
draws its two plots beside the cells (``lab/summary_plots.py``: ``summary_faa.png``, FAA per method and β with
the seeds' std; ``summary_bytes.png``, MB per client against FAA at β 0.5); ``--check`` exits 1 when a committed
table differs from the cells (tests/test_docs.py runs the same comparison). Hosts are lettered by
``docs/results/hosts.json`` (the machines in letter order), to which a run of this module appends a new host, so
that the letters the prose quotes stay put.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from lab.cost_table import COSTS_END, COSTS_START, cost_sets, costs
from lab.summary_plots import plot_bytes, plot_faa
from lab.summary_table import END, FULL, HOSTS, ROOT, START, host_order, hosts, summary

RESULTS = ROOT / "docs" / "RESULTS.md"


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
            print("docs/RESULTS.md's tables differ from the cells: run python -m lab.results_summary")
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
