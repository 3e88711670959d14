"""A public prior in a run: ``lorm-prior`` writes it from the run's own backbone, the coordinator sends it in every
features step and evaluation, the clients apply only the run's (by digest) before the clip, a restarted coordinator
needs no copy of the file, and the export serves with it.

The reference for the clients' statistics is computed here with generic torch from the backbone's features:
``(x - m) W`` and the class sums over the union of the shards."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from client.features import extract
from client.plans import PlanRefused
from client.prior_cli import main as lorm_prior
from client.runtime import build_runtime
from common.aggregation.declared import feature_stats_of
from common.privacy.public_prior import PRIOR_BASIS, PRIOR_MEAN, fit_prior, read_prior, write_prior
from common.run.config import RunConfig
from common.wire.tensors import STAT
from engine.simulation import run_inprocess
from serve.model import Classifier, ExportError
from server.strategies import make_strategy

from tolerance import assert_close_to_dtype

TINY = dict(
    num_clients=2,
    num_tasks=2,
    beta=1.0,
    seed=3,
    threads=1,
    backbone="tiny-bert",
    extra={"synthetic_classes": 6, "synthetic_train": 30, "synthetic_test": 6},
)


def with_prior(method: str, path, digest: str, k: int, **settings) -> RunConfig:
    own = {"prior_digest": digest, "prior_k": k, "prior_file": str(path), **settings}
    return RunConfig(**{**TINY, "method": method, "settings": {method.removeprefix("lorm-"): own}})


@pytest.fixture(scope="module")
def prior_file(tmp_path_factory):
    """A prior of the tiny backbone's features fitted on random rows (what it was fitted on does not matter here)."""
    path = tmp_path_factory.mktemp("prior") / "prior.safetensors"
    width = build_runtime(RunConfig(**{**TINY, "method": "ridge"})).spec.feature_dim
    public = torch.randn(300, width, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    prior = fit_prior(public, 5, shrink=1.0)
    return path, write_prior(path, prior, {"corpus": "random"}), prior


def test_clients_sum_the_prior_applied_features_and_the_coordinator_sends_it_in_every_plan(prior_file):
    path, digest, prior = prior_file
    config = with_prior("ridge", path, digest, 5)
    runtime = build_runtime(config)
    strategy = make_strategy(config, runtime.spec)
    workers = [runtime.worker(i, f"c{i}") for i in range(config.num_clients)]
    strategy.begin_task(0)
    ((phase, round_),) = strategy.steps(0)
    plan = strategy.configure(0, round_, phase)
    assert plan.tensors[PRIOR_MEAN].equal(prior.mean) and plan.tensors[PRIOR_BASIS].equal(prior.basis)
    updates = [w.update(plan) for w in workers]
    mapped = feature_stats_of(config).features
    for worker, update in zip(workers, updates):
        shard = worker.shards[0]
        x = (extract(runtime.model, runtime.train, shard, runtime.device, mapped) - prior.mean) @ prior.basis
        lo, hi = plan.class_range
        one_hot = torch.nn.functional.one_hot(runtime.train.labels[shard] - lo, hi - lo).to(torch.float64)
        assert_close_to_dtype(update.tensors[f"{STAT}/class_sum"], one_hot.T @ x, torch.float64, terms=x.numel())
    fold = strategy.fold(plan)
    for update in updates:
        fold.aggregator.fold(update)
    fold.finish()
    evaluation = strategy.eval_plan(0)
    assert evaluation.tensors[PRIOR_BASIS].equal(prior.basis) and strategy.head_w.shape[1] == 5
    assert strategy.step_report(plan)["public_prior"] == {"corpus": "random", "shrink": 1.0, "prior_digest": digest}


def test_a_plan_with_another_prior_is_refused_before_anything_is_computed(prior_file):
    path, digest, prior = prior_file
    config = with_prior("ncm", path, digest, 5)
    runtime = build_runtime(config)
    strategy = make_strategy(config, runtime.spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, strategy.steps(0)[0][0])
    rotated = prior.basis.flip(1)  # the same numbers, the directions reordered: same shapes, another digest
    plan.tensors = plan.tensors | {PRIOR_BASIS: rotated.contiguous()}
    with pytest.raises(PlanRefused, match="not the run's"):
        runtime.worker(0, "c0").update(plan)
    plan.tensors = {k: t for k, t in plan.tensors.items() if not k.startswith("prior/")}
    with pytest.raises(PlanRefused, match="holds none"):
        runtime.worker(0, "c0").update(plan)


def test_the_coordinator_refuses_a_file_of_another_prior_and_restarts_from_its_state_alone(prior_file, tmp_path):
    path, digest, prior = prior_file
    other = tmp_path / "other.safetensors"
    write_prior(other, fit_prior(torch.randn(50, prior.mean.numel(), dtype=torch.float64), 5, 1.0), {})
    config = with_prior("ridge", other, digest, 5)
    spec = build_runtime(config).spec
    with pytest.raises(ValueError, match="digest"):
        make_strategy(config, spec).configure(0, 0, make_strategy(config, spec).steps(0)[0][0])
    first = make_strategy(with_prior("ridge", path, digest, 5), spec)
    phase = first.steps(0)[0][0]
    first.configure(0, 0, phase)
    state = first.state_tensors()
    moved = with_prior("ridge", tmp_path / "gone.safetensors", digest, 5)  # restarted elsewhere: no copy of the file
    again = make_strategy(moved, spec)
    again.load_state_tensors(state)
    assert again.configure(0, 0, phase).tensors[PRIOR_BASIS].equal(prior.basis)
    with pytest.raises(ValueError, match="no copy of it|cannot be read"):
        make_strategy(moved, spec).configure(0, 0, phase)
    with pytest.raises(ValueError, match="frozen backbone"):
        make_strategy(with_prior("lorm-ridge", path, digest, 5), spec)


def test_lorm_prior_writes_the_runs_prior_and_a_run_with_it_serves_only_with_its_own(tmp_path, capsys):
    out = tmp_path / "prior.safetensors"
    flags = ["--set", f"backbone={TINY['backbone']}", "--set", "method=ridge", "--set", "threads=1"]
    assert lorm_prior([*flags, "--out", str(out), "--size", "200", "--k", "6"]) == 0
    printed = json.loads(capsys.readouterr().out)
    prior, statement = read_prior(out, printed["digest"])
    assert statement["corpus"] == "chitchat" and statement["size"] == 200 and statement["k"] == 6
    assert printed["set"] == [f"ridge.prior_digest={printed['digest']}", "ridge.prior_k=6"]
    config = with_prior("ridge", out, printed["digest"], 6, rp_dim=24)  # the prior, then the projection
    results = tmp_path / "results"
    run_inprocess(config, results_dir=results)
    metrics = json.loads((results / "metrics.json").read_text())
    assert metrics["public_prior"]["digest"] == statement["digest"]  # the corpus's texts
    assert metrics["public_prior"]["prior_digest"] == printed["digest"]
    served = Classifier(results, device="cpu")
    assert len(served.predict(["hello there", "what is the time"])) == 2
    tampered = tmp_path / "tampered"
    shutil.copytree(results, tampered)
    scoring = load_file(str(tampered / "scoring.safetensors"))
    scoring[PRIOR_BASIS] = (scoring[PRIOR_BASIS] * 2).contiguous()
    save_file(scoring, str(tampered / "scoring.safetensors"), metadata={"format": "pt", "lorm.kind": "scoring"})
    with pytest.raises(ExportError, match="prior"):
        Classifier(tampered, device="cpu")
