"""bench/missing_cells.py: the full-data cells still missing, and lorm-bench commands that run exactly them."""

from __future__ import annotations

import importlib
import shlex
import sys
from pathlib import Path

from lab.benchmark import build_parser

BENCH = Path(__file__).resolve().parents[2] / "bench"


def planner():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module("missing_cells")


def cell(label: str, beta: float, seed: int, command: str = "") -> dict:
    return {
        "method": label,
        "beta": beta,
        "seed": seed,
        "command": command or f"lorm-bench --preset cpu-clinc150-full --methods {label} --set threads=2",
    }


def test_headline_rows_want_three_seeds_at_every_beta_the_others_one():
    mc = planner()
    cells = [
        cell("ccvr", 0.5, 0),
        *(cell("ncm", b, 0) for b in (1.0, 0.5, 0.2)),
        *(cell("lorm", 0.5, s) for s in range(3)),
    ]
    cells.append(cell("lwf", 0.5, 0))
    assert mc.missing(cells) == {
        "ccvr": {1.0: [0, 1, 2], 0.5: [1, 2], 0.2: [0, 1, 2]},
        "lwf": {1.0: [0], 0.2: [0]},
        "lorm": {1.0: [0, 1, 2], 0.2: [0, 1, 2]},
    }


def test_the_commands_run_what_is_missing_with_each_labels_own_options():
    """Each command parses as lorm-bench's, carries its label's --set values but threads, and its cross product of
    methods, betas and seeds, less the committed cells copied into --out first, is exactly the missing cells."""
    mc = planner()
    fisher = "lorm-bench --preset cpu-clinc150-full --methods fisheravg --set fisher_batch=16 --set threads=1"
    cells = [cell("ccvr", 0.5, 0), cell("lwf", 0.5, 0), cell("fisheravg", 0.5, 0, fisher), cell("ncm", 0.5, 0)]
    lines = mc.commands(cells, "runs/x", 4)
    assert lines[0].startswith("mkdir -p runs/x && cp -rn docs/results/clinc150-full/cells runs/x/")
    planned = set()
    for line in lines[1:]:
        args = build_parser().parse_args(shlex.split(line)[1:])
        assert args.jobs == 4 and args.out == "runs/x" and args.method_config == mc.METHOD_CONFIG
        assert args.set.count("threads=1") == 1 and "threads=2" not in args.set
        methods = ",".join(args.methods).split(",")
        assert ("fisher_batch=16" in args.set) == (methods == ["fisheravg"])
        betas = [float(b) for b in ",".join(args.betas).split(",")]
        seeds = [int(s) for s in ",".join(args.seeds).split(",")]
        planned |= {(m, b, s) for m in methods for b in betas for s in seeds}
    committed = {(c["method"], float(c["beta"]), int(c["seed"])) for c in cells}
    wanted = {(m, b, s) for m, betas in mc.missing(cells).items() for b, seeds in betas.items() for s in seeds}
    assert planned - committed == wanted and ("ncm", 1.0, 0) in wanted


def test_the_committed_table_has_every_label_at_every_beta_and_the_headline_rows_three_seeds():
    """Nothing is missing: every label at beta 1.0, 0.5 and 0.2 (seed 0), the headline rows at seeds 0-2. Twins
    count once run: joint's one configuration and a frozen head's beta 0.5 run serve every beta, but not a head
    with dropout views (``ridge@3layers+valx4avg+views``), which each client draws from its own shard: it ran at
    each beta."""
    mc = planner()
    cells = mc.load_cells(mc.FULL)
    rows = mc.by_method(cells)
    assert set(mc.HEADLINE) <= set(rows) and len(rows) >= 38
    assert mc.missing(cells) == {}
    views = rows["ridge@3layers+valx4avg+views"]
    assert sorted(views) == [0.2, 0.5, 1.0] and not any(c.get("reused_from") for b in views for c in views[b])


def test_an_option_only_some_of_a_labels_cells_ran_with_is_not_carried_to_its_other_cells():
    """LoRM's beta 0.2 cells ran with ``--set gamma_head=0.7`` (the method config's value now); a missing beta 1.0
    cell of the label must not get it, while what every cell shares (``fisher_batch``) still goes along."""
    mc = planner()
    plain = "lorm-bench --preset cpu-clinc150-full --methods lorm --set fisher_batch=16 --set threads=1"
    cells = [cell("lorm", 0.2, s, plain + " --set gamma_head=0.7") for s in range(3)]  # the first a label has
    cells += [cell("lorm", 0.5, s, plain) for s in range(3)]
    (line,) = mc.commands(cells, "runs/x", 2)[1:]
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert "fisher_batch=16" in args.set and not any(item.startswith("gamma_head") for item in args.set)
    assert ",".join(args.betas) == "1.0,0.5,0.2" and args.preset == "cpu-clinc150-full"
    assert mc.carried(plain, plain + " --set gamma_head=0.7") == mc.carried(plain)


def test_labels_whose_commands_order_their_options_otherwise_share_one_run_in_the_order_asked():
    mc = planner()
    first = cell("ccvr", 0.5, 0, "lorm-bench --preset p --method-config m.json --mode inprocess --methods ccvr")
    second = cell("lorm", 0.5, 0, "lorm-bench --mode inprocess --method-config m.json --preset p --methods lorm")
    lines = mc.commands(
        [first, second], "runs/x", 12, ["lorm", "ccvr"], program="python3 -m lab.benchmark", beside="12 at a time"
    )
    assert len(lines) == 2  # the copy, then one run of both labels
    words = shlex.split(lines[1])
    assert words[:3] == ["python3", "-m", "lab.benchmark"] and words[-2:] == ["--beside", "12 at a time"]
    assert words[words.index("--methods") + 1] == "lorm,ccvr"
    args = build_parser().parse_args(words[3:])
    assert args.preset == "p" and args.method_config == "m.json" and args.beside == "12 at a time"


def test_times_give_each_gaps_measured_minutes_by_kind_of_host():
    mc = planner()
    on = [
        cell("lwf", 0.5, 0) | {"wall_seconds": 2424.0, "machine": {"gpu": "none"}},
        cell("lwf", 1.0, 0) | {"wall_seconds": 377.0, "machine": {"gpu": "NVIDIA H200"}},
        cell("target", 0.5, 0) | {"wall_seconds": 3104.0, "machine": {"gpu": "none"}},
        # a copy of a twin's run is no run of its own: its minutes are not counted again
        cell("target", 1.0, 0)
        | {"wall_seconds": 3104.0, "machine": {"gpu": "none"}, "reused_from": "target/beta0.5/seed0"},
    ]
    gaps = mc.missing(on)
    assert sorted(mc.times(on, gaps)) == [
        "lwf: 1 missing; measured CPU 40.4 min (1 cell), GPU 6.3 min (1 cell)",
        "target: 1 missing; measured CPU 51.7 min (1 cell)",
    ]
