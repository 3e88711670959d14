"""The benchmark runner: a grid of real tiny runs, resume, failures, and the tables against the cells."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import lab.benchmark as bench
import lab.cells as cell_run
import lab.grid as plan
import lab.paper as paper
import lab.provenance as provenance
import lab.runner as runner
from common.run.config import RunConfig
from common.run.presets import preset
from engine.simulation import run_inprocess

from procenv import project_pythonpath

TINY = ["--preset", "tiny", "--set", "num_tasks=2", "--set", "rounds_per_task=1", "--set", "local_epochs=1"]
METHODS = ["lorm", "fedavg-lora", "joint"]
SEEDS = [1, 2]
METHOD_CONFIG = {"lorm": {"lr_lora": 2e-3}, "fedavg-lora": {"beta=0.5": {"lr": 0.05}, "beta=1.0": {"lr": 0.5}}}


def bench_main(argv: list[str]) -> tuple[int, str]:
    """``lorm-bench argv``: its exit code and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(argv)
    return rc, out.getvalue()


def cell_dirs(out: Path) -> list[Path]:
    return sorted(p.parent for p in (out / "cells").glob("*/beta*/seed*/metrics.json"))


def mtimes(out: Path) -> dict[Path, int]:
    return {d: (d / "metrics.json").stat().st_mtime_ns for d in cell_dirs(out)}


def read_csv(path: Path) -> dict[str, dict]:
    with open(path) as f:
        return {row["method"]: row for row in csv.DictReader(f)}


def forbid_runs(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("no cell should run")

    monkeypatch.setattr(cell_run, "run_inprocess", fail)


def fake_run(fail_seeds=(), sleep_s=0.0, calls=None):
    """Stands in for ``run_inprocess``: a fixed two-task result (FAA 50, forgetting 20) per config."""

    def run(config: RunConfig, log=None, results_dir=None, state_dir=None):
        if calls is not None:
            calls.append(config)
        time.sleep(sleep_s)
        if config.seed in fail_seeds:
            raise RuntimeError(f"boom for seed {config.seed}")
        summary = {
            "config": json.loads(config.to_json()),
            "seconds": 0.1,
            "history": [
                {"task": 0, "bytes_per_client": 100.0},
                {"task": 1, "bytes_per_client": 50.0},
                {"task": 1, "phase": "evaluate", "accuracy": [40.0, 60.0]},
            ],
            "accuracy": [[60.0], [40.0, 60.0]],
            "correct": [[6], [4, 6]],
            "total": [[10], [10, 10]],
            "faa": 50.0,
            "faa_weighted": 50.0,
            "forgetting": 20.0,
        }
        return SimpleNamespace(summary=lambda: summary)

    return run


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """Three methods x one beta x two seeds, real in-process tiny runs."""
    root = tmp_path_factory.mktemp("bench")
    (root / "methods.json").write_text(json.dumps(METHOD_CONFIG))
    out = root / "grid"
    argv = TINY + [
        "--methods",
        ",".join(METHODS),
        "--betas",
        "0.5",
        "--seeds",
        "1,2",
        "--out",
        str(out),
        "--method-config",
        str(root / "methods.json"),
    ]
    rc, printed = bench_main(argv)
    return SimpleNamespace(out=out, rc=rc, printed=printed, argv=argv)


def test_grid_runs_every_cell_with_its_configuration(grid):
    assert grid.rc == 0, grid.printed
    assert [d.relative_to(grid.out / "cells").as_posix() for d in cell_dirs(grid.out)] == sorted(
        f"{m}/beta0.5/seed{s}" for m in METHODS for s in SEEDS
    )
    for d in cell_dirs(grid.out):
        m = json.loads((d / "metrics.json").read_text())
        assert (m["beta"], m["mode"]) == (0.5, "inprocess") and f"seed{m['seed']}" == d.name
        assert m["bytes_per_client"] == sum(e.get("bytes_per_client", 0) for e in m["history"]) > 0
        assert m["wall_seconds"] > 0 and m["config"]["seed"] == m["seed"]
        assert m["code"] == provenance.code_version()  # the commit that ran it (None outside a git checkout)
        assert m["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # where its clients trained
        assert (d / "run" / "results" / "metrics.json").exists() and (d / "log.txt").exists()
        if m["method"] == "joint":
            # The upper bound: LoRM, one client with all data, one task with all classes.
            assert (m["config"]["method"], m["config"]["num_clients"], m["config"]["num_tasks"]) == ("lorm", 1, 1)
            assert len(m["accuracy"]) == 1 and m["faa"] == m["accuracy"][0][0] == pytest.approx(m["faa_weighted"])
        else:
            assert m["config"]["method"] == m["method"] and m["config"]["num_clients"] == 3
    lorm = json.loads((grid.out / "cells/lorm/beta0.5/seed1/metrics.json").read_text())["config"]
    fedavg = json.loads((grid.out / "cells/fedavg-lora/beta0.5/seed1/metrics.json").read_text())["config"]
    assert lorm["lr_lora"] == 2e-3 and lorm["lr"] == preset("tiny")["lr"]  # per-method override
    assert fedavg["lr"] == 0.05  # per-beta override (beta=1.0's value is not used)
    assert "[1/6] lorm beta=0.5 seed=1" in grid.printed and "[6/6] joint beta=0.5 seed=2" in grid.printed
    assert grid.printed.count(": FAA ") == 6


def test_tables_and_plots_agree_with_the_cells(grid):
    rows = read_csv(grid.out / "results.csv")
    md = (grid.out / "results.md").read_text()
    assert sorted(rows) == sorted(METHODS)
    for method in METHODS:
        cells = [json.loads((grid.out / f"cells/{method}/beta0.5/seed{s}/metrics.json").read_text()) for s in SEEDS]
        faa = np.array([c["faa"] for c in cells])
        row = rows[method]
        assert (row["dataset"], float(row["beta"]), int(row["seeds"])) == ("synthetic-text", 0.5, 2)
        assert float(row["faa_mean"]) == pytest.approx(faa.mean())
        assert float(row["faa_std"]) == pytest.approx(faa.std(ddof=1))
        assert float(row["faa_weighted_mean"]) == pytest.approx(np.mean([c["faa_weighted"] for c in cells]))
        assert float(row["forgetting_mean"]) == pytest.approx(np.mean([c["forgetting"] for c in cells]))
        bytes_ = np.mean([sum(e.get("bytes_per_client", 0) for e in c["history"]) for c in cells])
        assert float(row["bytes_per_client_mean"]) == pytest.approx(bytes_)
        assert float(row["wall_seconds_mean"]) == pytest.approx(np.mean([c["wall_seconds"] for c in cells]))
        assert row["paper_faa"] == ""  # the paper has no synthetic-text
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| synthetic-text | {method} | 0.5 |"))
        assert f"| {faa.mean():.2f} ± {faa.std(ddof=1):.2f} | - |" in line and f"| {bytes_ / 1e6:.3f} |" in line
        assert line.endswith("| 2 |")
    assert f"`python -m lab.benchmark {' '.join(grid.argv)}`" in md
    assert "CPU cores" in md and "GPU: " in md
    for name in ("faa.png", "accuracy_0.5.png"):
        assert (grid.out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_second_invocation_skips_every_finished_cell(grid, monkeypatch):
    before = mtimes(grid.out)
    forbid_runs(monkeypatch)
    start = time.perf_counter()
    rc, printed = bench_main(grid.argv)
    assert rc == 0, printed
    assert time.perf_counter() - start < 20
    assert mtimes(grid.out) == before
    assert printed.count("finished before, skipped") == 6 and "WARNING" not in printed


def test_a_changed_configuration_is_flagged_on_resume(grid, monkeypatch):
    forbid_runs(monkeypatch)
    rc, printed = bench_main(grid.argv + ["--set", "batch_size=8"])
    assert rc == 0 and printed.count("WARNING: it ran with other values of ['batch_size']") == 6


def test_a_deleted_cell_and_only_it_runs_again(grid, monkeypatch):
    target = grid.out / "cells/fedavg-lora/beta0.5/seed2"
    old = json.loads((target / "metrics.json").read_text())
    before = mtimes(grid.out)
    (target / "metrics.json").unlink()
    calls = []
    monkeypatch.setattr(
        cell_run, "run_inprocess", lambda config, **kw: calls.append(config) or run_inprocess(config, **kw)
    )
    rc, printed = bench_main(grid.argv)
    assert rc == 0, printed
    assert [(c.method, c.seed) for c in calls] == [("fedavg-lora", 2)]
    after = mtimes(grid.out)
    assert {d for d in after if after[d] != before[d]} == {target}
    new = json.loads((target / "metrics.json").read_text())
    assert (new["correct"], new["total"]) == (old["correct"], old["total"])  # same seed, same run


def test_report_only_rebuilds_the_tables_without_running(grid, monkeypatch):
    expected = (grid.out / "results.csv").read_text()
    for name in ("results.md", "results.csv", "faa.png", "accuracy_0.5.png"):
        (grid.out / name).unlink()
    forbid_runs(monkeypatch)
    rc, printed = bench_main(["--out", str(grid.out), "--report-only"])
    assert rc == 0, printed
    assert (grid.out / "results.csv").read_text() == expected
    md = (grid.out / "results.md").read_text()
    assert "Report written by: `python -m lab.benchmark --out" in md and "Grid command:" in md
    assert (grid.out / "faa.png").exists() and (grid.out / "accuracy_0.5.png").exists()


def test_an_unknown_method_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(TINY + ["--methods", "lorm,no-such-method", "--out", str(tmp_path / "g")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown method 'no-such-method'" in err and "'lorm'" in err and "'joint'" in err
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize(
    "method_config, message",
    [
        ({"no-such-method": {"lr": 1}}, "unknown method 'no-such-method'"),
        ({"lorm": {"beta=0.5": {"seed": 3}}}, "['seed'] are set by the grid"),
        ({"lorm": {"beta=half": {"lr": 1}}}, "expected 'beta=<number>'"),
        ({"lorm": {"learning_rate": 1}}, "unknown run configuration keys: ['learning_rate']"),
    ],
)
def test_a_bad_method_config_is_a_clear_error(tmp_path, capsys, method_config, message):
    (tmp_path / "m.json").write_text(json.dumps(method_config))
    with pytest.raises(SystemExit):
        bench.main(TINY + ["--method-config", str(tmp_path / "m.json"), "--out", str(tmp_path / "g")])
    assert message in capsys.readouterr().err


def test_a_variant_is_its_method_with_the_overrides_under_its_label():
    base = RunConfig.from_dict(preset("tiny"))
    overrides = {"lorm-vera@appendix": {"settings": {"vera": {"form": "appendix"}}}, "lorm-vera": {"lr": 0.02}}
    variant = plan.cell_config(base, "lorm-vera@appendix", 0.5, 0, overrides)
    plain = plan.cell_config(base, "lorm-vera", 0.5, 0, overrides)
    assert variant.method == plain.method == "lorm-vera"
    assert variant.settings["vera"] == {"form": "appendix"} and "vera" not in plain.settings
    assert (variant.lr, plain.lr) == (base.lr, 0.02)  # a variant takes only its own overrides
    assert "@" not in variant.run_id
    assert cell_run.Cell("lorm-vera@appendix", 0.5, 0, variant).dir(Path("g")).parts[2] == "lorm-vera@appendix"
    for bad in ("nosuch@x", "lorm@"):
        with pytest.raises(ValueError, match="unknown method"):
            plan.method_of(bad)


def test_a_joint_variant_is_the_upper_bound_with_its_own_overrides():
    """``joint@VARIANT``: one client, one task of every class, beta pinned, and the variant's overrides (the
    full-data joint needs its own learning rate)."""
    base = RunConfig.from_dict(preset("tiny"))
    overrides = {"joint@slow": {"lr": 1e-3}}
    cells = [plan.cell_config(base, "joint@slow", beta, 0, overrides) for beta in (1.0, 0.2)]
    assert cells[0].to_json() != base.to_json() and cells[0].lr == 1e-3
    for cell in cells:
        assert (cell.method, cell.num_clients, cell.num_tasks, cell.beta) == ("lorm", 1, 1, 1.0)
    assert json.loads(cells[0].to_json()) == json.loads(cells[1].to_json()) | {"run_id": cells[0].run_id}
    assert plan.cell_config(base, "joint", 0.5, 0, overrides).lr == base.lr


def test_overrides_apply_base_then_method_then_beta():
    base = RunConfig.from_dict({**preset("tiny"), "lr": 0.01})
    overrides = {"lorm": {"lr": 0.02, "extra": {"synthetic_test": 5}, "beta=0.5": {"lr": 0.03}}}
    at_half = plan.cell_config(base, "lorm", 0.5, 7, overrides)
    at_one = plan.cell_config(base, "lorm", 1.0, 7, overrides)
    assert (at_half.lr, at_one.lr, at_half.seed, at_half.beta) == (0.03, 0.02, 7, 0.5)
    assert at_half.settings["data"] == {
        **preset("tiny")["settings"]["data"],
        "synthetic_test": 5,
    }  # merged, not replaced
    assert plan.cell_config(base, "fedavg-lora", 0.5, 7, overrides).lr == 0.01


def test_a_presets_overrides_apply_only_to_a_grid_of_that_preset(tmp_path):
    """``preset=<name>``: a choice one protocol's held-out samples made (LoRM's head gamma at beta 0.2 on the full
    data) changes that preset's cells alone, after the method's own overrides; an unknown preset, a nested one or
    a grid key inside one is refused when the file loads."""
    overrides = {
        "lorm": {"lr": 0.02, "beta=0.2": {"gamma_head": 0.1}, "preset=tiny": {"beta=0.2": {"gamma_head": 0.7}}}
    }
    path = tmp_path / "m.json"
    path.write_text(json.dumps(overrides))
    assert plan.load_method_config(str(path)) == overrides
    base = RunConfig.from_dict(preset("tiny"))
    tiny = plan.cell_config(base, "lorm", 0.2, 0, overrides, "tiny")
    other = plan.cell_config(base, "lorm", 0.2, 0, overrides, "demo")
    assert (tiny.gamma_head, other.gamma_head, tiny.lr, other.lr) == (0.7, 0.1, 0.02, 0.02)
    assert plan.cell_config(base, "lorm", 0.5, 0, overrides, "tiny").gamma_head == base.gamma_head
    cells = plan.plan_grid(base, ["lorm"], [0.5, 0.2], [0], overrides, "tiny")
    assert [cell.config.gamma_head for cell in cells] == [base.gamma_head, 0.7]
    for bad, message in (
        ({"preset=nosuch": {}}, "unknown preset 'nosuch'"),
        ({"preset=tiny": {"preset=demo": {}}}, "cannot hold another preset's"),
        ({"preset=tiny": {"beta=0.2": {"seed": 3}}}, "set by the grid"),
        ({"preset=tiny": 0.7}, "expected an object"),
    ):
        path.write_text(json.dumps({"lorm": bad}))
        with pytest.raises(ValueError, match=message):
            plan.load_method_config(str(path))


def test_a_set_value_the_method_config_overrides_is_named(tmp_path, monkeypatch, capsys):
    # --set is the grid's base and the method config each method's own: where the two disagree the
    # cell runs the method config's value, and lorm-bench says so for that cell alone
    calls = []
    monkeypatch.setattr(cell_run, "run_inprocess", fake_run(calls=calls))
    (tmp_path / "m.json").write_text(json.dumps({"lorm": {"beta=0.2": {"gamma_head": 0.1}}}))
    argv = ["--methods", "lorm,fedavg-lora", "--betas", "0.5,0.2", "--set", "gamma_head=0.3", "--set", "lr=0.05"]
    rc = bench.main(TINY + argv + ["--method-config", str(tmp_path / "m.json"), "--out", str(tmp_path / "g")])
    assert rc == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "overridden" in line]
    assert warned == [
        "lorm-bench: --set gamma_head=0.3 is overridden by --method-config for lorm at beta 0.2, seed 42: "
        "gamma_head=0.1"
    ]
    assert sorted((c.method, c.beta, c.gamma_head) for c in calls) == [
        ("fedavg-lora", 0.2, 0.3),
        ("fedavg-lora", 0.5, 0.3),
        ("lorm", 0.2, 0.1),
        ("lorm", 0.5, 0.3),
    ]


def test_a_variant_the_method_config_does_not_define_is_refused_before_any_cell(tmp_path, monkeypatch, capsys):
    # NAME@VARIANT is the method with the variant's overrides: a label the config lacks (a typo, or the wrong config)
    # would run the plain method under the variant's name, so the grid refuses it and names the variants there are
    calls = []
    monkeypatch.setattr(cell_run, "run_inprocess", fake_run(calls=calls))
    (tmp_path / "m.json").write_text(json.dumps({"lorm@slow": {"lr": 0.01}, "lwf@fast": {"lr": 0.1}}))
    argv = ["--methods", "lorm,lorm@sloww", "--method-config", str(tmp_path / "m.json"), "--out", str(tmp_path / "g")]
    with pytest.raises(SystemExit) as exc:
        bench.main(TINY + argv)
    assert exc.value.code == 2 and calls == [] and not (tmp_path / "g" / "cells").exists()
    assert "--methods lorm@sloww: no such variant in --method-config (variants of lorm there: lorm@slow)" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):  # no method config at all: no variant exists
        bench.main(TINY + ["--methods", "lorm@slow", "--out", str(tmp_path / "h")])
    assert "variants of lorm there: none" in capsys.readouterr().err and calls == []
    argv[1] = "lorm,lorm@slow"
    assert bench.main(TINY + argv) == 0
    assert sorted((c.method, c.lr) for c in calls) == [("lorm", 0.01), ("lorm", preset("tiny")["lr"])]


def test_a_failed_cell_is_recorded_and_retried_on_the_next_invocation(tmp_path, monkeypatch):
    out = tmp_path / "g"
    argv = TINY + ["--methods", "lorm", "--seeds", "1,2,3", "--out", str(out)]
    monkeypatch.setattr(cell_run, "run_inprocess", fake_run(fail_seeds={2}))
    rc, printed = bench_main(argv)
    assert rc == 1 and "[2/3] lorm beta=0.5 seed=2: FAILED (RuntimeError: boom for seed 2)" in printed
    failed = out / "cells/lorm/beta0.5/seed2"
    assert "boom for seed 2" in (failed / "error.txt").read_text() and not (failed / "metrics.json").exists()
    assert (out / "cells/lorm/beta0.5/seed3/metrics.json").exists()  # the grid went on
    assert "`lorm/beta0.5/seed2`: RuntimeError: boom for seed 2" in (out / "results.md").read_text()
    assert read_csv(out / "results.csv")["lorm"]["seeds"] == "2"
    calls = []
    monkeypatch.setattr(cell_run, "run_inprocess", fake_run(calls=calls))
    rc, printed = bench_main(argv)
    assert rc == 0 and [c.seed for c in calls] == [2]
    assert not (failed / "error.txt").exists() and "Failed cells" not in (out / "results.md").read_text()


def test_a_cell_past_its_timeout_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(cell_run, "run_inprocess", fake_run(sleep_s=5))
    start = time.perf_counter()
    rc, printed = bench_main(TINY + ["--out", str(tmp_path / "g"), "--timeout", "0.3"])
    assert rc == 1 and time.perf_counter() - start < 4
    assert "CellTimeout" in (tmp_path / "g/cells/lorm/beta0.5/seed42/error.txt").read_text()


def test_lists_may_be_comma_or_space_separated(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(cell_run, "run_inprocess", fake_run(calls=calls))
    argv = ["--methods", "lorm", "fedavg-lora,lorm", "--betas", "1.0,0.5", "0.2", "--seeds", "1", "2"]
    rc, printed = bench_main(TINY + argv + ["--out", str(tmp_path / "g")])
    assert rc == 0, printed
    assert "12 cells (2 methods x 3 betas x 2 seeds)" in printed
    assert sorted((c.method, c.beta, c.seed) for c in calls) == sorted(
        (m, b, s) for m in ("lorm", "fedavg-lora") for b in (1.0, 0.5, 0.2) for s in (1, 2)
    )


def test_joint_runs_once_for_all_betas(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(cell_run, "run_inprocess", fake_run(calls=calls))
    out = tmp_path / "g"
    rc, printed = bench_main(TINY + ["--methods", "joint", "--betas", "1.0,0.5", "--seeds", "1", "--out", str(out)])
    assert rc == 0 and len(calls) == 1
    reused = json.loads((out / "cells/joint/beta0.5/seed1/metrics.json").read_text())
    assert (reused["beta"], reused["reused_from"]) == (0.5, "joint/beta1.0/seed1")
    assert set(read_csv(out / "results.csv")) == {"joint"} and (out / "accuracy_1.0.png").exists()
    # a later call for another beta finds the finished cell on disk: no run either
    rc, printed = bench_main(TINY + ["--methods", "joint", "--betas", "0.2", "--seeds", "1", "--out", str(out)])
    assert rc == 0 and len(calls) == 1 and "same run as joint/beta1.0/seed1, reused" in printed
    # RESULTS lists the run's time once: the copies name it, and the summary's key says why
    from lab.cost_table import costs
    from lab.rows import load_cells
    from lab.summary_table import summary

    cells = load_cells(out)
    table = costs({"g": cells})
    assert table.count("| the run of `joint/beta1.0/seed1`, reused | no: not run again |") == 2
    assert sum(1 for line in table.splitlines() if line.startswith("| `joint` |") and "reused" not in line) == 1
    assert "`joint`: a run at one β, copied to each β where it did not run" in summary(cells)


def test_a_frozen_head_runs_once_for_all_betas_unless_its_clients_draw(tmp_path, monkeypatch):
    """A frozen head's figures are the same under any split (tests/server/test_closed_form.py runs it at two betas):
    lorm-bench runs one beta and copies it to the others, saying why; with dropout views (drawn per client) it runs
    every beta."""
    calls = []
    monkeypatch.setattr(cell_run, "run_inprocess", fake_run(calls=calls))
    out = tmp_path / "g"
    grid = TINY + ["--methods", "ridge", "--betas", "1.0,0.5,0.2", "--seeds", "1", "--out", str(out)]
    rc, printed = bench_main(grid)
    assert rc == 0 and [c.beta for c in calls] == [1.0]
    reused = json.loads((out / "cells/ridge/beta0.2/seed1/metrics.json").read_text())
    assert (reused["beta"], reused["reused_from"], reused["reused_why"]) == (
        0.2,
        "ridge/beta1.0/seed1",
        "split-invariant",
    )
    rc, printed = bench_main(grid)  # finished: skipped, and its run's beta is no changed configuration
    assert rc == 0 and len(calls) == 1 and "WARNING" not in printed and printed.count("finished before, skipped") == 3
    from lab.rows import load_cells
    from lab.summary_table import summary

    assert (
        "`ridge`: a run at one β, copied to each β where it did not run: a frozen head's sums are the same"
        in summary(load_cells(out))
    )
    calls.clear()
    views = [*grid[:-1], str(tmp_path / "views"), "--set", "ridge.views=2"]
    rc, _ = bench_main(views)
    assert rc == 0 and sorted(c.beta for c in calls) == [0.2, 0.5, 1.0]


def test_the_paper_column_comes_from_the_paper_table(tmp_path):
    assert paper.paper_faa("clinc150", "joint", 0.2) == 95.53
    assert paper.paper_faa("clinc150", "ccvr", 0.5) == 38.13
    assert paper.paper_faa("cifar100", "lorm", 0.05) == 82.76
    assert paper.paper_faa("eurosat", "fedavg-lora", 1.0) == 53.14
    assert paper.paper_faa("imagenet-r", "lorm-avg-tasks", 0.5) == 75.08
    assert paper.paper_faa("clinc150", "fedavg-lora", 0.5) is None
    # Hand-made clinc150 cells with known FAA: 80, 82, 84 -> 82.00 ± 2.00 beside the paper's 82.58.
    for seed, faa in zip((1, 2, 3), (80.0, 82.0, 84.0)):
        cell = tmp_path / f"cells/lorm/beta0.5/seed{seed}"
        cell.mkdir(parents=True)
        (cell / "metrics.json").write_text(
            json.dumps(
                {
                    "method": "lorm",
                    "beta": 0.5,
                    "seed": seed,
                    "mode": "inprocess",
                    "config": {"dataset": "clinc150"},
                    "accuracy": [[90.0], [faa - 10, faa + 10]],
                    "faa": faa,
                    "faa_weighted": faa + 1,
                    "forgetting": 5.0,
                    "bytes_per_client": 2.5e6,
                    "wall_seconds": 60.0 * seed,
                    "history": [],
                }
            )
        )
    rc, _ = bench_main(["--out", str(tmp_path), "--report-only"])
    row = read_csv(tmp_path / "results.csv")["lorm"]
    assert rc == 0 and (float(row["faa_mean"]), float(row["faa_std"]), float(row["paper_faa"])) == (82.0, 2.0, 82.58)
    md = (tmp_path / "results.md").read_text()
    assert "| lorm | 82.00 ± 2.00 [82.58] |" in md
    assert "| clinc150 | lorm | 0.5 | 82.00 ± 2.00 | 82.58 | 83.00 | 5.00 | 2.500 | 2.0 min | 3 |" in md


def test_a_resumed_cell_counts_the_time_of_every_part(tmp_path):
    """A cell that went on from a committed step: its wall time is the last part's; the table takes the
    engine's summed computing time (``seconds``) instead. 600 s (resumed, 60 s last part) and 120 s -> 6.0 min."""
    for seed, extra in ((0, {"resumes": 1, "seconds": 600.0, "wall_seconds": 60.0}), (1, {"wall_seconds": 120.0})):
        cell = tmp_path / f"cells/lorm/beta0.5/seed{seed}"
        cell.mkdir(parents=True)
        metrics = {"method": "lorm", "beta": 0.5, "seed": seed, "mode": "inprocess", "config": {"dataset": "x"}}
        metrics |= {"accuracy": [[90.0]], "faa": 90.0, "faa_weighted": 90.0, "forgetting": 0.0, "history": []}
        (cell / "metrics.json").write_text(json.dumps(metrics | {"bytes_per_client": 1e6, "seconds": 110.0} | extra))
    rc, _ = bench_main(["--out", str(tmp_path), "--report-only"])
    assert rc == 0 and float(read_csv(tmp_path / "results.csv")["lorm"]["wall_seconds_mean"]) == 360.0
    assert (
        "| x | lorm | 0.5 | 90.00 ± 0.00 | - | 90.00 | 0.00 | 1.000 | 6.0 min | 2 |"
        in (tmp_path / "results.md").read_text()
    )


@pytest.mark.slow
def test_a_distributed_cell_gives_the_inprocess_result(tmp_path, monkeypatch):
    """The first attempt's coordinator is killed after its second merge, before committing it; the grid
    run again goes on from the coordinator's state with fresh clients, to the in-process result."""
    out = tmp_path / "g"
    args = TINY + ["--methods", "lorm", "--seeds", "3", "--mode", "distributed", "--out", str(out), "--timeout", "300"]
    monkeypatch.setenv("LORM_FAULT", "merge.aggregated:2")  # read by the processes the cell starts
    rc, printed = bench_main(args)
    assert rc == 1 and "lorm beta=0.5 seed=3: FAILED" in printed, printed
    monkeypatch.delenv("LORM_FAULT")
    rc, printed = bench_main(args)
    assert rc == 0 and "going on from its last committed step (distributed)" in printed, printed
    cell = out / "cells/lorm/beta0.5/seed3"
    assert "resumed run" in (cell / "log.txt").read_text()
    m = json.loads((cell / "metrics.json").read_text())
    assert m["mode"] == "distributed" and (cell / "run/state").is_dir() and (cell / "run/results/adapter").is_dir()
    reference = run_inprocess(RunConfig.from_dict(m["config"]))
    assert (m["correct"], m["total"]) == (reference.matrix.correct, reference.matrix.total)
    assert m["bytes_per_client"] == sum(e.get("bytes_per_client", 0) for e in reference.history)
    assert "lorm" in read_csv(out / "results.csv")


def test_the_papers_per_method_settings_make_each_cell_one_command():
    """bench/paper/<dataset>.json: the appendix's hyperparameters of the competitors this project has,
    read by lorm-bench --method-config over the preset paper-<dataset>-b<beta>."""
    from pathlib import Path

    from common.run.presets import PRESETS

    root = Path(__file__).resolve().parents[2] / "bench" / "paper"
    datasets = {name.split("-b")[0].removeprefix("paper-") for name in PRESETS if name.startswith("paper-")}
    assert {p.stem for p in root.glob("*.json")} == datasets
    grid = json.loads((root / "imagenet-r.json").read_text())
    base = RunConfig.from_dict(PRESETS["paper-imagenet-r-b0.05"])
    lwf = plan.cell_config(base, "lwf", 0.05, 0, grid)
    assert (lwf.lr, lwf.lora_lr, lwf.method) == (3e-5, 3e-5, "lwf")  # the appendix's ImageNet-R table
    regmean = plan.cell_config(base, "regmean", 0.05, 0, grid)
    assert (regmean.lr, regmean.gamma_backbone, regmean.gamma_head) == (1e-5, 0.1, 0.1)
    ewc = plan.cell_config(
        RunConfig.from_dict(PRESETS["paper-cifar100-b0.5"]),
        "ewc",
        0.5,
        0,
        json.loads((root / "cifar100.json").read_text()),
    )
    assert (ewc.lr, ewc.fisher) == (1e-5, "reference")  # the paper's code's Fisher estimator
    imagenet_a = json.loads((root / "imagenet-a.json").read_text())
    l2p = plan.cell_config(RunConfig.from_dict(PRESETS["paper-imagenet-a-b0.2"]), "l2p", 0.2, 0, imagenet_a)
    assert (l2p.lr, l2p.lora_lr, l2p.method) == (0.3, 0.3, "l2p")  # prompts and head at the table's lr
    from common.methods.pilora import PiLoraSettings

    pilora = plan.cell_config(base, "pilora", 0.05, 0, grid)
    assert (pilora.lr, pilora.lora_lr) == (2e-2, 1e-4)
    # the paper's code's re-weighting (a factor 0.2, where PILoRA's own divides by 0.2: the default 5)
    assert pilora.section(PiLoraSettings).soft_temp == 0.2 != PiLoraSettings().soft_temp


def test_an_inprocess_cell_records_its_own_peak_memory(tmp_path):
    """``peak_rss_bytes``: the cell's peak resident memory, not the process's: 1.2 GB held and freed before the
    cell does not count (the peak is reset first)."""
    if not cell_run.reset_peak_rss():
        pytest.skip("this system cannot reset a process's peak resident memory")
    ballast = bytearray(1_200_000_000)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page, so that it is resident
    held = cell_run.peak_rss_bytes()
    del ballast
    rc, _ = bench_main(TINY + ["--methods", "lorm", "--seeds", "1", "--betas", "0.5", "--out", str(tmp_path)])
    peak = json.loads((tmp_path / "cells/lorm/beta0.5/seed1/metrics.json").read_text())["peak_rss_bytes"]
    assert rc == 0 and held is not None and held > 1_200_000_000
    assert 50_000_000 < peak < held - 600_000_000  # a tiny model's run: some tens or hundreds of MB


def test_cells_from_several_machines_name_each_rows_machine(tmp_path):
    """A table merged from a CPU host's and a GPU host's cells numbers the machines and names, per row,
    the ones its cells ran on (a wall time means nothing without its machine); one machine: no column."""
    cpu = {"system": "Linux x86_64", "cpu": "AMD EPYC", "cores": 2, "usable_cores": 2, "gpu": "none"}
    gpu = cpu | {"cpu": "Intel Xeon", "cores": 16, "usable_cores": 16, "gpu": "NVIDIA H100 80GB HBM3"}
    versions = {"python": "3.12.3", "torch": "2.11.0"}
    for method, seed, machine in (("lorm", 0, cpu), ("lorm", 1, gpu), ("regmean", 0, gpu)):
        cell = tmp_path / f"cells/{method}/beta0.5/seed{seed}"
        cell.mkdir(parents=True)
        metrics = {"method": method, "beta": 0.5, "seed": seed, "mode": "inprocess", "config": {"dataset": "x"}}
        metrics |= {"accuracy": [[90.0]], "faa": 90.0, "faa_weighted": 90.0, "forgetting": 0.0, "history": []}
        metrics |= {"bytes_per_client": 1e6, "wall_seconds": 60.0, "machine": machine | versions}
        (cell / "metrics.json").write_text(json.dumps(metrics))
    rc, _ = bench_main(["--out", str(tmp_path), "--report-only"])
    md = (tmp_path / "results.md").read_text()
    assert rc == 0 and "- Machine 1: Linux x86_64, AMD EPYC, 2 CPU cores (2 usable), GPU: none" in md
    assert "- Machine 2: Linux x86_64, Intel Xeon, 16 CPU cores (16 usable), GPU: NVIDIA H100 80GB HBM3" in md
    assert "| x | lorm | 0.5 | 90.00 ± 0.00 | - | 90.00 | 0.00 | 1.000 | 60.0 s | 2 | 1, 2 |" in md
    assert "| x | regmean | 0.5 | 90.00 | - | 90.00 | 0.00 | 1.000 | 60.0 s | 1 | 2 |" in md
    (tmp_path / "cells/lorm/beta0.5/seed0/metrics.json").unlink()
    rc, _ = bench_main(["--out", str(tmp_path), "--report-only"])
    md = (tmp_path / "results.md").read_text()
    assert rc == 0 and "- Machine: Linux x86_64, Intel Xeon" in md and " machine |" not in md
    assert "| x | regmean | 0.5 | 90.00 | - | 90.00 | 0.00 | 1.000 | 60.0 s | 1 |\n" in md


def test_every_variant_of_the_clinc150_grid_is_a_valid_cell_at_every_beta():
    """bench/clinc150_methods.json, which the grid scripts run for hours: every label names a known method and
    every override a known key, at each of the table's betas, so a typo fails here and not mid-grid."""
    method_config = plan.load_method_config(str(provenance.ROOT / "bench" / "clinc150_methods.json"))
    assert "lorm" in method_config and any("@" in label for label in method_config)
    for preset_name in ("cpu-clinc150-quick", "cpu-clinc150-full"):
        base = RunConfig.from_dict(preset(preset_name))
        for label in method_config:
            for beta in (1.0, 0.5, 0.2):
                cell = plan.cell_config(base, label, beta, 0, method_config, preset_name)
                assert cell.method == ("lorm" if label.startswith("joint") else plan.method_of(label))
    # LoRM's head gamma (and its ablations', which share its head): 0.5 but at beta 0.2 on the full data, where
    # its held-out samples chose 0.7 (docs/results/choices: gamma_head and gamma_head_full); the appendix's variant
    # keeps its 0.1 at beta 0.2 on both, and lorm@gamma-0.5 (the grid's before that choice) 0.5 everywhere
    gammas = {
        (label, name, beta): plan.cell_config(
            RunConfig.from_dict(preset(name)), label, beta, 0, method_config, name
        ).gamma_head
        for label in ("lorm", "lorm-b-only", "lorm-avg-tasks", "lorm-seq", "lorm@appendix-gamma", "lorm@gamma-0.5")
        for name in ("cpu-clinc150-quick", "cpu-clinc150-full")
        for beta in (1.0, 0.5, 0.2)
    }
    appendix = {key: 0.1 for key in gammas if key[0] == "lorm@appendix-gamma" and key[2] == 0.2}
    full = {
        key: 0.7
        for key in gammas
        if key[1:] == ("cpu-clinc150-full", 0.2) and key not in appendix and key[0] != "lorm@gamma-0.5"
    }
    assert gammas == {key: 0.5 for key in gammas} | appendix | full


@pytest.mark.slow  # the grid's child processes: 58 s of a worker on 2 cores; the cells' runner is tested in process
def test_jobs_run_cells_side_by_side_in_child_processes_with_the_same_results(grid, tmp_path):
    """``--jobs 3``: each cell in its own lorm-bench child (its output in bench.log), the same metrics as one
    after another in one process (the module's grid, seed 1); joint's twin at another beta is reused, not run."""
    out = tmp_path / "jobs"
    argv = TINY + ["--methods", "lorm,joint", "--betas", "0.5,1.0", "--seeds", "1", "--out", str(out), "--jobs", "3"]
    rc, printed = bench_main(argv + ["--method-config", grid.argv[grid.argv.index("--method-config") + 1]])
    assert rc == 0 and "3 cells to run, up to 3 at a time" in printed, printed
    ran = ["lorm/beta0.5/seed1", "lorm/beta1.0/seed1", "joint/beta0.5/seed1"]
    assert all((out / "cells" / name / "bench.log").exists() for name in ran)
    reused = json.loads((out / "cells/joint/beta1.0/seed1/metrics.json").read_text())
    assert reused["reused_from"] == "joint/beta0.5/seed1" and not (out / "cells/joint/beta1.0/seed1/bench.log").exists()
    for name in ("lorm/beta0.5/seed1", "joint/beta0.5/seed1"):
        mine = json.loads((out / "cells" / name / "metrics.json").read_text())
        theirs = json.loads((grid.out / "cells" / name / "metrics.json").read_text())
        assert (mine["accuracy"], mine["faa"], mine["bytes_per_client"]) == (
            theirs["accuracy"],
            theirs["faa"],
            theirs["bytes_per_client"],
        )
    assert "| lorm |" in (out / "results.md").read_text()


@pytest.mark.long(18)
def test_a_failed_child_is_named_with_its_twins_and_the_others_finish(tmp_path):
    """A child that exits non-zero is reported failed with where to look, and so is its twin (joint at another
    beta: it would have reused that run), which no process starts; the grid goes on with the rest."""
    base = RunConfig.from_dict(preset("tiny"))
    cells = plan.plan_grid(base, ["lorm", "joint"], [0.5, 1.0], [0], {})
    said: list[str] = []

    def argv(cell):  # lorm at beta 1.0 and joint are given a beta they refuse
        bad = cell.method == "joint" or cell.beta == 1.0
        return ["--preset", "tiny", "--set", "num_tasks=1", "--set", "rounds_per_task=1", "--out", str(tmp_path)] + [
            "--no-report",
            "--methods",
            cell.method,
            "--betas",
            "not-a-number" if bad else str(cell.beta),
            "--seeds",
            "0",
        ]

    failed = runner.run_children(cells, tmp_path, "inprocess", 2, argv, say=said.append, poll_s=0.1)
    assert sorted(failed) == ["joint/beta0.5/seed0", "joint/beta1.0/seed0", "lorm/beta1.0/seed0"]
    assert (tmp_path / "cells/lorm/beta0.5/seed0/metrics.json").exists()
    assert sum(" started (process " in line for line in said) == 3  # joint's twin is never started
    assert any(line.startswith("lorm/beta1.0/seed0: FAILED (exit 2); see") and "bench.log" in line for line in said)
    assert "expected a list of float" in (tmp_path / "cells/lorm/beta1.0/seed0/bench.log").read_text()


def test_a_terminated_jobs_grid_stops_its_children(tmp_path):
    """SIGTERM to a ``--jobs`` grid: it stops every child before it exits (none left running on the GPU)."""
    argv = ["--preset", "tiny", "--set", "rounds_per_task=200", "--methods", "lorm", "--betas", "0.5,1.0"]
    parent = subprocess.Popen(
        [sys.executable, "-m", "lab.benchmark", *argv, "--out", str(tmp_path), "--jobs", "2"],
        cwd=provenance.ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": project_pythonpath()},
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(pids) < 2 and time.monotonic() < deadline:
            line = parent.stdout.readline()
            if not line:
                break
            pids += [int(pid) for pid in re.findall(r"started \(process (\d+);", line)]
        assert len(pids) == 2, "the children did not start"
        time.sleep(1.0)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        parent.kill()
        parent.wait()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_cell_from_before_a_configuration_field_existed_is_the_same_configuration(grid, tmp_path, monkeypatch):
    """A field added to RunConfig since a cell ran (its stored configuration lacks it) counts at its default:
    the cell is skipped without a warning, and it is still a twin that a cell at another beta reuses."""
    out = tmp_path / "grid"
    shutil.copytree(grid.out, out)
    for path in (out / "cells").glob("*/*/*/metrics.json"):
        metrics = json.loads(path.read_text())
        del metrics["config"]["deterministic"]  # a field this grid's cells predate
        path.write_text(json.dumps(metrics))
    argv = [str(out) if arg == str(grid.out) else arg for arg in grid.argv]
    forbid_runs(monkeypatch)

    rc, printed = bench_main(argv)
    assert rc == 0 and printed.count("finished before, skipped") == 6 and "WARNING" not in printed, printed

    beta = argv.index("--betas") + 1
    rc, printed = bench_main(argv[:beta] + ["1.0"] + argv[beta + 1 :] + ["--methods", "joint"])
    assert rc == 0 and printed.count("same run as joint/beta0.5/seed") == 2, printed


def test_what_ran_beside_a_cell_is_recorded_and_reaches_the_cost_table(tmp_path):
    """``--beside``: every cell records what else ran on its host (a --jobs child too), and RESULTS' cost table
    shows it where it would say 'not recorded'."""
    from lab.cost_table import costs

    argv = TINY + ["--methods", "lorm", "--seeds", "1", "--betas", "0.5", "--out", str(tmp_path)]
    rc, _ = bench_main(argv + ["--beside", "one 1-thread cell"])
    cell = json.loads((tmp_path / "cells/lorm/beta0.5/seed1/metrics.json").read_text())
    assert rc == 0 and cell["beside"] == "one 1-thread cell"
    child = bench.child_argv(
        bench.build_parser().parse_args(argv + ["--beside", "x"]), cell_run.Cell("lorm", 0.5, 1, None)
    )
    assert child[child.index("--beside") + 1] == "x"
    assert "| one 1-thread cell |" in costs({"tiny": [cell]})


def test_a_setting_only_the_listed_methods_take_is_checked_against_them(tmp_path):
    """``--methods ncm --set dp.epsilon=1``: the preset's method (lorm) would refuse a central budget, but the grid's
    cells are ncm's, which take it; a cell of a method that refuses it still fails its own check, by name."""
    argv = TINY + ["--methods", "ncm", "--seeds", "1", "--betas", "0.5", "--set", "dp.epsilon=1", "--set", "dp.seed=0"]
    rc, printed = bench_main(argv + ["--out", str(tmp_path / "ok")])
    cell = json.loads((tmp_path / "ok/cells/ncm/beta0.5/seed1/metrics.json").read_text())
    assert rc == 0 and cell["privacy"]["epsilon"] > 0
    with pytest.raises(SystemExit):
        bench_main(TINY + ["--methods", "ncm,lorm", "--set", "dp.epsilon=1", "--out", str(tmp_path / "no")])
