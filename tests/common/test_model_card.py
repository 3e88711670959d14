"""The export's card: a versioned JSON round trip that refuses what a reader would misread."""

from __future__ import annotations

import dataclasses
import json

import pytest

from common.wire.model_card import FORMAT, VERSION, Backbone, ModelCard, Preprocessing


def card(**changes) -> ModelCard:
    base = dict(
        classes=["alarm", "balance", "music"],
        backbone=Backbone("minilm", 0, "/models/all-MiniLM-L6-v2"),
        preprocessing=Preprocessing(max_length=16),
        weights="adapter",
        lora_scale=1.0,
        num_classes=3,
        feature_dim=384,
        tasks=[[0, 2], [2, 3]],
        tasks_trained=1,
        method="lorm",
        run_id="r",
    )
    return ModelCard(**{**base, **changes})


def test_round_trip_keeps_every_field_and_writes_format_and_version():
    original = card(parts=["prompts"])
    text = original.to_json()
    assert json.loads(text)["format"] == FORMAT and json.loads(text)["version"] == VERSION
    assert ModelCard.from_json(text) == original
    assert original.seen_classes == 2  # one task of two learned: the third class is not scored yet


def test_another_version_or_format_is_refused_by_name():
    v = json.loads(card().to_json())
    with pytest.raises(ValueError, match=r"version 3: this reader knows versions \(1, 2\)"):
        ModelCard.from_json(json.dumps({**v, "version": 3}))
    with pytest.raises(ValueError, match="not a lorm-model card"):
        ModelCard.from_json(json.dumps({**v, "format": "peft"}))
    with pytest.raises(ValueError, match="preprocessing has no field 'tokenizer'"):
        ModelCard.from_json(json.dumps({**v, "preprocessing": {"max_length": 8, "tokenizer": "x"}}))


def test_a_version_1_card_names_its_method_strategy_and_is_still_read():
    v = json.loads(card().to_json())
    old = {k: val for k, val in v.items() if k != "method"} | {"version": 1, "strategy": "lorm"}
    assert ModelCard.from_json(json.dumps(old)) == card()
    with pytest.raises(ValueError, match="KeyError: 'method'"):  # version 2 names it method
        ModelCard.from_json(json.dumps({**old, "version": 2}))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"classes": ["a", "b"]}, "2 class names for a head of 3 classes"),
        ({"classes": ["a", "a", "b"]}, "class names repeat"),
        ({"tasks": [[0, 2], [1, 3]]}, "not contiguous"),
        ({"tasks": [[0, 2]]}, "not contiguous"),
        ({"tasks_trained": 3}, "tasks_trained 3 is not in 1..2"),
        ({"weights": "dora"}, "weights 'dora'"),
    ],
)
def test_an_inconsistent_card_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        card(**changes)


def test_missing_says_what_the_exporter_did_not_know():
    assert card().missing() == []
    gaps = card(classes=None, preprocessing=Preprocessing(max_length=None)).missing()
    assert len(gaps) == 2 and "data.classes" in gaps[0] and "max_length" in gaps[1]
    assert dataclasses.replace(card(), classes=None).missing() == [gaps[0]]
