"""Backbones: T5 features, LoRA placement per family, and clear errors when weights are missing."""

import pytest
import torch

from client.backbone_builders import build_backbone
from client.classifier import build_model
from common.run.config import RunConfig


def test_tiny_t5_one_decoder_token_features_and_lora_everywhere():
    model = build_model(RunConfig(backbone="tiny-t5", rank=1), num_classes=4)
    names = model.layer_names
    assert any(".EncDecAttention." in n for n in names) and any(n.endswith(".wo") for n in names)
    assert all(n.startswith("t5.") for n in names)
    inputs = model.backbone.encode(["hello there", "a b c d"])
    logits, features = model(inputs)
    assert logits.shape == (2, 4) and features.shape == (2, model.backbone.feature_dim)


def test_same_seed_same_w0():
    a = build_backbone(RunConfig(backbone="tiny-t5", model_seed=4))
    b = build_backbone(RunConfig(backbone="tiny-t5", model_seed=4))
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)


@pytest.mark.parametrize("backbone", ["t5:/nonexistent/t5-small", "vit-b16-in21k"])
def test_missing_weights_say_where_and_how(backbone, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="could not load pretrained") as err:
        build_backbone(RunConfig(backbone=backbone))
    assert "download" in str(err.value)


def test_unknown_backbone_lists_choices():
    with pytest.raises(ValueError, match="minilm"):
        build_backbone(RunConfig(backbone="no-such-model"))
