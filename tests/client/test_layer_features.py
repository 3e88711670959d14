"""The closed-form heads' per-layer features (settings ``layers``, ``pool``, ``norm`` of ``ncm``/``ridge``)."""

import pytest
import torch

from client.backbones import masked_mean
from client.classifier import build_model
from client.features import backbone_features
from common.methods.closed_form import NcmSettings, RidgeSettings
from common.run.config import RunConfig

from tolerance import assert_close_to_dtype

TEXTS = ["set an alarm for six", "what is my balance", "play some jazz please now", "hi"]


def model_of(backbone: str):
    config = RunConfig(run_id="t", backbone=backbone, max_length=12, extra={"synthetic_classes": 4})
    model = build_model(config, 4).eval()
    if backbone == "tiny-vit":
        inputs = model.backbone.encode(list(torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))))
    else:
        inputs = model.backbone.encode(TEXTS)
    return model, inputs


@torch.no_grad()
def test_the_last_layer_mean_is_the_text_encoders_own_feature():
    model, inputs = model_of("tiny-bert")
    own = backbone_features(model, inputs, None)
    last = backbone_features(model, inputs, RidgeSettings(layers=(-1,)))
    torch.testing.assert_close(last, own, rtol=0, atol=0)


@torch.no_grad()
def test_layers_are_pooled_over_kept_tokens_or_by_the_first_token():
    model, inputs = model_of("tiny-bert")
    encoder = model.backbone.encoder
    states = encoder(**inputs, output_hidden_states=True).hidden_states  # embeddings, block 1, block 2
    mask = inputs["attention_mask"]
    got = backbone_features(model, inputs, NcmSettings(layers=(0, 2)))
    torch.testing.assert_close(got, torch.cat([masked_mean(states[0], mask), masked_mean(states[2], mask)], 1))
    # padding does not move the mean: the short sentence's features are those of it alone
    alone = backbone_features(model, model.backbone.encode(TEXTS[3:]), NcmSettings(layers=(0, 2)))
    # the padded batch's kernels round otherwise: sums of the hidden width, through two blocks
    assert_close_to_dtype(got[3:], alone, torch.float32, terms=2 * 4 * 64)
    first = backbone_features(model, inputs, NcmSettings(layers=(1,), pool="first"))
    torch.testing.assert_close(first, states[1][:, 0])


@torch.no_grad()
def test_layer_norm_scales_each_layer_to_mean_0_and_deviation_1():
    model, inputs = model_of("tiny-bert")
    x = backbone_features(model, inputs, NcmSettings(layers=(0, 1, 2), norm="layer"))
    d = model.backbone.feature_dim
    blocks = x.view(len(TEXTS), 3, d)
    eps = torch.finfo(x.dtype).eps
    torch.testing.assert_close(blocks.mean(2), torch.zeros(len(TEXTS), 3), rtol=0, atol=64 * eps)
    torch.testing.assert_close(blocks.std(2, correction=0), torch.ones(len(TEXTS), 3), rtol=1e-3, atol=0)


@pytest.mark.parametrize("backbone", ["tiny-bert", "tiny-t5", "tiny-vit"])
@torch.no_grad()
def test_every_backbone_gives_layers_times_hidden_features(backbone):
    model, inputs = model_of(backbone)
    settings = RidgeSettings(layers=(0, -1), pool="first")
    x = backbone_features(model, inputs, settings)
    assert x.shape == (len(next(iter(inputs.values()))), settings.feature_width(model.backbone.feature_dim))
    assert settings.head_width(model.backbone.feature_dim) == 2 * model.backbone.feature_dim
    with pytest.raises(ValueError, match="hidden states 0..2"):
        backbone_features(model, inputs, NcmSettings(layers=(3,)))


def test_settings_refuse_what_they_cannot_mean():
    with pytest.raises(ValueError, match="pool must be one of"):
        NcmSettings(layers=(1,), pool="max")
    with pytest.raises(ValueError, match="norm must be one of"):
        RidgeSettings(layers=(1,), norm="batch")
    with pytest.raises(ValueError, match="names a layer twice"):
        RidgeSettings(layers=(1, 1))
    with pytest.raises(ValueError, match="which is empty"):
        RidgeSettings(norm="layer")
    assert RidgeSettings(rp_dim=500, layers=(1, 2)).head_width(32) == 500
    assert RidgeSettings().head_width(32) == 32


class Texts:
    """:class:`client.features.Batches` over :data:`TEXTS` (labels unused)."""

    def __init__(self, model) -> None:
        self.model, self.labels = model, torch.zeros(len(TEXTS), dtype=torch.long)

    def batch(self, idx, device):
        return self.model.backbone.encode([TEXTS[int(i)] for i in idx]), self.labels[idx]


def test_a_dropout_view_is_seeded_and_leaves_the_model_and_the_generators_as_they_were():
    """``ridge.views``: the features of a view differ from the clean ones (the dropout was on), repeat with the seed
    and differ across seeds; the model is back in eval mode, and the global generator's stream is untouched."""
    from client.features import extract

    model, _ = model_of("tiny-bert")
    data, idx, cpu = Texts(model), torch.arange(len(TEXTS)), torch.device("cpu")
    clean = extract(model, data, idx, cpu, RidgeSettings(layers=(1, 2)))
    torch.manual_seed(5)
    before = torch.get_rng_state()
    view = extract(model, data, idx, cpu, RidgeSettings(layers=(1, 2)), dropout_seed=11)
    assert torch.equal(torch.get_rng_state(), before)  # training's stream goes on as if no view was drawn
    again = extract(model, data, idx, cpu, RidgeSettings(layers=(1, 2)), dropout_seed=11)
    other = extract(model, data, idx, cpu, RidgeSettings(layers=(1, 2)), dropout_seed=12)
    assert torch.equal(view, again) and not torch.allclose(view, clean) and not torch.allclose(view, other)
    assert not any(m.training for m in model.modules())
    assert torch.equal(extract(model, data, idx, cpu, RidgeSettings(layers=(1, 2))), clean)


def test_a_backbone_without_dropout_has_no_views():
    from client.features import dropout_on

    model, _ = model_of("tiny-vit")  # timm's ViT at its default rates: no dropout
    with pytest.raises(ValueError, match="no dropout"):
        with dropout_on(model.backbone, 0, torch.device("cpu")):
            pass
