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

A cell runs by ``lab/cells.py``, the grid (one cell at a time, or ``--jobs``) by ``lab/runner.py``; the grid's
plan is ``lab/grid.py``, its report ``lab/report.py``; this module is the command line.

``joint`` is the upper bound: the ``lorm`` strategy with one client that holds all the data and
one task with all the classes. Its cells of different betas are the same run (one client has
no split), so the first finished one is reused for the others. So is a frozen head's (``ncm``, ``ridge`` without
dropout views): its figures are the same under any split. A stored cell is compared with the grid (a twin to reuse,
a changed configuration to warn of) as the code that ran it read it: a setting it left unset at that code's default
(``lab.provenance.DEFAULT_CHANGES``, by the cell's ``code`` commit), a section the run did not read or a
setting without effect beside the others left out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.methods.checks import validate
from common.run.arguments import add_config_arguments, config_from_args
from lab.cells import RUNNERS, Cell
from lab.grid import known_methods, load_method_config, method_of, overridden_sets, plan_grid
from lab.provenance import code_version
from lab.report import write_report
from lab.rows import _duration
from lab.runner import run_children, run_grid
from server.strategies import STRATEGIES


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
        prog = "python -m lab.benchmark" if prog in ("benchmark.py", "__main__.py") else prog
    else:
        prog = "python -m lab.benchmark"
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
        base = validate(
            config_from_args(args, then=(lambda values: {**values, "method": first}) if first in STRATEGIES else None)
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
