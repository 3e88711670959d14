"""The client halves of L2P and CODA-Prompt: matching, weights, prompt tuning and frozen components."""

from __future__ import annotations

import math

import pytest
import torch
from test_continual_client import BASE

from client.classifier import build_model
from client.methods.prompts import coda_weights, l2p_select, matching_loss, ortho_penalty
from client.runtime import build_runtime
from common.adapters.prompts import CODA_PROMPTS, L2P_KEYS, L2P_PROMPTS
from common.run.config import RunConfig
from common.wire.instructions import PromptStep
from common.wire.messages import Phase
from common.wire.tensors import DELTA, PROMPT, named_tensors, tensor_name
from server.strategies import make_strategy

EPS = torch.finfo(torch.float32).eps


def test_l2p_select_takes_the_keys_of_highest_cosine_and_the_matching_loss_by_hand():
    query = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    keys = torch.tensor([[3.0, 0.0], [1.0, 1.0], [0.0, -1.0]], requires_grad=True)
    idx, cos = l2p_select(query, keys, 2)
    r = 1 / math.sqrt(2)
    assert idx.tolist() == [[0, 1], [1, 0]]  # sample 1: cos 1/sqrt2, 0, -1
    assert torch.allclose(cos, torch.tensor([[1.0, r], [r, 0.0]]), atol=4 * EPS)
    loss = matching_loss(cos)  # mean over samples of sum_i (1 - cos)
    assert loss.item() == pytest.approx(((0 + 1 - r) + (1 - r + 1)) / 2, abs=8 * EPS)
    loss.backward()
    assert keys.grad is not None and keys.grad[2].abs().max() == 0  # an unchosen key gets no gradient
    # the gradient pulls key 1 towards the queries: a small step raises its cosines
    with torch.no_grad():
        moved = keys - 0.1 * keys.grad
    assert l2p_select(query, moved, 2)[1].sum() > cos.sum()


def test_coda_weights_by_hand():
    query = torch.tensor([[1.0, 2.0]])
    keys = torch.tensor([[1.0, 1.0], [0.0, -3.0]])
    attention = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # q * A: (1, 0) and (0, 2)
    alpha = coda_weights(query, keys, attention)
    assert torch.allclose(alpha, torch.tensor([[1 / math.sqrt(2), -1.0]]), atol=4 * EPS)


def test_ortho_penalty_is_zero_on_orthonormal_rows_and_by_hand_otherwise():
    assert ortho_penalty(torch.eye(3)[:2]) == 0
    rows = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # T T^T - I = [[0, 1], [1, 0]]
    assert ortho_penalty(rows).item() == pytest.approx(0.5)


@pytest.mark.parametrize("backbone", ["tiny-bert", "tiny-t5", "tiny-vit"])
def test_an_empty_prompt_leaves_the_features_unchanged_and_a_prompt_changes_them(backbone):
    model = build_model(RunConfig(**BASE, backbone=backbone, method="l2p"), 6).eval()
    gen = torch.Generator().manual_seed(1)
    inputs = (
        {"pixel_values": torch.randn(4, 3, 16, 16, generator=gen)}
        if backbone == "tiny-vit"
        else model.backbone.encode(["a b c", "d e", "f g h i", "j"])
    )
    width = model.backbone.feature_dim
    with torch.no_grad():
        plain = model.backbone(**inputs)
        features, states = model.backbone.prompted(torch.zeros(4, 0, width), **inputs)
        assert states.shape == (4, 0, width)
        assert torch.allclose(features, plain, atol=64 * EPS * plain.abs().max())
        prompt = torch.randn(4, 3, width, generator=torch.Generator().manual_seed(0))
        prompted, states = model.backbone.prompted(prompt, **inputs)
    assert states.shape == (4, 3, width) and not torch.allclose(prompted, plain, atol=1e-3)


def trained_step(method: str, task: int, **settings):
    section = "l2p" if method == "l2p" else "coda"
    config = RunConfig(**BASE, method=method, settings={section: settings})
    runtime = build_runtime(config)
    strategy = make_strategy(config, runtime.spec)
    for t in range(task + 1):
        strategy.begin_task(t)
    plan = strategy.configure(task, 0, Phase.TRAIN)
    return plan, runtime.worker(0, "c0").update(plan)


def test_l2p_client_trains_the_whole_pool_and_sends_its_change():
    plan, update = trained_step("l2p", 0, pool=4, top_k=2, length=2)
    delta = update.named(DELTA)
    assert delta.keys() == {L2P_PROMPTS, L2P_KEYS}
    assert delta[L2P_PROMPTS].shape == plan.named(PROMPT)[L2P_PROMPTS].shape
    assert delta[L2P_PROMPTS].abs().max() > 0 and delta[L2P_KEYS].abs().max() > 0


def test_coda_client_trains_only_the_current_tasks_components_and_uses_the_old_ones():
    plan, update = trained_step("coda-p", 1, components=4, length=2)
    frozen = plan.expect(PromptStep).prompt_frozen
    old, delta = plan.named(PROMPT), update.named(DELTA)
    assert frozen == 2 and old[CODA_PROMPTS].shape[0] == 4
    assert {n: tuple(t.shape) for n, t in delta.items()} == {name: (2, *t.shape[1:]) for name, t in old.items()}
    assert all(d.abs().max() > 0 for d in delta.values())
    # the frozen components take part: changing them changes what the step trains
    doubled = {n: torch.cat([t[:frozen] * 2, t[frozen:]]) for n, t in old.items()}
    plan.tensors = {name: t for name, t in plan.tensors.items() if not name.startswith(PROMPT + "/")}
    plan.tensors |= named_tensors(PROMPT, doubled)
    config = RunConfig(**BASE, method="coda-p", settings={"coda": {"components": 4, "length": 2}})
    other = build_runtime(config).worker(0, "c0").update(plan)
    assert not torch.equal(other.named(DELTA)[CODA_PROMPTS], delta[CODA_PROMPTS])
    assert tensor_name(DELTA, CODA_PROMPTS) == "delta/coda.prompts"
