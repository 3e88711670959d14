"""A privacy-utility curve's rows from committed lorm-bench cells: the FAA of one label at every epsilon
that has a cell, ``docs/results/dp-clinc150/epsilon<E>/cells/<label>/beta<B>/seed<S>/metrics.json``, and the
non-private cell of the same protocol as epsilon ``inf``; written as ``bench/dp_ridge.py --json`` rows, so that
``bench/dp_ridge.py --plot`` draws them beside the closed-form heads' curves. The rows are read from the cells, never
typed: ``tests/test_results_figures.py`` regenerates them and fails on any difference.

Run: .venv/bin/python bench/dp_cells.py --label lorm --out docs/results/dp-clinc150/lorm-s0.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DP = ROOT / "docs" / "results" / "dp-clinc150"
FULL = ROOT / "docs" / "results" / "clinc150-full"


def rows(label: str, beta: str = "0.5", seed: int = 0, dp: Path = DP, full: Path = FULL) -> list[dict[str, Any]]:
    """One row per epsilon with a cell of ``label`` (ascending), then the non-private cell's as ``inf``."""
    out = []
    cell = Path("cells") / label / f"beta{beta}" / f"seed{seed}" / "metrics.json"
    found = []
    for folder in dp.glob("epsilon*"):
        match = re.fullmatch(r"epsilon(\d+(?:\.\d+)?)", folder.name)
        if match and (folder / cell).is_file():
            found.append((float(match.group(1)), folder / cell))
    for epsilon, path in sorted(found):
        metrics = json.loads(path.read_text())
        spent = metrics.get("privacy", {}).get("epsilon")
        out.append(
            {"method": label, "epsilon": epsilon, "accuracy": metrics["faa"], "run_epsilon": spent, "seed": seed}
        )
    plain = full / cell
    if plain.is_file():
        out.append(
            {"method": label, "epsilon": math.inf, "accuracy": json.loads(plain.read_text())["faa"], "seed": seed}
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True, help="the cells' label (a lorm-bench method label)")
    parser.add_argument("--beta", default="0.5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="the rows' JSON file")
    args = parser.parse_args(argv)
    found = rows(args.label, args.beta, args.seed)
    if not found:
        parser.error(f"no cell of {args.label!r} at beta {args.beta}, seed {args.seed}")
    args.out.write_text(json.dumps(found, indent=1) + "\n")
    for row in found:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
