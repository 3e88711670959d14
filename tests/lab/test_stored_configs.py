"""A stored cell's configuration read as the code that ran it read it: a setting it left unset at the default of its
code (``lab.provenance.DEFAULT_CHANGES``), settings without effect left out; a twin is reused only where the
two runs are the same."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil

import pytest

import lab.benchmark as bench
import lab.cells as cells
import lab.provenance as provenance
import lab.twins as twins
from common.run.config import RunConfig
from lab.provenance import DEFAULT_CHANGES

LAMBDA_RULE = next(c for c in DEFAULT_CHANGES if (c.section, c.key) == ("ridge", "lambda_rule"))
BEFORE_RULE = "14fa52168413b2ef65b7e202acc5f8a54639294b"  # the parent of LAMBDA_RULE's commit
TINY = ["--preset", "tiny", "--set", "num_tasks=2", "--set", "rounds_per_task=1"]
ENSEMBLE = ["--methods", "ridge", "--set", "ridge.blocks=2", "--set", "ridge.rp_dim=32", "--seeds", "1"]
HISTORY = pytest.mark.skipif(
    provenance._includes("HEAD", LAMBDA_RULE.commit) is not True
    or provenance._includes("HEAD", BEFORE_RULE) is not True,
    reason="needs the project's git history (a full clone)",
)


def bench_main(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(argv)
    return rc, out.getvalue()


def stored(config: RunConfig, code: object = dataclasses.MISSING) -> dict:
    """A cell's metrics as lorm-bench writes them, with its ``code`` record (left out: a cell from before it)."""
    metrics = {"config": json.loads(config.to_json()), "mode": "inprocess"}
    return metrics if code is dataclasses.MISSING else metrics | {"code": code}


def stop(config: RunConfig, **kwargs) -> None:
    raise RuntimeError("stopped: this test runs no second cell")


def ridge(**settings) -> RunConfig:
    return RunConfig(method="ridge", settings={"ridge": {"rp_dim": 32, **settings}})


@HISTORY
def test_a_cell_of_older_code_is_read_with_the_defaults_it_had():
    older, newer = {"commit": BEFORE_RULE, "changed": False}, {"commit": LAMBDA_RULE.commit, "changed": False}
    assert provenance.defaults_then(stored(ridge(blocks=2), older))[("ridge", "lambda_rule")] == "members"
    assert ("ridge", "lambda_rule") not in provenance.defaults_then(stored(ridge(blocks=2), newer))
    assert provenance.defaults_then(stored(ridge(blocks=2), provenance.code_version())) == {}  # this code
    # before lorm-bench recorded the code: the changes made since the record began are known, earlier ones not
    legacy = provenance.defaults_then(stored(ridge(blocks=2)))
    assert legacy[("ridge", "lambda_rule")] == "members" and legacy[("robust", "kappa")].startswith("unknown")
    # a commit git does not know, or a cell that ran outside a checkout: nothing is known
    assert all(
        value.startswith("unknown")
        for code in ({"commit": "0" * 40, "changed": False}, None)
        for value in provenance.defaults_then({"config": {}, "code": code}).values()
    )


@HISTORY
def test_the_twin_is_the_run_with_the_same_rule_not_the_same_unset_key():
    """An ensemble cell of code from before ``lambda_rule`` defaulted to ``auto`` ran ``members``: it is the twin of a
    planned ``members`` run (a frozen head: another beta), not of a planned run that leaves the rule unset."""
    old = stored(ridge(blocks=2), {"commit": BEFORE_RULE, "changed": False})
    members = twins._twin_key(json.loads(ridge(blocks=2, lambda_rule="members").to_json()))
    unset = twins._twin_key(json.loads(ridge(blocks=2).to_json()))
    assert twins.stored_twin_key(old) == members != unset
    assert twins._config_changes(old, ridge(blocks=2)) == ["settings.ridge.lambda_rule"]
    assert twins._config_changes(old, ridge(blocks=2, lambda_rule="members")) == []


def test_a_setting_without_effect_and_a_section_the_run_does_not_read_are_not_compared():
    now = provenance.code_version()
    # one head: every lambda rule is the same head
    assert twins._config_changes(stored(ridge(lambda_rule="members"), now), ridge()) == []
    assert twins._config_changes(stored(ridge(blocks=2, lambda_rule="members"), now), ridge(blocks=2)) == [
        "settings.ridge.lambda_rule"
    ]
    # the guard off: its bound is read by no one; on, it is compared
    guard = {"kappa": 3.0}
    off = RunConfig(method="ridge", settings={"robust": guard})
    assert twins._config_changes(stored(off, now), RunConfig(method="ridge")) == []
    on = RunConfig(method="ridge", settings={"robust": {**guard, "enabled": True}})
    both = RunConfig(method="ridge", settings={"robust": {"enabled": True}})
    assert twins._config_changes(stored(on, now), both) == ["settings.robust.kappa"]
    # another method's section
    other = {"config": {**json.loads(RunConfig(method="ridge").to_json()), "settings": {"pilora": {"soft_temp": 1}}}}
    assert twins._config_changes(other | {"code": now}, RunConfig(method="ridge")) == []
    # an explicit default is the default
    assert twins._config_changes(stored(ridge(blocks=2, lambda_rule="auto"), now), ridge(blocks=2)) == []


@HISTORY
def test_lorm_bench_copies_a_frozen_head_of_older_code_only_to_the_rule_it_ran(tmp_path, monkeypatch):
    """End to end: a real ensemble cell whose record says it ran before ``lambda_rule`` defaulted to ``auto``; a grid
    that names ``members`` copies it to another beta, one that leaves the rule unset runs its own cell."""
    out = tmp_path / "g"
    rc, printed = bench_main(TINY + ENSEMBLE + ["--betas", "0.5", "--out", str(out)])
    assert rc == 0, printed
    path = out / "cells/ridge/beta0.5/seed1/metrics.json"
    metrics = json.loads(path.read_text())
    assert "lambda_rule" not in metrics["config"]["settings"]["ridge"]
    path.write_text(json.dumps(metrics | {"code": {"commit": BEFORE_RULE, "changed": False}}))
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)

    ran = []
    monkeypatch.setattr(cells, "run_inprocess", lambda config, **kw: ran.append(config) or stop(config))
    members = ["--set", "ridge.lambda_rule=members", "--betas", "1.0", "--out", str(copy)]
    rc, printed = bench_main(TINY + ENSEMBLE + members)
    assert rc == 0 and not ran and "same run as ridge/beta0.5/seed1, reused" in printed, printed
    rc, printed = bench_main(TINY + ENSEMBLE + ["--betas", "0.2", "--out", str(copy)])
    assert rc == 1 and len(ran) == 1 and "reused" not in printed  # the default rule: a run of its own (stopped)
    rc, printed = bench_main(TINY + ENSEMBLE + ["--betas", "0.5", "--out", str(copy)])
    assert "WARNING: it ran with other values of ['settings.ridge.lambda_rule']" in printed
