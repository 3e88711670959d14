"""lorm-poison: FAA with one hostile client, with the robust guard off and on (``server/robust.py``).

Each cell is one in-process run of a preset at one beta and seed, with client ``--attacker``
hostile in one way of ``engine.attacks`` (or none; ``collude-k`` makes clients ``--attacker`` to
``--attacker + k - 1`` hostile together), and ``robust.enabled`` off or on. Cells are
``OUT/<attack>/<guard>/metrics.json``; a finished cell is skipped (resume). The table goes to
``OUT/results.md`` (``--table``) and stdout. ``--attacks naive`` / ``adaptive`` name the two sets.

    python -m engine.poisoning --preset cpu-clinc150-quick --beta 0.5 --out runs/poisoning \\
        --attacks none,scale-factors,scale-grams,flip-sign,flip-labels --guards off,on
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from client.transport import Rejected
from common.aggregation.validate import UpdateRejected
from common.methods.checks import validate
from common.run.arguments import merged
from common.run.config import RunConfig
from common.run.presets import preset
from engine.attacks import ADAPTIVE, ATTACKS, NAIVE, hostile_indices, wrap_hostile
from engine.simulation import run_inprocess

GUARDS = ("off", "on")


def cell_config(base: RunConfig, guard: str, settings: dict[str, Any]) -> RunConfig:
    """``base`` with ``robust.enabled`` as ``guard`` says, and the guard's other settings."""
    robust = {"enabled": guard == "on"} | (settings if guard == "on" else {})
    return validate(RunConfig.from_dict(merged(json.loads(base.to_json()), {"settings": {"robust": robust}})))


def run_cell(config: RunConfig, attack: str, attacker: int, cell: Path) -> dict[str, Any]:
    hostile = hostile_indices(attack, attacker, config.num_clients) if attack != "none" else []
    cell.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    lines: list[str] = []
    with open(cell / "log.txt", "w", buffering=1) as log:

        def say(line: str) -> None:
            log.write(line + "\n")
            lines.append(line)

        try:
            result = run_inprocess(
                config,
                log=say,
                results_dir=cell / "run" / "results",
                wrap=wrap_hostile(attack, hostile) if hostile else None,
            )
        except (UpdateRejected, Rejected) as err:  # refused as it is folded, or as it arrives
            # The run cannot go on: a client's update is not even well-formed any more (e.g. NaN
            # factors once the merged model has been wrecked). That is the cell's outcome.
            metrics = {
                "config": json.loads(config.to_json()),
                "faa": None,
                "broken": f"after '{lines[-1] if lines else 'the start'}': an update was refused ({err})",
            }
        else:
            steps = [h["robust"] for h in result.history if h.get("robust", {}).get("screened")]
            metrics = result.summary() | {
                "screened_steps": len(steps),
                "refused": {"attacker": 0, "honest": 0},
                "clipped": {"attacker": 0, "honest": 0},
            }
            for report in steps:
                for what in ("refused", "clipped"):
                    for i in report[what]:
                        metrics[what]["attacker" if i in hostile else "honest"] += 1
    metrics |= {
        "attack": attack,
        "attacker": attacker if attack != "none" else None,
        "hostile": hostile,
        "wall_seconds": time.perf_counter() - start,
    }
    (cell / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
    return metrics


def table(out: Path, attacks: list[str], guards: list[str]) -> str:
    """Markdown: one row per attack, FAA per guard, with what the guard refused and clipped."""
    lines = [
        "| attack | " + " | ".join(f"FAA, guard {g}" for g in guards) + " | refused (attacker / honest) "
        "| clipped (attacker / honest) |",
        "|---" * (len(guards) + 3) + "|",
    ]
    notes: list[str] = []
    for attack in attacks:
        cells = []
        guarded: dict[str, Any] = {}
        for guard in guards:
            path = out / attack / guard / "metrics.json"
            if not path.exists():
                cells.append("-")
                continue
            m = json.loads(path.read_text())
            if m["faa"] is None:
                notes.append(f"{attack}, guard {guard}: the run broke down {m['broken']}")
                cells.append(f"broken ({len(notes)})")
            else:
                cells.append(f"{m['faa']:.2f}")
            if guard == "on" and "refused" in m:
                guarded = m
        steps = guarded.get("screened_steps", 0)
        counts = [
            f"{guarded[w]['attacker']} / {guarded[w]['honest']} of {steps} steps" if guarded else "-"
            for w in ("refused", "clipped")
        ]
        lines.append(f"| {attack} | " + " | ".join(cells) + f" | {counts[0]} | {counts[1]} |")
    return "\n".join(lines + ([""] + [f"({i}) {note}" for i, note in enumerate(notes, 1)] if notes else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lorm-poison", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-clinc150-quick")
    parser.add_argument("--method", default="lorm")
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attacker", type=int, default=3, help="the hostile client's index")
    parser.add_argument(
        "--attacks", default=",".join(("none",) + NAIVE), help="comma-separated; naive, adaptive: each set"
    )
    parser.add_argument("--guards", default=",".join(GUARDS))
    parser.add_argument("--robust", default="{}", help="the guard's settings when on, JSON (e.g. '{\"kappa\": 3}')")
    parser.add_argument("--out", required=True)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--table", default="results.md", help="the table's file name under --out")
    args = parser.parse_args(argv)
    sets = {"naive": list(NAIVE), "adaptive": list(ADAPTIVE)}
    attacks = [a for name in args.attacks.split(",") for a in sets.get(name, [name])]
    guards = args.guards.split(",")
    for attack in attacks:
        if attack != "none" and attack not in ATTACKS:
            parser.error(f"unknown attack {attack!r}; known: none, {', '.join(ATTACKS)}")
    for guard in guards:
        if guard not in GUARDS:
            parser.error(f"--guards takes {', '.join(GUARDS)}, got {guard!r}")
    base = validate(
        RunConfig.from_dict(preset(args.preset) | {"method": args.method, "beta": args.beta, "seed": args.seed})
    )
    if not 0 <= args.attacker < base.num_clients:
        parser.error(f"--attacker must be a client index below {base.num_clients}, got {args.attacker}")
    out = Path(args.out)
    settings = json.loads(args.robust)
    for attack in attacks:
        for guard in guards:
            cell = out / attack / guard
            if args.report_only or (cell / "metrics.json").exists():
                continue
            print(f"{attack}, guard {guard}: running", flush=True)
            m = run_cell(cell_config(base, guard, settings), attack, args.attacker, cell)
            outcome = f"FAA {m['faa']:.2f}" if m["faa"] is not None else f"broke down {m['broken']}"
            print(f"{attack}, guard {guard}: {outcome} ({m['wall_seconds'] / 60:.1f} min)", flush=True)
    text = table(out, attacks, guards)
    out.mkdir(parents=True, exist_ok=True)
    (out / args.table).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
