"""Shared pieces of the coordinator's tests: the small LoRA model, the base run, and valid updates of any step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from client.features import sums
from common.merges.grams import block_gram_factor, gram_factor
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, ModelSpec, RoundPlan
from common.wire.tensors import (
    DELTA,
    FACTOR,
    FISHER,
    GRAM,
    HEAD_BIAS,
    HEAD_GRAM,
    HEAD_WEIGHT,
    STAT,
    named_tensors,
    parse_tensor_name,
    tensor_name,
)

from updates import plan_update

F64 = torch.float64
N = 12  # samples per client and step of a made-up update
# Two LoRA layers and a head of 6 classes over 4 features: the LoRM tests' model.
LORA_SPEC = ModelSpec(layers={"l1": (5, 4), "l2": (3, 6)}, feature_dim=4, num_classes=6)


def unit_config(**kw) -> RunConfig:
    """3 clients, 2 tasks of 2 rounds, rank 2, seed 1; ``kw`` overrides."""
    base = dict(run_id="unit", num_clients=3, num_tasks=2, rounds_per_task=2, rank=2, seed=1)
    return RunConfig(**{**base, **kw})


def _stats(shapes: dict[str, tuple[int, ...]], plan: RoundPlan, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Feature statistics of N samples of the plan's classes, as client/features.py computes them."""
    lo, hi = plan.class_range
    dim = next(s for n, s in shapes.items() if n.endswith("class_sum"))[1]
    y = torch.randint(lo, hi, (N,), generator=g)
    x = torch.randn(N, dim, generator=g, dtype=F64)
    one_hot = torch.nn.functional.one_hot(y - lo, hi - lo).to(F64)  # the task's classes only
    held = torch.arange(N) % 4 == 0
    factor_shape = shapes.get(tensor_name(STAT, "gram_factor"), ())
    blocks = factor_shape[0] if len(factor_shape) == 3 else 1  # ridge.blocks: the diagonal blocks' factors
    factor = gram_factor if blocks == 1 else lambda rows: block_gram_factor(rows, blocks)
    out = {
        "class_sum": one_hot.T @ x,
        "class_count": one_hot.sum(0),
        "gram_factor": factor(x),
        "holdout_class_sum": one_hot[held].T @ x[held],
        "holdout_class_count": one_hot[held].sum(0),
        "holdout_gram_factor": factor(x[held]),
    }
    if tensor_name(STAT, "heldfit_class_count") in shapes:  # ridge.views (2 in the tests' configurations)
        views = [x + 0.1 * torch.randn(x.shape, generator=g, dtype=F64) for _ in range(2)]
        out |= sums(x, y, (lo, hi), True, blocks=blocks, views=views)  # each sample's 3 rows at weight 1/3
        share = sums(x[held], y[held], (lo, hi), True, blocks=blocks, views=[v[held] for v in views])
        out |= {"heldfit_" + n: t for n, t in share.items()}
    if tensor_name(STAT, "prototype") in shapes:  # PILoRA: the client's trained prototypes
        out["prototype"] = torch.randn(hi - lo, dim, generator=g, dtype=F64)
    moment = shapes.get(tensor_name(STAT, "class_moment"))
    if moment is not None:  # CCVR's per-class second moments, full or diagonal
        out["class_moment"] = torch.einsum("nc,nf,ng->cfg", one_hot, x, x) if len(moment) == 3 else one_hot.T @ (x * x)
    return {tensor_name(STAT, k): v for k, v in out.items() if tensor_name(STAT, k) in shapes}


def valid_update(plan: RoundPlan, expected: dict[str, tuple[int, ...]], index: int, seed: int) -> ClientUpdate:
    """A correct update of any strategy's step, built from what its aggregator expects."""
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        kind, _, part = parse_tensor_name(name)
        if kind in (FACTOR, DELTA) or name in (HEAD_WEIGHT, HEAD_BIAS):
            tensors[name] = torch.randn(shape, generator=g)  # float32, as clients compute
        elif kind == GRAM or name == HEAD_GRAM:
            x = torch.randn(N, shape[0], generator=g, dtype=F64)
            tensors[name] = x.T @ x if len(shape) == 2 else (x * x).sum(0)
        elif kind == FISHER:
            tensors[name] = torch.rand(shape, generator=g, dtype=F64)
    stats = {n: s for n, s in expected.items() if n.startswith(STAT + "/")}
    if stats:
        tensors |= _stats(stats, plan, g)
    return dataclasses.replace(plan_update(plan, index, N, train_loss=1.0), tensors=tensors)


def edit_named(update: ClientUpdate, kind: str, edit: Callable[[dict[str, torch.Tensor]], object]) -> None:
    """Apply ``edit`` to ``update``'s ``<kind>/<name>`` tensors as one ``name -> tensor`` dict (it may add,
    replace or remove entries, or change a tensor in place) and put the result back under the wire names."""
    named = update.named(kind)
    edit(named)
    others = {name: t for name, t in update.tensors.items() if not name.startswith(kind + "/")}
    update.tensors = others | named_tensors(kind, named)
