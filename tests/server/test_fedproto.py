"""FedProto: the global prototypes from the clients' sums, the prototype loss and nearest-prototype
scores, by hand."""

from __future__ import annotations

import torch
from test_baselines import SPEC, fake_update

from client.methods.prototypes import prototype_loss
from common.aggregation.declared import declared_tensors
from common.methods.fedproto import PROTO
from common.run.config import RunConfig
from common.wire.messages import Phase
from common.wire.tensors import STAT, named_tensors, tensor_name
from server.strategies import make_strategy

F64 = torch.float64


def test_prototype_loss_by_hand_skips_classes_without_a_prototype():
    features = torch.tensor([[1.0, 2.0], [3.0, 0.0], [5.0, 5.0]])
    labels = torch.tensor([0, 1, 2])
    mean = torch.tensor([[1.0, 0.0], [0.0, 0.0], [9.0, 9.0]])
    count = torch.tensor([4.0, 2.0, 0.0])  # class 2 has no prototype yet
    loss = prototype_loss(features, labels, mean, count)
    assert loss is not None and loss.item() == (4.0 + 9.0) / 4  # (0 + 4) and (9 + 0) over 2 samples x 2 dims
    assert prototype_loss(features, labels, mean, torch.zeros(3)) is None


def test_global_prototypes_are_the_class_means_of_all_clients_data_and_persist_across_tasks():
    config = RunConfig(num_clients=3, num_tasks=2, rounds_per_task=1, seed=1, method="fedproto")
    strategy = make_strategy(config, SPEC)
    gen = torch.Generator().manual_seed(7)
    seen: dict[int, torch.Tensor] = {}
    for task, (lo, hi) in enumerate(strategy.tasks):
        strategy.begin_task(task)
        plan = strategy.configure(task, 0, Phase.TRAIN)
        assert torch.equal(plan.named(PROTO)["count"][:lo] > 0, torch.ones(lo, dtype=torch.bool))  # old ones kept
        expected = declared_tensors(plan, SPEC, config)
        assert expected[tensor_name(STAT, "class_sum")] == (hi - lo, SPEC.feature_dim)
        fold = strategy.fold(plan)
        agg = fold.aggregator
        xs, ys = [], []
        for i, n in enumerate((3, 5, 8)):
            x = torch.randn(n, SPEC.feature_dim, generator=gen, dtype=F64)
            y = torch.arange(n) % (hi - lo)
            one_hot = torch.nn.functional.one_hot(y, hi - lo).to(F64)
            update = fake_update(plan, i, seed=i)
            update.num_samples = n
            update.tensors |= named_tensors(STAT, {"class_sum": one_hot.T @ x, "class_count": one_hot.sum(0)})
            agg.fold(update)
            xs.append(x)
            ys.append(y)
        fold.finish()
        x, y = torch.cat(xs), torch.cat(ys)
        for c in range(hi - lo):
            seen[lo + c] = x[y == c].mean(0)
        for c, want in seen.items():  # this task's classes just now, the old ones from their task
            assert torch.allclose(strategy.proto_mean[c], want, rtol=0, atol=1e-12)
        assert strategy.proto_count[lo:hi].sum() == 16
    again = make_strategy(config, SPEC)
    again.load_state_tensors(strategy.state_tensors())
    assert torch.equal(again.proto_mean, strategy.proto_mean)
    assert torch.equal(strategy.eval_plan(1).named(PROTO)["mean"], strategy.proto_mean.float())
