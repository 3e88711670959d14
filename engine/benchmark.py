"""``lorm-bench``: a grid of runs (method x beta x seed) and the paper's kind of table.

Every cell runs into ``<out>/cells/<method>/beta<b>/seed<s>/``::

    metrics.json  the run's summary (accuracy matrix, FAA, forgetting, history, config) plus
                  method, beta, seed, mode, wall_seconds (of this invocation; the tables take a resumed
                  in-process cell's summed ``seconds``), bytes_per_client, command, machine, and
                  code (the commit of the code that ran it, and whether its tree had changes); in
                  process also peak_rss_bytes and device (where the clients trained: cpu, cuda)
    log.txt       the run's output;  error.txt  why the last attempt failed (if it did)
    run/          the run's own results directory (adapter, head, plot, TensorBoard), and in
                  distributed mode its config.json and the coordinator's state; in-process,
                  ``run/state`` while the cell runs (the run committed after every step)

A cell whose ``metrics.json`` exists is done: a second invocation skips it (resume). A cell cut
short (killed, failed, timed out) goes on from its last committed step when the grid runs it
again, if its configuration is unchanged (else it starts over): in process from the engine's
state, distributed from the coordinator's (with fresh client processes); the result is the
uninterrupted run's. A failed cell leaves ``error.txt`` and the grid goes on. Cells run one
after another, or with ``--jobs N`` up to N at a time, each in its own ``lorm-bench`` child process
(its output in the cell's ``bench.log``; a GPU host or many cores: give each cell one thread), the
same cells and results as one after another.

After the grid (or with ``--report-only``) ``<out>/results.md`` and ``results.csv`` hold one
row per (dataset, method, beta) over every finished cell, beside the paper's FAA where the paper
reports one; ``faa.png`` and ``accuracy_<beta>.png`` plot them.

Running the cells (one at a time, or ``--jobs``) is ``engine/cells.py``; this module plans the grid and is
the command line.

``joint`` is the upper bound: the ``lorm`` strategy with one client that holds all the data and
one task with all the classes. Its cells of different betas are the same run (one client has
no split), so the first finished one is reused for the others. So is a frozen head's (``ncm``, ``ridge`` without
dropout views): its figures are the same under any split. A stored cell is compared with the grid (a twin to reuse,
a changed configuration to warn of) as the code that ran it read it: a setting it left unset at that code's default
(``common.run.settings.DEFAULT_CHANGES``, by the cell's ``code`` commit), a section the run did not read or a
setting without effect beside the others left out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.run.config import RunConfig, add_config_arguments, config_from_args, key_path, merged
from common.run.presets import PRESETS
from engine.benchmark_report import JOINT, _duration, write_report
from engine.cells import RUNNERS, Cell, code_version, run_children, run_grid
from server.strategies import STRATEGIES

# Keys the grid itself sets in every cell; a method configuration may not.
GRID_KEYS = ("method", "beta", "seed", "run_id")


def known_methods() -> list[str]:
    return sorted(STRATEGIES) + [JOINT]


def method_of(label: str) -> str:
    """The method a grid label names: ``NAME``, or ``NAME@VARIANT`` (the same method with the overrides the
    method config gives under the whole label, e.g. ``lorm-vera@appendix``); ``ValueError`` if unknown."""
    name, _, variant = label.partition("@")
    if name not in known_methods() or ("@" in label and not variant):
        raise ValueError(f"unknown method {label!r}; known: {known_methods()} (a variant: NAME@VARIANT)")
    return name


# ---------------------------------------------------------------------- planning the grid


def load_method_config(path: str | None) -> dict[str, dict[str, Any]]:
    """``{method: {key: value, "beta=<b>": {key: value}, "preset=<name>": {...}}}`` from a JSON file, checked.

    A ``preset=<name>`` object holds overrides of the same form (plain keys and ``beta=`` objects) that apply only to
    a grid run from that ``--preset``: a choice made on one protocol's held-out samples (LoRM's head γ at β 0.2 on
    the full data) without changing the cells of another protocol (the quick one, whose held-out samples chose
    otherwise)."""
    if not path:
        return {}
    with open(path) as f:
        values = json.load(f)
    if not isinstance(values, dict):
        raise ValueError(
            f"--method-config {path}: expected a JSON object {{method: {{key: value}}}}, got {type(values).__name__}"
        )
    for method, overrides in values.items():
        try:
            method_of(method)
        except ValueError as err:
            raise ValueError(f"--method-config {path}: {err}") from None
        if not isinstance(overrides, dict):
            raise ValueError(f"--method-config {path}: {method}: expected an object, got {overrides!r}")
        _check_overrides(overrides, f"--method-config {path}: {method}", path, presets=True)
    return values


def _check_overrides(overrides: dict[str, Any], where: str, path: str, presets: bool) -> None:
    for key, value in overrides.items():
        if key.startswith("preset="):
            name = key.partition("=")[2]
            if not presets:
                raise ValueError(f"{where}.{key}: a preset's overrides cannot hold another preset's")
            if name not in PRESETS:
                raise ValueError(f"{where}.{key}: unknown preset {name!r}; known: {sorted(PRESETS)}")
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key}: expected an object, got {value!r}")
            _check_overrides(value, f"{where}.{key}", path, presets=False)
            continue
        if key.startswith("beta="):
            _beta_of(key, path)
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key}: expected an object, got {value!r}")
        keys = value if key.startswith("beta=") else {key: value}
        fixed = sorted(set(keys) & set(GRID_KEYS))
        if fixed:
            raise ValueError(f"{where}: {fixed} are set by the grid, not per method")


def _beta_of(key: str, path: str) -> float:
    try:
        return float(key.partition("=")[2])
    except ValueError:
        raise ValueError(f"--method-config {path}: expected 'beta=<number>', got {key!r}") from None


def _applied(values: dict[str, Any], overrides: dict[str, Any], beta: float) -> dict[str, Any]:
    """``values`` < the plain overrides < those for ``beta`` (``preset=`` objects aside)."""
    # Objects (settings sections, legacy extra) merge key by key at any depth, never replace.
    values = merged(values, {k: v for k, v in overrides.items() if not k.startswith(("beta=", "preset="))})
    for key, per_beta in overrides.items():
        if key.startswith("beta=") and math.isclose(_beta_of(key, "method config"), beta):
            values = merged(values, per_beta)
    return values


def cell_config(
    base: RunConfig,
    method: str,
    beta: float,
    seed: int,
    method_config: dict[str, dict[str, Any]],
    preset_name: str = "",
) -> RunConfig:
    """Base < the method's overrides < its overrides for ``beta`` < its ``preset=<preset_name>`` overrides (plain,
    then for ``beta``) < the grid's (strategy, beta, seed)."""
    overrides = method_config.get(method, {})
    values = _applied(json.loads(base.to_json()), overrides, beta)
    values = _applied(values, overrides.get(f"preset={preset_name}", {}), beta)  # no "preset=" key loads
    run_id = f"{base.run_id}-{method.replace('@', '-')}-b{beta}-s{seed}"
    values.update(method=method_of(method), beta=beta, seed=seed, run_id=run_id)
    if method_of(method) == JOINT:
        # One client holds everything, one task has every class; beta then splits nothing, so
        # it is pinned and the joint cells of all betas share one configuration (a variant,
        # joint@VARIANT, is the same upper bound with its own overrides, e.g. a learning rate).
        values.update(method="lorm", num_clients=1, num_tasks=1, task_sizes=[], beta=1.0)
    return RunConfig.from_dict(values)


def plan_grid(
    base: RunConfig,
    methods: list[str],
    betas: list[float],
    seeds: list[int],
    method_config: dict[str, dict[str, Any]],
    preset_name: str = "",
) -> list[Cell]:
    for label in methods:
        if "@" in label and label not in method_config:
            # a variant is its overrides: without them the label would run its plain method under another name
            variants = sorted(v for v in method_config if v.partition("@")[0] == method_of(label) and "@" in v)
            raise ValueError(
                f"--methods {label}: no such variant in --method-config (variants of {method_of(label)} there: "
                f"{', '.join(variants) or 'none'})"
            )
    return [
        Cell(m, b, s, cell_config(base, m, b, s, method_config, preset_name))
        for m in methods
        for b in betas
        for s in seeds
    ]


def overridden_sets(base: RunConfig, cells: list[Cell], sets: list[str]) -> list[str]:
    """One line per cell where the method config sets a ``--set`` key to another value (it takes
    precedence: ``--set`` is the grid's base, the method config each method's own), so that a
    command-line value the grid does not use is never silent."""
    values = json.loads(base.to_json())
    per_cell = [(cell, json.loads(cell.config.to_json())) for cell in cells if method_of(cell.method) != JOINT]
    lines = []
    for key in dict.fromkeys(item.partition("=")[0] for item in sets):
        path = key_path(key)
        if path[0] in GRID_KEYS:
            continue
        wanted = _at(values, path)
        for cell, cell_values in per_cell:
            got = _at(cell_values, path)
            if got != wanted:
                lines.append(
                    f"--set {key}={json.dumps(wanted)} is overridden by --method-config for {cell.method} at "
                    f"beta {cell.beta:g}, seed {cell.seed}: {key}={json.dumps(got)}"
                )
    return lines


def _at(values: Any, path: list[str]) -> Any:
    for part in path:
        values = values.get(part) if isinstance(values, dict) else None
    return values


# ---------------------------------------------------------------------- command line


def machine_info() -> dict:
    """Cores, CPU model, GPU (or none), Python and torch versions of this machine."""
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "system": f"{platform.system()} {platform.machine()}",
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _csv(text: str, cast: Callable[[str], Any], what: str) -> list:
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            value = cast(item)
        except ValueError:
            raise ValueError(f"{what}: expected a list of {cast.__name__}, got {item!r}") from None
        if value not in values:
            values.append(value)
    if not values:
        raise ValueError(f"{what}: expected at least one value, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorm-bench",
        description="Run a grid of methods x betas x seeds and "
        "write the paper's kind of table (results.md, results.csv, plots).",
    )
    add_config_arguments(parser)
    # Lists: comma-separated, space-separated, or both (--betas 1.0,0.5 0.2).
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["lorm"],
        help=f"methods, comma- or space-separated (NAME or NAME@VARIANT, its overrides in --method-config): "
        f"{', '.join(known_methods())}",
    )
    parser.add_argument(
        "--betas", nargs="+", default=[], help="Dirichlet betas, comma- or space-separated (default: the config's beta)"
    )
    parser.add_argument(
        "--seeds", nargs="+", default=[], help="seeds, comma- or space-separated (default: the config's seed)"
    )
    parser.add_argument(
        "--mode",
        choices=sorted(RUNNERS),
        default="inprocess",
        help="inprocess: the in-process engine; distributed: coordinator + client processes",
    )
    parser.add_argument("--out", required=True, help="the grid's folder (cells/, results.md, results.csv, plots)")
    parser.add_argument(
        "--method-config",
        default="",
        help='JSON {method: {key: value, "beta=<b>": {key: value}, "preset=<name>": {the same, for that --preset}}}',
    )
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds one cell may take (0: no limit)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the tables and plots from the cells")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="cells at a time, each in its own process (default 1: one after another, in this process); "
        "set threads=1 per cell (--set threads=1) so that N cells use N cores",
    )
    parser.add_argument(
        "--no-report", action="store_true", help="leave the tables and plots alone (what --jobs gives its children)"
    )
    parser.add_argument(
        "--beside",
        default="",
        help="what else runs on this host meanwhile, recorded in every cell (RESULTS' cost table says which times "
        "compare): e.g. 'alone', or 'one 1-thread lorm cell and pytest'",
    )
    return parser


def child_argv(args: argparse.Namespace, cell: Cell) -> list[str]:
    """The command line of a ``--jobs`` child: this grid's configuration, for ``cell`` alone, no report."""
    argv = ["--preset", args.preset] if args.preset else []
    argv += ["--config", args.config] if args.config else []
    for item in args.set:
        argv += ["--set", item]
    argv += ["--method-config", args.method_config] if args.method_config else []
    argv += ["--mode", args.mode, "--timeout", str(args.timeout), "--out", args.out, "--no-report"]
    argv += ["--beside", args.beside] if args.beside else []
    return argv + ["--methods", cell.method, "--betas", str(cell.beta), "--seeds", str(cell.seed)]


def _command_line(argv: list[str] | None) -> str:
    if argv is None:
        argv = sys.argv[1:]
        prog = Path(sys.argv[0]).name
        prog = "python -m engine.benchmark" if prog in ("benchmark.py", "__main__.py") else prog
    else:
        prog = "python -m engine.benchmark"
    return " ".join([prog, shlex.join(argv)]).strip()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = _command_line(argv)
    out = Path(args.out)
    machine = machine_info()
    if args.report_only:
        if not (out / "cells").is_dir():
            parser.error(f"--report-only: no cells under {out / 'cells'}; run the grid first")
        write_report(out, command, machine)
        print(f"wrote {out / 'results.md'}, {out / 'results.csv'}", flush=True)
        return 0
    try:
        methods = _csv(",".join(args.methods), str, "--methods")
        for m in methods:
            method_of(m)
        # the base is checked as its first method's configuration: settings that only the listed methods take (a
        # dp budget for the closed-form heads) are not refused for the preset's own method; each cell is checked again
        first = method_of(methods[0]) if methods else ""
        base = config_from_args(
            args, then=(lambda values: {**values, "method": first}) if first in STRATEGIES else None
        )
        betas = _csv(",".join(args.betas), float, "--betas") if args.betas else [base.beta]
        seeds = _csv(",".join(args.seeds), int, "--seeds") if args.seeds else [base.seed]
        cells = plan_grid(base, methods, betas, seeds, load_method_config(args.method_config), args.preset)
        if args.jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    except (ValueError, OSError) as err:
        parser.error(str(err))
    for line in overridden_sets(base, cells, args.set):
        print(f"lorm-bench: {line}", file=sys.stderr, flush=True)
    print(
        f"lorm-bench: {len(cells)} cells ({len(methods)} methods x {len(betas)} betas x {len(seeds)} seeds), "
        f"{args.mode}, dataset {base.dataset}, into {out}",
        flush=True,
    )
    start = time.perf_counter()

    def say(line: str) -> None:
        print(line, flush=True)

    failed: list[str] = []
    if args.jobs > 1:
        failed = run_children(cells, out, args.mode, args.jobs, lambda cell: child_argv(args, cell), say=say)
        cells = [cell for cell in cells if cell.name not in failed]  # not again in this process
    failed += run_grid(
        cells,
        out,
        args.mode,
        args.timeout,
        {"command": command, "machine": machine, "code": code_version()}
        | ({"beside": args.beside} if args.beside else {}),
        say=say,
    )
    if args.no_report:
        return 1 if failed else 0
    write_report(out, command, machine)
    print(
        f"lorm-bench: grid done in {_duration(time.perf_counter() - start)}; wrote {out / 'results.md'}, "
        f"{out / 'results.csv'}, {out / 'faa.png'}",
        flush=True,
    )
    if failed:
        print(f"lorm-bench: {len(failed)} cell(s) failed: {', '.join(failed)}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
