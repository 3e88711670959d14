"""The distributed system: coordinator and clients as separate processes on loopback."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from safetensors.torch import load_file

from client.runtime import build_runtime
from common.run.config import RunConfig
from engine.simulation import run_inprocess
from server.export import export_adapter

CONFIG = RunConfig(
    run_id="dist",
    num_clients=3,
    num_tasks=2,
    rounds_per_task=2,
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-3,
    threads=1,
    seed=9,
    extra={"synthetic_classes": 8, "synthetic_train": 30, "synthetic_test": 10},
)
# A run over the wire costs about 25 s of CPU, most of it its four processes importing torch and transformers:
# variants whose wire fields another test here already sends run with -m slow.
SLOW = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The in-process run of CONFIG, exported the way the coordinator exports."""
    result = run_inprocess(CONFIG)
    out = tmp_path_factory.mktemp("inprocess")
    spec = build_runtime(CONFIG).spec
    export_adapter(out / "adapter", result.adapter, spec, rank_per_task=CONFIG.rank)
    return result, load_file(str(out / "adapter" / "adapter_model.safetensors"))


def finished(c) -> tuple[dict, dict]:
    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    return metrics, load_file(str(c.run_dir / "results" / "adapter" / "adapter_model.safetensors"))


def assert_same_as_reference(c, reference) -> None:
    result, adapter = reference
    metrics, got = finished(c)
    assert metrics["correct"] == result.matrix.correct and metrics["total"] == result.matrix.total
    assert got.keys() == adapter.keys()
    for key in adapter:
        assert torch.equal(got[key], adapter[key]), key


def start(c, clients=range(3)):
    server = c.server()
    server.wait_for("serving on")
    return server, [c.client(i) for i in clients]


def test_three_clients_two_tasks_identical_to_inprocess_one_killed_mid_round(cluster, reference):
    """Client 1 is SIGKILLed once it has pushed round 0 and started again under the same identity (the same
    shard): the run's results are still bit-identical to the in-process run's, with every output a clean
    run writes (one run serves both claims: its four processes are most of a test's time)."""
    c = cluster(CONFIG.to_json())
    server, clients = start(c)
    clients[1].wait_for(r"task 0 round 0 train B")  # it has pushed round 0 and is into round 1
    clients[1].proc.send_signal(signal.SIGKILL)
    clients[1].wait()
    again = c.client(1)  # same identity, same shard
    again.wait_for(r"joined run dist as client 1")
    assert server.wait() == 0
    assert all(p.wait() == 0 for p in (clients[0], again, clients[2]))
    server_out = "".join(server.lines)
    assert "task 1 evaluated" in server_out and "FAA (mean over tasks, paper)" in server_out
    assert "merges on 1 torch thread(s)" in server_out  # config.threads, as the in-process engine merges
    assert_same_as_reference(c, reference)
    results = c.run_dir / "results"
    config = json.loads((results / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == CONFIG.num_tasks * CONFIG.rank  # one adapter of rank T * r
    assert json.loads((results / "config.json").read_text()) == json.loads(CONFIG.to_json())
    assert (results / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(results / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss/train", "accuracy/task0", "accuracy/task1", "faa/paper"} <= tags
    assert [e.value for e in events.Scalars("accuracy/task1")] == pytest.approx([reference[0].matrix.accuracy()[1][1]])


@pytest.mark.slow  # test_faults.py kills the coordinator at exact points of a round (default suite)
def test_coordinator_killed_between_rounds_resumes(cluster, reference):
    c = cluster(CONFIG.to_json())
    server, clients = start(c)
    server.wait_for(r"task 0 round 1 train A merged")
    server.proc.send_signal(signal.SIGKILL)
    server.wait()
    restarted = c.server()  # same state dir, same port: clients retry with backoff
    restarted.wait_for(r"resumed run dist at running task 0")
    assert restarted.wait() == 0
    assert all(p.wait() == 0 for p in clients)
    assert_same_as_reference(c, reference)


# Two blocks with the average rule send both shapes of Gram factor: the two blocks' (2, <= 32, 32) and the held-out
# samples' whole-width (<= 64, 64). The whole width alone (one block) and the blocks alone (the members rule) are
# the same wire fields, so those two run with -m slow (the in-process tests check their merges).
@pytest.mark.parametrize(
    "blocks, rule", [pytest.param(1, "members", marks=SLOW), pytest.param(2, "members", marks=SLOW), (2, "average")]
)
def test_ridge_over_grpc_identical_to_inprocess(cluster, blocks, rule):
    """A closed-form head over the wire: each client sends its task's class sums and its Gram as a
    factor of fewer rows (about 40 samples) than the width (64), declared as such before its bytes;
    with ``ridge.blocks = 2``, the factors of the Gram's two 32-wide diagonal blocks (an ensemble of two),
    and with ``lambda_rule = 'average'`` the held-out samples' whole-width factor, kept stacked."""
    base = json.loads(CONFIG.to_json())
    ridge = {"rp_dim": 64 // blocks, "blocks": blocks, "lambdas": [0.1, 1.0, 10.0], "lambda_rule": rule}
    config = RunConfig(
        **{**base, "run_id": "ridge", "method": "ridge", "settings": base["settings"] | {"ridge": ridge}}
    )
    result = run_inprocess(config)
    c = cluster(config.to_json())
    server, clients = start(c)
    assert server.wait() == 0 and all(p.wait() == 0 for p in clients)
    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    assert metrics["correct"] == result.matrix.correct and metrics["total"] == result.matrix.total
    head = load_file(str(c.run_dir / "results" / "head.safetensors"))
    assert head["weight"].shape == (8, 64)
    assert torch.equal(head["weight"], result.head_weight.to(torch.float32))


def test_robust_mode_over_grpc_identical_to_inprocess(cluster, tmp_path):
    """Robust mode over the wire: the coordinator folds nothing until a step closes, then screens the
    updates it staged on disk; the same bits as the in-process engine, and the same screening."""
    config = RunConfig(
        **{**json.loads(CONFIG.to_json()), "run_id": "robust", "settings": {"robust": {"enabled": True, "kappa": 1.5}}}
    )
    result = run_inprocess(config)
    screened = [h["robust"] for h in result.history if "robust" in h]
    assert screened and all(r["screened"] for r in screened)
    assert any(r["clipped"] for r in screened)  # kappa 1.5 clips honest clients too: the path runs
    c = cluster(config.to_json())
    server, clients = start(c)
    assert server.wait() == 0 and all(p.wait() == 0 for p in clients)
    metrics, adapter = finished(c)
    assert metrics["correct"] == result.matrix.correct and metrics["total"] == result.matrix.total
    assert [h["robust"] for h in metrics["history"] if "robust" in h] == screened
    assert "robust: client" in "".join(server.lines)
    export_adapter(tmp_path / "adapter", result.adapter, build_runtime(config).spec, rank_per_task=config.rank)
    expected = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert adapter.keys() == expected.keys() and all(torch.equal(adapter[k], expected[k]) for k in expected)


def same_counts_and_head(cluster, config, results_dir):
    """Run ``config`` over gRPC; its accuracy counts and head must be those of the in-process run, which
    writes its results into ``results_dir`` while the processes run (they spend their first seconds
    importing; the test's two halves overlap)."""
    c = cluster(config.to_json())
    server, clients = start(c)
    result = run_inprocess(config, results_dir=results_dir)
    assert server.wait() == 0 and all(p.wait() == 0 for p in clients)
    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    assert metrics["correct"] == result.matrix.correct and metrics["total"] == result.matrix.total
    head = load_file(str(c.run_dir / "results" / "head.safetensors"))
    assert torch.equal(head["weight"], result.head_weight.to(torch.float32))
    return c, server, metrics


# The default suite keeps one method per kind of plan and update (EWC: anchor and Fisher step; CCVR:
# features step and class sums; L2P: prompt pool); the ones whose wire fields those already cover run
# with -m slow (LwF: anchor; FedProto: prototypes, i.e. class sums after training; PILoRA: prototypes
# and extra; TARGET: anchor, synthesis per process; CODA-P: a growing pool).


@pytest.mark.parametrize(
    "method",
    ["ewc", pytest.param("lwf", marks=SLOW), "ccvr", pytest.param("fedproto", marks=SLOW)]
    + [pytest.param("pilora", marks=SLOW)]
    + [pytest.param("target", marks=SLOW)],
)
def test_continual_baselines_over_grpc_identical_to_inprocess(cluster, method, tmp_path):
    """Plans that carry the previous task's weights (and EWC's Fisher), EWC's Fisher step, CCVR's features
    step at the fine-tuned weights, FedProto's and PILoRA's prototypes (PILoRA's earlier modules as extra),
    TARGET's synthesis on every client process, over the wire: the same counts, head and prototypes as
    in-process (CCVR's head: calibrated on the coordinator)."""
    values = json.loads(CONFIG.to_json())
    if method == "target":  # a short synthesis: each client process draws the same inputs
        values["settings"] = values["settings"] | {"target": {"rounds": 3, "steps": 4, "warmup": 1, "student_steps": 2}}
    config = RunConfig(**{**values, "run_id": method, "method": method})
    c, server, metrics = same_counts_and_head(cluster, config, tmp_path)
    if method in ("fedproto", "pilora"):
        got, want = (load_file(str(d / "prototypes.safetensors")) for d in (c.run_dir / "results", tmp_path))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    phases = [h["phase"] for h in metrics["history"]]
    assert phases.count("task_gram") == (CONFIG.num_tasks if method == "ewc" else 0)  # EWC's Fisher steps
    assert ("task Fisher (statistics only" in "".join(server.lines)) == (method == "ewc")
    assert phases.count("features") == (CONFIG.num_tasks if method == "ccvr" else 0)  # CCVR's statistics


@pytest.mark.parametrize("method", ["l2p", pytest.param("coda-p", marks=SLOW)])
def test_prompt_methods_over_grpc_identical_to_inprocess(cluster, method, tmp_path):
    """Plans that carry a prompt pool (CODA-P's growing, its old components frozen) and updates that carry
    the trained components' change, over the wire: the same counts, head and prompt pool as in-process."""
    settings = {"l2p": {"pool": 4, "top_k": 2, "length": 2}} if method == "l2p" else {"coda": {"components": 4}}
    config = RunConfig(**{**json.loads(CONFIG.to_json()), "run_id": method, "method": method, "settings": settings})
    c, _, _ = same_counts_and_head(cluster, config, tmp_path)
    prompts, expected = (load_file(str(d / "prompts.safetensors")) for d in (c.run_dir / "results", tmp_path))
    assert prompts.keys() == expected.keys() and all(torch.equal(prompts[k], expected[k]) for k in expected)
    assert all(t.shape[0] == 4 for t in prompts.values())  # L2P: its pool; CODA-P: 2 components per task, 2 tasks


@pytest.mark.parametrize(
    "method, settings",
    [
        # (IA)^3 carries every wire field of the two (vector/<layer>/B and /E, an export); VeRA's /B and /A,
        # and its task merge of products, run with -m slow to keep CI's time. Rank 8: the ld round's
        # statistic is the diagonal Gram on the 32-wide inputs (32 < 8^2), A G A^T on the 64-wide ones
        pytest.param("lorm-vera", {"vera": {"rank": 8}}, marks=SLOW),
        pytest.param("lorm-vera", {"vera": {"rank": 4, "form": "appendix"}}, marks=SLOW),
        ("lorm-ia3", {}),
        pytest.param("lorm-ia3", {"ia3": {"side": "input"}}, marks=SLOW),
    ],
)
def test_adapter_methods_over_grpc_identical_to_inprocess(cluster, method, settings, tmp_path):
    """Plans that carry adapter vectors (VeRA's shared lb, ld; (IA)^3's and its frozen "E"), updates that
    carry one trained vector per layer and its Gram statistic (never a dense Gram; VeRA's frozen matrices
    rebuilt from the seed by every process), over the wire: the same counts, head and exported model
    (VeRA's task merge of low-rank products as an adapter, (IA)^3's merged vectors) as in-process."""
    config = RunConfig(**{**json.loads(CONFIG.to_json()), "run_id": method, "method": method, "settings": settings})
    c, server, metrics = same_counts_and_head(cluster, config, tmp_path)
    exported = "ia3.safetensors" if method == "lorm-ia3" else "adapter/adapter_model.safetensors"
    got, want = (load_file(str(d / exported)) for d in (c.run_dir / "results", tmp_path))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert [h["phase"] for h in metrics["history"]].count("task_gram") == CONFIG.num_tasks  # LoRM's task merge
