"""Per-sample squared gradients from one batched pass (client/persample.py) against a pass per sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from client.backbone_builders import build_backbone
from client.classifier import ClassifierModel
from client.persample import PerSampleSquares
from common.run.config import RunConfig
from common.wire.tensors import FISHER

from first_round import TINY, first_update

EPS = torch.finfo(torch.float32).eps
TEXTS = [
    "what is the weather like in paris today",
    "hi",
    "book a table for two at eight tonight please at the place on main street",
    "transfer money",
    "how do i say thank you in french",
]


def close(a: torch.Tensor, b: torch.Tensor, floor: float) -> bool:
    """float32 sums of float32 gradients in two orders: a few dozen eps relative to the tensor's scale.
    ``floor``: eps^2 of the largest entry of any tensor, for tensors whose exact value is 0 (attention's
    key bias: softmax ignores a shift common to all keys), where both sides are rounding noise."""
    atol = max(64 * EPS * float(b.abs().max()), floor)
    return torch.allclose(a.double(), b.double(), rtol=64 * EPS, atol=atol)


def floor_of(fisher: dict[str, torch.Tensor]) -> float:
    return EPS**2 * max(float(t.abs().max()) for t in fisher.values())


def tiny_model() -> ClassifierModel:
    torch.manual_seed(0)
    model = ClassifierModel(build_backbone(RunConfig(backbone="tiny-bert", max_length=32)), 7, 1).eval()
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def dense(model: ClassifierModel) -> dict[str, nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if ".lora_" not in n}


def test_a_padded_batch_gives_each_samples_own_squared_gradient_as_alone():
    """Samples of different lengths in one padded batch, weighted, against each sample run alone at its
    own length (no padding at all): every parameter, embeddings, norms, attention, head."""
    model = tiny_model()
    params = dense(model)
    inputs = model.backbone.encode(TEXTS)
    lengths = inputs["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) > 2  # the batch pads
    labels, weights = torch.tensor([0, 3, 6, 2, 5]), torch.tensor([1.0, 0.5, 2.0, 0.0, 0.25])

    alone = {n: torch.zeros_like(p) for n, p in params.items()}
    for b, n in enumerate(lengths.tolist()):
        one = {k: v[b : b + 1, :n] for k, v in inputs.items()}
        log_p = F.log_softmax(model(one)[0], dim=1)
        grads = torch.autograd.grad(log_p[0, labels[b]], list(params.values()), allow_unused=True)
        for name, g in zip(params, grads):
            if g is not None:
                alone[name] += weights[b] * g.square()

    batched = {n: torch.zeros_like(p) for n, p in params.items()}
    squares = PerSampleSquares(model, params, batched)
    width = int(lengths.max())
    with squares.recording(len(TEXTS)):
        logits = model({k: v[:, :width] for k, v in inputs.items()})[0]
    log_p = F.log_softmax(logits, dim=1)
    squares.add(log_p[torch.arange(len(TEXTS)), labels].sum(), weights)

    assert all(float(alone[n].abs().max()) > floor_of(alone) for n in params if ".key.base.bias" not in n)
    mismatched = [n for n in params if not close(batched[n], alone[n], floor_of(alone))]
    assert not mismatched
    word = "backbone.encoder.embeddings.word_embeddings.weight"
    kept = (lengths.unsqueeze(1) > torch.arange(inputs["input_ids"].shape[1])) & (weights > 0).unsqueeze(1)
    used = inputs["input_ids"][kept].unique()  # the weighted samples' tokens, no padding
    assert torch.equal(batched[word].abs().sum(1).nonzero().flatten(), used)


def test_asking_twice_of_one_pass_adds_each_scalars_squares():
    model = tiny_model()
    params = dense(model)
    inputs = model.backbone.encode(TEXTS[:3])
    once = {n: torch.zeros_like(p) for n, p in params.items()}
    twice = {n: torch.zeros_like(p) for n, p in params.items()}
    for into, rounds in ((once, [0, 1]), (twice, None)):
        squares = PerSampleSquares(model, params, into)
        if rounds is None:  # both classes from one forward pass, the graph kept for the second
            with squares.recording(3):
                log_p = F.log_softmax(model(inputs)[0], dim=1)
            squares.add(log_p[:, 0].sum(), torch.ones(3), retain=True)
            squares.add(log_p[:, 1].sum(), torch.ones(3))
            continue
        for c in rounds:  # a forward pass each
            with squares.recording(3):
                log_p = F.log_softmax(model(inputs)[0], dim=1)
            squares.add(log_p[:, c].sum(), torch.ones(3))
    assert all(close(twice[n], once[n], floor_of(once)) for n in params)


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.gain = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.gain


def test_a_parameter_outside_the_covered_layers_is_refused_by_name():
    model = nn.Sequential(Scaled())
    params = dict(model.named_parameters())
    with pytest.raises(ValueError, match=r"another kind of layer or share a weight: 0 \(Scaled\).*fisher_batch=1"):
        PerSampleSquares(model, params, {n: torch.zeros_like(p) for n, p in params.items()})


def test_a_weight_two_layers_share_is_refused():
    embed, out = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
    out.weight = embed.weight  # tied, as a language model's input and output embeddings
    model = nn.Sequential(embed, out)
    params = dict(model.named_parameters())
    with pytest.raises(ValueError, match=r"share a weight: 1 \(Linear\); use"):
        PerSampleSquares(model, params, {n: torch.zeros_like(p) for n, p in params.items()})


def test_a_layer_used_twice_in_one_pass_is_refused():
    layer = nn.Linear(3, 3)
    params = dict(layer.named_parameters())
    squares = PerSampleSquares(layer, params, {n: torch.zeros_like(p) for n, p in params.items()})
    with pytest.raises(ValueError, match="ran twice"):
        with squares.recording(2):
            layer(layer(torch.randn(2, 3)))


@pytest.mark.parametrize("estimator", ["sampled", "expected", "reference"])
def test_fisheravg_sends_the_same_fisher_a_sample_at_a_time_or_in_batches(estimator):
    """The client's Fisher, every estimator, with fisher_batch 1 and 5 (a batch size that leaves a
    remainder): the same labels drawn, the same weights, the same sums up to rounding."""
    fishers = []
    for size in (1, 5):
        update, worker, _ = first_update(RunConfig(method="fisheravg", fisher=estimator, fisher_batch=size, **TINY))
        assert worker.shards[0].numel() % 5  # the last pass is a part batch
        fishers.append(update.named(FISHER))
    one, many = fishers
    assert one.keys() == many.keys() and len(one) > 20
    assert all(float(one[n].abs().max()) > floor_of(one) for n in one if ".key.base.bias" not in n)
    assert [n for n in one if not close(many[n], one[n], floor_of(one))] == []


def test_fisher_batch_below_one_is_refused():
    with pytest.raises(ValueError, match="fisher_batch must be >= 1, got 0"):
        RunConfig(fisher_batch=0)


def test_the_embeddings_padding_row_gets_nothing_as_in_pytorch():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Embedding(6, 4, padding_idx=0), nn.Linear(4, 2))
    params = dict(model.named_parameters())
    ids = torch.tensor([[0, 2, 2, 5], [3, 0, 1, 1]])  # the padding id inside both samples

    alone = {n: torch.zeros_like(p) for n, p in params.items()}
    for row in ids:
        grads = torch.autograd.grad(model(row[None]).sum(), list(params.values()))
        for name, g in zip(params, grads):
            alone[name] += g.square()
    batched = {n: torch.zeros_like(p) for n, p in params.items()}
    squares = PerSampleSquares(model, params, batched)
    with squares.recording(2):
        out = model(ids).sum()
    squares.add(out, torch.ones(2))

    assert float(alone["0.weight"][0].abs().max()) == 0.0 and float(batched["0.weight"][0].abs().max()) == 0.0
    assert all(close(batched[n], alone[n], floor_of(alone)) for n in params)


def squares_both_ways(model: nn.Module, params: dict[str, nn.Parameter], x: torch.Tensor, weights: torch.Tensor):
    """``sum_b w_b g_b^2`` of ``model(x).sum()``'s samples: a backward pass per sample, and one batched pass."""
    alone = {n: torch.zeros_like(p) for n, p in params.items()}
    for b in range(x.shape[0]):
        grads = torch.autograd.grad(model(x[b : b + 1]).sum(), list(params.values()))
        for name, g in zip(params, grads):
            alone[name] += weights[b] * g.square()
    batched = {n: torch.zeros_like(p) for n, p in params.items()}
    squares = PerSampleSquares(model, params, batched)
    with squares.recording(x.shape[0]):
        out = model(x).sum()
    squares.add(out, weights)
    return alone, batched


@pytest.mark.parametrize(
    "conv",
    [
        dict(kernel_size=3, stride=2, padding=1, bias=True),
        dict(kernel_size=(2, 3), dilation=2, padding="valid", bias=False),
        dict(kernel_size=4, stride=4),  # a ViT's patch embedding
    ],
)
def test_a_convolutions_per_sample_squares_are_each_samples_own(conv):
    """Strides, padding, dilation and a non-square kernel: the patches (``F.unfold``) line up with the kernel's
    flattened rows, or the squares differ."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(3, 5, **conv), nn.Tanh(), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(4, 3, 12, 12)
    model(x)  # sizes the lazy layer
    params = dict(model.named_parameters())
    alone, batched = squares_both_ways(model, params, x, torch.tensor([1.0, 0.5, 2.0, 0.25]))
    assert float(alone["0.weight"].abs().max()) > 0
    assert [n for n in params if not close(batched[n], alone[n], floor_of(alone))] == []


@pytest.mark.parametrize("conv", [dict(groups=3), dict(padding="same"), dict(padding=1, padding_mode="reflect")])
def test_a_convolution_the_rebuild_does_not_cover_is_refused_by_name(conv):
    model = nn.Sequential(nn.Conv2d(3, 3, 3, **conv))
    params = dict(model.named_parameters())
    with pytest.raises(ValueError, match=r"another kind of layer or share a weight: 0 \(Conv2d\)"):
        PerSampleSquares(model, params, {n: torch.zeros_like(p) for n, p in params.items()})


def test_a_vits_every_weight_gets_each_samples_own_squared_gradient():
    """tiny-vit's every parameter (the patch embedding's convolution, the class token, the position embedding, the
    blocks, the head), weighted, against a backward pass per sample; and with register tokens and a position
    embedding that leaves the class token out (``no_embed_class``), the token rows of other layouts."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(3)
    tiny = ClassifierModel(build_backbone(RunConfig(backbone="tiny-vit")), 7, 1).eval()
    other = VisionTransformer(
        img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3, reg_tokens=2, no_embed_class=True
    ).eval()
    x = torch.randn(4, 3, 16, 16)
    weights = torch.tensor([1.0, 0.5, 2.0, 0.25])
    for model in (Pixels(tiny), other):
        for p in model.parameters():
            p.requires_grad_(True)
        params = {n: p for n, p in model.named_parameters() if ".lora_" not in n}
        assert {"cls_token", "pos_embed"} <= {n.rsplit(".", 1)[-1] for n in params}
        alone, batched = squares_both_ways(model, params, x, weights)
        tokens = [n for n in params if n.endswith(("_token", "pos_embed", "proj.weight"))]
        assert len(tokens) >= 3 and all(float(alone[n].abs().max()) > 0 for n in tokens)
        assert [n for n in params if not close(batched[n], alone[n], floor_of(alone))] == []


class Pixels(nn.Module):
    """A ViT classifier's logits of a pixel batch."""

    def __init__(self, model: ClassifierModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model({"pixel_values": x})[0]


def test_a_vit_whose_tokens_bypass_the_tap_is_refused_not_left_out():
    """Were a ViT to embed positions without passing its ``pos_drop`` (another timm layout), its tokens' per-sample
    gradients would go unread and a clip would miss them: the pass is refused."""
    torch.manual_seed(3)
    model = Pixels(ClassifierModel(build_backbone(RunConfig(backbone="tiny-vit")), 7, 1).eval())
    vit = model.model.backbone.vit
    vit._pos_embed = lambda x: torch.cat([vit.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + vit.pos_embed
    params = {n: p for n, p in model.named_parameters() if ".lora_" not in n}
    squares = PerSampleSquares(model, params, {n: torch.zeros_like(p) for n, p in params.items()})
    with pytest.raises(ValueError, match="VisionTransformer's position-embedded tokens did not pass its pos_drop"):
        with squares.recording(2):
            model(torch.randn(2, 3, 16, 16))
