"""The lorm-bench commands of the full-data cells still missing, written from the committed cells.

The comparison wants every method (every label with a committed cell in ``docs/results/clinc150-full/cells``) at β
1.0, 0.5 and 0.2, seed 0, and the headline rows (:data:`HEADLINE`) at seeds 0, 1 and 2 at every β. Each missing
cell's command is its label's committed command (the preset, method config and ``--set`` values every committed cell
of the label ran with, ``threads`` aside),
for that β and those seeds, into ``--out``; a GPU host runs them ``--jobs`` at a time (``lorm-bench --jobs``: one
process a cell). A twin runs once: lorm-bench copies a finished cell to an identical configuration (``joint`` at
every β) and to a frozen head's other β (``ncm``, ``ridge`` without ``ridge.views``: its sums are the same under any
split, its held-out samples chosen by global index; ``common.methods.split_invariant``), so such a "missing" cell
costs no run once its twin is committed. Printed, not run: copy the cells into the committed folder when they
finish, then ``python -m lab.results_summary``. The committed cells are copied into ``--out`` first, so
lorm-bench skips them and runs only what is missing.

    .venv/bin/python bench/missing_cells.py [--out runs/gpu45] [--jobs 8] [--labels lorm,ccvr]

With ``--times``, instead of the commands: each label with missing cells, how many, and the minutes its committed
cells took on hosts without a GPU and with one (the range, and the cells), to plan what fits a lent GPU's call.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.rows import cell_seconds, load_cells  # noqa: E402
from lab.summary_table import BETAS, FULL, by_method  # noqa: E402

HEADLINE = (
    "lorm",
    "ccvr",
    "pilora",
    "fisheravg",
    "fedavg",
    "ridge@3layers",
    "ridge@mpnet-6layers+valx4avg",
    "lorm-ridge-first@3layers+valx4avg",  # on the layers held-out samples choose (its 4-layer twin: the test split)
)
SEEDS: tuple[int, ...] = (0, 1, 2)
METHOD_CONFIG = "bench/clinc150_methods.json"
KEPT = ("--preset", "--method-config", "--set", "--mode")  # what a label's committed command carries over


def missing(cells: list[dict], labels: list[str] | None = None) -> dict[str, dict[float, list[int]]]:
    """Label -> β -> the seeds the comparison wants and no committed cell has."""
    rows = by_method(cells)
    out: dict[str, dict[float, list[int]]] = {}
    for label, row in rows.items():
        if labels and label not in labels:
            continue
        wanted = SEEDS if label in HEADLINE else (0,)
        for beta in BETAS:
            have = {int(cell["seed"]) for cell in row.get(beta, [])}
            seeds = [s for s in wanted if s not in have]
            if seeds:
                out.setdefault(label, {})[beta] = seeds
    return out


def carried(*commands: str) -> list[str]:
    """The options the committed commands of a label's cells all share: the preset, the method config (the grid's,
    where a command named none: a label's β-specific values live there), the mode and each ``--set`` but
    ``threads``; in one order (labels whose commands wrote the same options in another order share a group, so one
    lorm-bench runs their cells side by side). An option one cell's command has and another's lacks is that cell's
    own, not the label's (LoRM's head γ 0.7 at β 0.2, first given as ``--set``, is the method config's now), and is
    left out, so that it cannot reach the label's other β."""
    first, *others = [_pairs(command) for command in commands]
    kept = [pair for pair in first if all(pair in other for other in others)]
    return [word for pair in sorted(kept, key=lambda p: (KEPT.index(p[0]), p[1])) for word in pair]


def _pairs(command: str) -> list[tuple[str, str]]:
    words, kept = shlex.split(command), []
    if "--method-config" not in words:
        kept.append(("--method-config", METHOD_CONFIG))
    for i, word in enumerate(words):
        if word in KEPT and i + 1 < len(words):
            value = words[i + 1]
            if word == "--set" and value.startswith("threads="):
                continue
            kept.append((word, value))
    return kept


def commands(
    cells: list[dict],
    out: str,
    jobs: int,
    labels: list[str] | None = None,
    program: str = ".venv/bin/lorm-bench",
    beside: str = "",
) -> list[str]:
    """The shell lines that run every missing cell: the committed cells copied into ``out`` first (lorm-bench skips
    a finished cell), then one ``program`` (lorm-bench) per group of labels that share their options and seeds, over
    every β, the groups in the order of ``labels`` (first wanted first), with ``--beside`` when given."""
    rows = by_method(cells)
    groups: dict[tuple[tuple[str, ...], tuple[int, ...]], list[str]] = {}
    gaps = missing(cells, labels)
    for label in sorted(gaps, key=lambda x: labels.index(x)) if labels else gaps:
        options = carried(*(cell["command"] for group in rows[label].values() for cell in group))
        seeds: tuple[int, ...] = SEEDS if label in HEADLINE else (0,)
        groups.setdefault((tuple(options), seeds), []).append(label)
    committed = shlex.quote(str(FULL.relative_to(ROOT) / "cells"))
    lines = [f"mkdir -p {shlex.quote(out)} && cp -rn {committed} {shlex.quote(out)}/"]
    for (base, seeds), members in groups.items():
        argv = [*shlex.split(program), *base, "--methods", ",".join(members), "--betas", ",".join(map(str, BETAS))]
        argv += ["--seeds", ",".join(map(str, seeds)), "--out", out, "--jobs", str(jobs), "--set", "threads=1"]
        lines.append(shlex.join(argv + (["--beside", beside] if beside else [])))
    return lines


def times(cells: list[dict], gaps: dict[str, dict[float, list[int]]]) -> list[str]:
    """Per label of ``gaps``: its missing cells, and the minutes its committed cells took on hosts without a GPU
    and with one (a resumed cell's summed computing time counts as the others; what ran beside them is in the
    cost table of docs/RESULTS.md)."""
    rows = by_method(cells)
    lines = []
    for label, betas in gaps.items():
        done = [c for group in rows[label].values() for c in group if not c.get("reused_from")]  # each run once
        parts = []
        for kind, on_gpu in (("CPU", False), ("GPU", True)):
            minutes = sorted(cell_seconds(c) / 60 for c in done if (c["machine"]["gpu"] != "none") == on_gpu)
            if minutes:
                span = f"{minutes[0]:.1f}" + (f"-{minutes[-1]:.1f}" if minutes[-1] - minutes[0] >= 0.05 else "")
                parts.append(f"{kind} {span} min ({len(minutes)} cell{'s' * (len(minutes) > 1)})")
        count = sum(len(seeds) for seeds in betas.values())
        lines.append(f"{label}: {count} missing; measured {', '.join(parts) or 'nowhere'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default="runs/gpu45", help="where the cells go (then copy them into the committed folder)"
    )
    parser.add_argument("--jobs", type=int, default=8, help="cells at a time on the host")
    parser.add_argument("--labels", default="", help="only these labels (comma-separated), their groups in this order")
    parser.add_argument(
        "--program", default=".venv/bin/lorm-bench", help="what runs lorm-bench (e.g. 'python3 -m lab.benchmark')"
    )
    parser.add_argument("--beside", default="", help="lorm-bench --beside: what else runs on the host meanwhile")
    parser.add_argument("--times", action="store_true", help="each label's missing cells and measured minutes")
    args = parser.parse_args(argv)
    cells = load_cells(FULL)
    labels = [x for x in args.labels.split(",") if x] or None
    gaps = missing(cells, labels)
    count = sum(len(seeds) for betas in gaps.values() for seeds in betas.values())
    print(f"# {count} cells missing over {len(gaps)} labels (LORM_DATA_DIR must name the datasets)")
    if args.times:
        print("\n".join(times(cells, gaps)))
        return 0
    print("\n".join(commands(cells, args.out, args.jobs, labels, args.program, args.beside)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
