"""Exports of an earlier version (no scoring plan: the head on the backbone's features, W0 plus an adapter or
delta): the served model computes what the clients' model with the delta as LoRA factors (or added weights)
computes, and exports that are not this model are refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from client.classifier import build_model, model_spec
from common.adapters.lora import lora_layers
from common.wire.messages import LowRank
from common.wire.model_card import CARD_FILE, ModelCard
from serve.model import Classifier, ExportError
from server.export import export_adapter, export_card, export_dense_delta, export_head, model_card

from exports import own_text_config
from tolerance import assert_close_to_dtype

CONFIG = own_text_config(rank=1, lora_scale=0.5, num_tasks=2)  # classes 0-2 and 3-5
TEXTS = ["set an alarm for six in the morning please now", "how much money is left", "hi", "play some jazz"]


def reference_model(head_w, head_b):
    model = build_model(CONFIG, 6)
    with torch.no_grad():
        model.head.weight.copy_(head_w)
        model.head.bias.copy_(head_b)
    return model.eval()


def export(tmp_path, weights: str, tasks_trained: int = 2):
    """A hand-made export of random factors (or weights) and head; and the clients' model holding them."""
    gen = torch.Generator().manual_seed(0)
    model = build_model(CONFIG, 6)
    spec = model_spec(model)
    head_w, head_b = torch.randn(6, spec.feature_dim, generator=gen), torch.randn(6, generator=gen)
    reference = reference_model(head_w, head_b)
    if weights == "adapter":
        adapter = {
            n: LowRank(torch.randn(o, 3, generator=gen) / 4, torch.randn(3, i, generator=gen) / 4)
            for n, (o, i) in spec.layers.items()
        }
        export_adapter(tmp_path / "adapter", adapter, spec, rank_per_task=1, lora_scale=CONFIG.lora_scale)
        for name, layer in lora_layers(reference.backbone).items():  # the merged model as the clients hold it
            layer.set_extra(CONFIG.lora_scale * adapter[name].b, adapter[name].a)
    else:
        delta = {n: torch.randn(s, generator=gen) / 50 for n, s in spec.params.items()}
        export_dense_delta(tmp_path / "delta.safetensors", delta, spec)
        with torch.no_grad():
            for name, p in reference.dense_params().items():
                p += delta[name]
    export_head(tmp_path, head_w, head_b)
    card = model_card(CONFIG, spec, head_w, weights=weights, tasks_trained=tasks_trained, parts=[])
    export_card(tmp_path, card)
    return reference


@pytest.mark.parametrize("weights", ["adapter", "delta"])
def test_the_rebuilt_model_scores_as_the_clients_model(tmp_path, weights):
    reference = export(tmp_path, weights)
    served = Classifier(tmp_path)
    inputs = served.encode(TEXTS)
    with torch.no_grad():
        expected = torch.softmax(reference(reference.backbone.encode(TEXTS))[0], dim=1)  # (4, 6)
    got = served.probabilities(inputs)
    assert not torch.allclose(expected, torch.softmax(reference_model(*_head(tmp_path))(inputs)[0], dim=1))
    assert_close_to_dtype(got, expected, torch.float32, terms=4 * 384)
    assert [p.index for p in served.predict(TEXTS)] == expected.argmax(1).tolist()


def _head(path):
    from safetensors.torch import load_file

    head = load_file(str(path / "head.safetensors"))
    return head["weight"], head["bias"]


def test_only_the_classes_learned_so_far_are_scored(tmp_path):
    export(tmp_path, "adapter", tasks_trained=1)
    served = Classifier(tmp_path)
    assert served.probabilities(served.encode(TEXTS)).shape == (4, 3)
    assert {p.index for p in served.predict(TEXTS)} <= {0, 1, 2}
    assert served.describe()["classes"] == ["alarm", "balance", "greeting"]


def rewrite_card(path, **changes) -> None:
    card = ModelCard.from_json((path / CARD_FILE).read_text())
    (path / CARD_FILE).write_text(dataclasses.replace(card, **changes).to_json())


EARLIER = "an export of an earlier version without its scoring plan"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"method": "l2p"}, f"{EARLIER}, of method 'l2p', whose clients scored with more than the head"),
        ({"method": "ridge"}, f"{EARLIER}, of method 'ridge', whose"),
        ({"parts": ["prototypes"]}, rf"{EARLIER}, of method 'lorm' with parts \['prototypes'\]"),
        ({"method": "nonesuch"}, "method 'nonesuch' is not one of this version's"),
        ({"classes": None}, "does not name the class names"),
    ],
)
def test_an_export_this_version_cannot_score_as_its_run_did_is_refused_by_name(tmp_path, changes, message):
    """A hand-made export here is one of an earlier version: no scoring plan, the head on the backbone's features.
    It is served (the tests above) for the methods whose clients scored so, and refused for any other, and for a
    method this version does not have."""
    export(tmp_path, "adapter")
    rewrite_card(tmp_path, **changes)
    with pytest.raises(ExportError, match=message):
        Classifier(tmp_path)


def test_a_head_for_another_backbone_is_refused(tmp_path):
    export(tmp_path, "adapter")
    card = ModelCard.from_json((tmp_path / CARD_FILE).read_text())
    rewrite_card(tmp_path, backbone=dataclasses.replace(card.backbone, model_seed=1))
    Classifier(tmp_path)  # another seed: the same shapes, a valid (if different) W0
    export_head(tmp_path, torch.zeros(6, 7), torch.zeros(6))
    with pytest.raises(ExportError, match=r"expected weight \(6, 32\)"):
        Classifier(tmp_path)


@pytest.mark.parametrize(
    ("backbone", "named"),
    [
        (dict(name="bert:someone/their-model"), "names backbone 'bert:someone/their-model', not one of this project's"),
        (dict(name="/tmp/their-directory"), "names backbone '/tmp/their-directory'"),
        (dict(weights_file="/tmp/their.safetensors"), "names the weights file '/tmp/their.safetensors'"),
    ],
)
def test_a_card_does_not_choose_the_code_and_weights_the_server_loads(tmp_path, backbone, named):
    """An export is data: a hub repository, a directory or a weights file its card names would run its author's
    code or weights in the server. The card's source is followed only when it is one of the project's backbones;
    the operator names any other (``lorm-serve --backbone``, ``--weights``), and the card's choice is then ignored."""
    export(tmp_path, "adapter")
    card = ModelCard.from_json((tmp_path / CARD_FILE).read_text())
    rewrite_card(tmp_path, backbone=dataclasses.replace(card.backbone, **backbone))
    with pytest.raises(ExportError, match=named):
        Classifier(tmp_path)
    Classifier(tmp_path, source=card.backbone.name, weights="")  # the operator's own: the run's tiny-bert
