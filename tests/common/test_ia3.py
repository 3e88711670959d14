"""(IA)^3 layers and their merges as the coordinator runs them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from client.classifier import build_model
from common.adapters.ia3 import IA3Linear
from common.merges.sums import running_sums, summable
from common.merges.vectors import ia3_accumulator, ia3_input, ia3_output, ia3_statistic, ia3_statistic_shape
from common.run.config import RunConfig

F32, F64 = torch.float32, torch.float64
TOL32, EPS = 100 * torch.finfo(F32).eps, torch.finfo(F64).eps


@pytest.mark.parametrize("side", ["B", "A"])
def test_output_is_w0x_rescaled_by_one_plus_s_l_plus_le(side):
    torch.manual_seed(0)
    layer = IA3Linear(nn.Linear(6, 5), side, scale=0.5)
    size = 5 if side == "B" else 6
    vec, le = torch.randn(size), torch.randn(size)
    layer.load_vector(vec, le)
    w0, b0 = layer.base.weight, layer.base.bias
    m = 0.5 * vec + le
    dense = m[:, None] * w0 if side == "B" else w0 * m[None, :]
    torch.testing.assert_close(layer.delta(), dense, rtol=TOL32, atol=TOL32)
    x = torch.randn(3, 4, 6)
    torch.testing.assert_close(layer(x), x @ (w0 + dense).T + b0, rtol=TOL32, atol=TOL32)
    layer.scale = 0.0
    layer.set_extra_vector(None)
    torch.testing.assert_close(layer(x), layer.base(x), rtol=TOL32, atol=TOL32)


def test_a_layer_trains_its_own_side_only():
    layer = IA3Linear(nn.Linear(6, 5), "B")
    layer.set_trainable(("B",))
    assert {n for n, p in layer.named_parameters() if p.requires_grad} == {"lora_l"}
    with pytest.raises(ValueError, match="side 'B' only"):
        layer.set_trainable(("A",))
    with pytest.raises(TypeError, match="no LoRA factors"):
        layer.load_factors(torch.zeros(5, 1), torch.zeros(1, 6))
    with pytest.raises(ValueError, match=r"must be \(5,\)"):
        layer.load_vector(torch.zeros(6))


def clients(seed: int, d_out=5, d_in=7, k=3, n=12):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(d_in, n, generator=g, dtype=F64) * torch.rand(d_in, 1, generator=g, dtype=F64) for _ in range(k)]
    return g, [x @ x.T for x in xs], torch.randn(d_out, d_in, generator=g, dtype=F64)


@pytest.mark.parametrize("side, form", [("B", "exact"), ("B", "appendix"), ("A", "exact")])
@pytest.mark.parametrize("diagonal", [True, False])
def test_running_sums_from_client_statistics_equal_the_merges(side, form, diagonal):
    """The coordinator's accumulator, fed each client's vector and statistic (computed with W0, which only
    clients hold), equals the list-form merges that tests/common/test_adapter_merge.py checks against
    least squares; the appendix's rule needs diagonal Grams and refuses full ones by name."""
    g, grams, w0 = clients(1)
    d_out, d_in = w0.shape
    grams = [gr.diagonal().clone() for gr in grams] if diagonal else grams
    if form == "appendix" and not diagonal:
        with pytest.raises(ValueError, match="diagonal Grams"):
            ia3_statistic(side, form, grams[0], w0)
        return
    size = d_out if side == "B" else d_in
    ls = [torch.randn(size, generator=g, dtype=F64) for _ in grams]
    acc = ia3_accumulator(side, form, d_out, d_in, full=not diagonal)
    for l_i, gram in zip(ls, grams):
        stat = ia3_statistic(side, form, gram, w0)
        assert tuple(stat.shape) == ia3_statistic_shape(side, form, d_out, d_in, full=not diagonal)
        acc.fold(l_i, stat)
    want = ia3_output(ls, grams, w0, form=form) if side == "B" else ia3_input(ls, grams, w0)
    assert torch.allclose(acc.result(), want, rtol=1e6 * EPS, atol=1e6 * EPS)
    assert summable(acc) and running_sums(acc)


@pytest.mark.parametrize("backbone", ["tiny-bert", "tiny-t5", "tiny-vit"])
@pytest.mark.parametrize("side", ["output", "input"])
def test_lorm_ia3_puts_an_ia3_layer_on_every_lora_target(backbone, side):
    lora = build_model(RunConfig(backbone=backbone), num_classes=4).lora()
    model = build_model(RunConfig(backbone=backbone, method="lorm-ia3", settings={"ia3": {"side": side}}), 4)
    layers = model.lora()
    assert list(layers) == list(lora)
    assert all(
        isinstance(layer, IA3Linear) and layer.side == ("B" if side == "output" else "A") for layer in layers.values()
    )
    assert not any("lora_" in name for name in model.dense_params())
