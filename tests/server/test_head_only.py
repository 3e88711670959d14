"""The toy method ``head-only`` (one module and one registry line): clients train the head alone,
the coordinator averages the heads by sample counts, the backbone stays ``W0``."""

import torch

from client.runtime import build_runtime
from common.run.config import RunConfig
from common.wire.messages import Phase
from common.wire.tensors import HEAD_BIAS, HEAD_WEIGHT
from engine.simulation import run_inprocess
from server.strategies import make_strategy

CONFIG = RunConfig(
    method="head-only",
    num_clients=3,
    num_tasks=2,
    rounds_per_task=2,
    local_epochs=1,
    threads=1,
    settings={"data": {"synthetic_classes": 6, "synthetic_train": 20, "synthetic_test": 5}},
)
F64_TOLERANCE = 16 * torch.finfo(torch.float64).eps  # a weighted mean of 3 float32 heads, summed in float64


def test_clients_send_the_head_alone_and_the_server_averages_it_by_samples():
    runtime = build_runtime(CONFIG)
    strategy = make_strategy(CONFIG, runtime.spec)
    workers = [runtime.worker(i, f"c{i}") for i in range(CONFIG.num_clients)]
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.TRAIN)
    before = {name: p.detach().clone() for name, p in runtime.model.named_parameters() if not name.startswith("head")}

    updates = [w.update(plan) for w in workers]
    fold = strategy.fold(plan)
    aggregator = fold.aggregator
    for update in updates:
        aggregator.fold(update)
    fold.finish()

    assert all(set(u.tensors) == {"head/weight", "head/bias"} for u in updates)
    after = {name: p for name, p in runtime.model.named_parameters() if not name.startswith("head")}
    assert all(torch.equal(before[name], after[name].cpu()) for name in before)  # no backbone weight or factor trained
    n = torch.tensor([u.num_samples for u in updates], dtype=torch.float64)
    for got, name in ((strategy.head_w, HEAD_WEIGHT), (strategy.head_b, HEAD_BIAS)):
        stacked = torch.stack([u.get(name).to(torch.float64) for u in updates])  # (clients, ...)
        want = (stacked * n.view(-1, *[1] * (stacked.dim() - 1))).sum(0) / n.sum()
        torch.testing.assert_close(got, want, rtol=F64_TOLERANCE, atol=F64_TOLERANCE)


def test_a_whole_run_learns_with_the_backbone_untouched():
    result = run_inprocess(CONFIG)

    assert result.adapter == {}
    assert [e["phase"] for e in result.history] == ["train", "train", "evaluate"] * 2
    correct, total = result.matrix.correct[-1], result.matrix.total[-1]
    assert sum(correct) / sum(total) > 1 / 6  # above chance over the 6 classes: the averaged heads learned
