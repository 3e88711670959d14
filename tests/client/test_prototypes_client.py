"""FedProto's client half: the class sums it sends are of its trained model's features, and
nearest-prototype scores."""

from __future__ import annotations

import dataclasses

import torch
from test_continual_client import BASE

from client.features import extract
from client.methods.prototypes import FedProtoTrainer
from client.runtime import build_runtime
from common.methods.fedproto import PROTO
from common.run.config import RunConfig
from common.wire.messages import Phase
from common.wire.tensors import DELTA, STAT, named_tensors
from server.strategies import make_strategy


def test_fedproto_sends_the_class_sums_of_its_trained_features_and_scores_by_the_nearest_prototype():
    config = RunConfig(**BASE, method="fedproto", settings={"fedproto": {"classify": "prototype"}})
    runtime = build_runtime(config)
    strategy = make_strategy(config, runtime.spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.TRAIN)
    worker = runtime.worker(0, "c0")
    update = worker.update(plan)
    shard = worker.shards[0]
    x = extract(worker.model, worker.train, shard, worker.device)  # the model still holds the trained weights
    labels = worker.train.labels[shard]
    stats = update.named(STAT)
    for c in range(*plan.class_range):
        assert torch.allclose(stats["class_sum"][c], x[labels == c].sum(0), rtol=0, atol=1e-9)
        assert stats["class_count"][c] == (labels == c).sum()
    # prototypes at two of the samples' features: each of those samples scores its own prototype highest
    mean = torch.zeros(runtime.spec.num_classes, runtime.spec.feature_dim)
    mean[0], mean[1] = x[0].float(), x[1].float()
    count = torch.tensor([1.0, 1.0] + [0.0] * (runtime.spec.num_classes - 2))
    prototypes = {"mean": mean, "count": count}
    plain = strategy.eval_plan(0)
    others = {name: t for name, t in plain.tensors.items() if not name.startswith((PROTO + "/", DELTA + "/"))}
    tensors = others | named_tensors(PROTO, prototypes) | named_tensors(DELTA, update.named(DELTA))
    evaluation = dataclasses.replace(plain, tensors=tensors)
    half = FedProtoTrainer()
    half.load(worker, evaluation)
    inputs, _ = worker.train.batch(shard[:2], worker.device)
    with torch.no_grad():
        scores = half.logits(worker, evaluation, inputs)
    assert scores.argmax(1).tolist() == [0, 1] and torch.isinf(scores[:, 2:]).all()
