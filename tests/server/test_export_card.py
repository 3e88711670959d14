"""The coordinator's card of an export: the class order the clients use, written after every file it names."""

from __future__ import annotations

import pytest
import torch

from client.datasets import load_dataset
from common.run.config import RunConfig
from common.run.schedule import configured_classes
from common.wire.messages import LowRank, ModelSpec
from common.wire.model_card import CARD_FILE, ModelCard
from server import results
from server.export import model_card
from server.results import RunReporter, TrainedModel

from exports import CLASSES, own_text_config


@pytest.mark.parametrize(
    "changes",
    [{}, {"class_order": "alphabetical"}, {"num_classes": 4}, {"class_order": "alphabetical", "num_classes": 3}],
)
def test_configured_classes_are_the_order_the_clients_load(changes):
    # the setting in another order than the files', so that sorting and cutting show
    config = own_text_config(**changes)
    config.settings["data"]["classes"] = list(reversed(CLASSES))
    assert configured_classes(config) == load_dataset(config).class_names


def test_a_dataset_that_reads_its_own_class_names_leaves_them_unnamed():
    config = RunConfig(dataset="clinc150", settings={"data": {"classes": ["x", "y"]}})  # not read by clinc150
    assert configured_classes(config) is None
    assert configured_classes(RunConfig(dataset="textfile")) is None


SPEC = ModelSpec({"enc.q": (4, 3)}, feature_dim=5, num_classes=6, export_prefix="enc.", base_model="/m")


def finish(reporter: RunReporter, config: RunConfig) -> None:
    adapter = {"enc.q": LowRank(torch.ones(4, 2), torch.ones(2, 3))}
    summary = {"accuracy": [[50.0], [50.0, 60.0]], "faa": 55.0, "faa_weighted": 55.0}
    reporter.finish(config, TrainedModel(SPEC, adapter, torch.zeros(6, 5), torch.zeros(6)), summary)


def test_the_card_is_written_after_the_files_it_names(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(
        results, "export_card", lambda out, card: seen.append(sorted(p.name for p in out.iterdir())) or None
    )
    finish(RunReporter(tmp_path), own_text_config(rank=2))
    assert {"adapter", "head.safetensors", "metrics.json", "config.json"} <= set(seen[0])


def test_the_card_records_the_run_and_what_the_model_has_learned(tmp_path):
    finish(RunReporter(tmp_path), own_text_config(rank=2, lora_scale=0.5))
    card = ModelCard.from_json((tmp_path / CARD_FILE).read_text())
    assert card.classes == CLASSES and card.preprocessing.max_length == 8 and card.backbone.base_model == "/m"
    assert (card.weights, card.lora_scale, card.tasks_trained, card.seen_classes) == ("adapter", 0.5, 2, 4)


def test_an_export_being_replaced_is_no_export_until_whole(tmp_path, monkeypatch):
    finish(RunReporter(tmp_path), own_text_config(rank=2))
    assert (tmp_path / CARD_FILE).is_file()

    def cut(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(results, "export_head", cut)
    with pytest.raises(OSError):
        finish(RunReporter(tmp_path), own_text_config(rank=2))
    assert not (tmp_path / CARD_FILE).exists()  # a reader must not pair the old card with new tensors


def test_max_length_zero_is_unknown_to_the_coordinator():
    card = model_card(own_text_config(max_length=0), SPEC, torch.zeros(6, 5), weights="none", tasks_trained=1, parts=[])
    assert card.preprocessing.max_length is None and "max_length" in card.missing()[0]


def test_the_clients_description_names_what_the_configuration_leaves_open():
    """max_length 0 and a dataset that names its classes: the card takes both from the clients' description."""
    named = ModelSpec(SPEC.layers, 5, 6, "enc.", "/m", classes=tuple("uvwxyz"), max_length=24)
    config = RunConfig(dataset="textfile", max_length=0, num_tasks=2)
    card = model_card(config, named, torch.zeros(6, 5), weights="none", tasks_trained=1, parts=[])
    assert card.classes == list("uvwxyz") and card.preprocessing.max_length == 24 and card.missing() == []
    # data.classes names them too (the same, as the clients load them): the configuration's schedule is the card's
    configured = own_text_config(max_length=0)
    card = model_card(configured, named, torch.zeros(6, 5), weights="none", tasks_trained=1, parts=[])
    assert card.classes == CLASSES and card.preprocessing.max_length == 24
