"""VeRA layers: the output, the trained sides, the frozen seeded matrices, and their placement."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from client.classifier import build_model, model_spec
from common.adapters.vera import VeRALinear, frozen_matrices, product
from common.run.config import RunConfig
from server.strategies.vera import LoRMVeRA

F32 = torch.float32
TOL = 100 * torch.finfo(F32).eps


def make_layer(seed=0, r=3) -> VeRALinear:
    torch.manual_seed(seed)
    layer = VeRALinear(nn.Linear(6, 5), rank=r, seed=seed, name="blocks.0.fc")
    layer.load_vectors(torch.randn(5), torch.randn(r))
    return layer


@pytest.mark.parametrize("shape", [(7, 6), (3, 4, 6)])
def test_output_is_w0x_plus_scaled_vera_delta_plus_extra(shape):
    layer = make_layer()
    be, ae = torch.randn(5, 2), torch.randn(2, 6)
    layer.set_extra(be, ae)
    layer.scale = 0.5
    x = torch.randn(*shape)
    lb, ld, b, a = layer.lora_lb, layer.lora_ld, layer.lora_B, layer.lora_A
    dense = 0.5 * torch.diag(lb) @ b @ torch.diag(ld) @ a + be @ ae
    torch.testing.assert_close(layer.delta(), dense, rtol=TOL, atol=TOL)
    torch.testing.assert_close(layer(x), layer.base(x) + x @ dense.T, rtol=TOL, atol=TOL)
    pb, pa = product(lb, ld, b, a)
    torch.testing.assert_close(pb @ pa, dense / 0.5 - be @ ae / 0.5, rtol=TOL, atol=TOL)


def test_a_round_trains_exactly_its_side_and_the_random_matrices_never():
    layer = make_layer()
    for sides, want in ((("B",), {"lora_lb"}), (("A",), {"lora_ld"}), ((), set())):
        layer.set_trainable(sides)
        assert {n for n, p in layer.named_parameters() if p.requires_grad} == want
    with pytest.raises(ValueError, match="subset"):
        layer.set_trainable(("lb",))
    with pytest.raises(TypeError, match="frozen and seeded"):
        layer.load_factors(torch.zeros(5, 3), torch.zeros(3, 6))
    with pytest.raises(ValueError, match="VeRA vectors"):
        layer.load_vectors(torch.zeros(4), torch.zeros(3))


def test_frozen_matrices_depend_on_seed_and_name_only():
    b, a = frozen_matrices(1, "x", 5, 6, 3)
    assert b.shape == (5, 3) and a.shape == (3, 6)
    same = frozen_matrices(1, "x", 5, 6, 3)
    assert torch.equal(b, same[0]) and torch.equal(a, same[1])
    assert not torch.equal(a, frozen_matrices(2, "x", 5, 6, 3)[1])
    assert not torch.equal(a, frozen_matrices(1, "y", 5, 6, 3)[1])


@pytest.mark.parametrize("backbone", ["tiny-bert", "tiny-t5", "tiny-vit"])
def test_lorm_vera_builds_vera_layers_whose_matrices_the_coordinator_rebuilds(backbone):
    config = RunConfig(backbone=backbone, method="lorm-vera", seed=4, settings={"vera": {"rank": 5}})
    model = build_model(config, num_classes=4)
    layers = model.lora()
    assert layers and all(isinstance(layer, VeRALinear) and layer.rank == 5 for layer in layers.values())
    assert not any("lora_" in name for name in model.dense_params())  # vectors and matrices are no backbone weight
    strategy = LoRMVeRA(config, model_spec(model))
    for name, layer in layers.items():
        b, a = strategy.frozen[name]
        assert torch.equal(b, layer.lora_B.detach().double()) and torch.equal(a, layer.lora_A.detach().double())
    plain = build_model(RunConfig(backbone=backbone), num_classes=4)
    assert not any(isinstance(layer, VeRALinear) for layer in plain.lora().values())
