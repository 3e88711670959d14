"""Every method of the registry is put into use: a tiny run of it exported, then lorm-predict and lorm-serve on the
export answer what the run's clients' evaluation counted, count for count per task.

The export carries the plan the clients evaluated with (``scoring.safetensors`` and the card's ``scoring``), and the
server scores with the method's own client half on it (``client/scoring.py``), as the clients did: the closed-form
heads' feature map (layers, pooling, layer norm, the seeded projection drawn again and checked by its fingerprint,
ReLU, the ensemble's members), prototypes, prompt pools and keys, adapter vectors, dense deltas. A few methods, one
of each kind of scoring, run in the default suite; the rest are slow."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from serving import post_predict, serving_slot

from common.aggregation.projection import GENERATOR, draw, fingerprint
from common.methods import registry
from common.wire.model_card import CARD_FILE, SCORING_FILE, ModelCard
from serve.model import Classifier, ExportError
from serve.watch import ModelSlot

from exports import CLASSES, counted, finished_run, held_out_rows, own_text_config, per_task

# one of each way of scoring: the closed-form head on features, prototypes, a prompt pool, adapter vectors
FAST = ("ridge", "pilora", "l2p", "lorm-ia3")
# the best recipe's way of scoring, shrunk: three layers pooled and layer-normalised, four seeded projections of
# ReLU features side by side, an ensemble of four ridge heads with lambda by its own held-out error
ENSEMBLE = {"layers": [-3, -2, -1], "norm": "layer", "rp_dim": 64, "blocks": 4, "lambda_rule": "average"}


def answers(results, method: str) -> None:
    """lorm-predict's model (:class:`Classifier`) and lorm-serve over it give the run's correct counts per task."""
    rows = held_out_rows()
    texts, labels = [text for text, _ in rows], [label for _, label in rows]
    model = Classifier(results, device="cpu")
    assert model.card.method == method and model.card.scoring is not None
    predicted = [p.label for p in model.predict(texts)]
    correct, total = counted(results)
    assert sum(total) == len(rows)
    assert per_task(labels, predicted, CLASSES, model.card.tasks) == correct
    with serving_slot(ModelSlot(results, lambda path: Classifier(path, device="cpu"))) as (port, _):
        status, body = post_predict(port, {"inputs": texts})
    assert status == 200, body
    assert [p["label"] for p in body["predictions"]] == predicted


@pytest.mark.parametrize("method", FAST)
def test_each_way_of_scoring_is_served_as_the_run_evaluated(method, tmp_path):
    answers(finished_run(tmp_path / "results", method=method, rounds_per_task=1, local_epochs=1), method)


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(set(registry()) - set(FAST)))
def test_every_method_is_served_as_the_run_evaluated(method, tmp_path):
    answers(finished_run(tmp_path / "results", method=method, rounds_per_task=1, local_epochs=1), method)


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory):
    settings = own_text_config().settings | {"ridge": ENSEMBLE}
    return finished_run(tmp_path_factory.mktemp("ensemble") / "results", method="ridge", settings=settings)


def test_the_best_recipes_ensemble_on_projected_layers_is_served_as_evaluated(ensemble):
    card = ModelCard.from_json((ensemble / CARD_FILE).read_text())
    assert card.scoring is not None and card.scoring.config["settings"]["ridge"]["blocks"] == 4
    hidden = card.scoring.projection["shape"][1]  # three layers' pooled states side by side
    # the four members' projections of 64 rows each are the rows of one P
    assert card.feature_dim == 256 and card.scoring.projection["shape"] == [256, hidden] and hidden % 3 == 0
    assert card.scoring.projection["sha256"] == fingerprint(draw(card.scoring.config["seed"], 256, hidden))
    answers(ensemble, "ridge")


def rewrite(path, **scoring) -> None:
    card = ModelCard.from_json((path / CARD_FILE).read_text())
    assert card.scoring is not None
    changed = dataclasses.replace(card, scoring=dataclasses.replace(card.scoring, **scoring))
    (path / CARD_FILE).write_text(changed.to_json())


def test_a_projection_this_torch_draws_otherwise_is_refused(ensemble, tmp_path):
    """Another torch whose generator draws other numbers would apply the head to other features than it was solved
    on, and every answer would be wrong without an error: the draw is checked against the run's fingerprint."""
    import shutil

    copy = tmp_path / "export"
    shutil.copytree(ensemble, copy)
    card = ModelCard.from_json((copy / CARD_FILE).read_text())
    assert card.scoring is not None
    rewrite(copy, projection={**card.scoring.projection, "sha256": "0" * 64})
    with pytest.raises(ExportError, match="not the one the run drew"):
        Classifier(copy, device="cpu")
    rewrite(copy, projection={**card.scoring.projection, "generator": "numpy"})
    with pytest.raises(ExportError, match="drawn by 'numpy'"):
        Classifier(copy, device="cpu")


def test_the_projections_generator_draws_what_it_drew_when_pinned():
    """The seeded projection of every closed-form run (and of every export's fingerprint): a torch whose CPU
    generator draws other numbers fails here, in CI, before an export of it is served wrong."""
    p = draw(0, 4, 3)
    assert p.dtype == torch.float64 and "torch.randn float64" in GENERATOR
    assert p[0].tolist() == [-1.3905060906165072, -0.815237990194345, -0.32043769826507285]
    assert fingerprint(p) == "6ed8737d5aaa83783774b52418b447d5deed78b1843ce00e2b23b65025ea54b0"


def test_a_scoring_plan_that_does_not_fit_the_backbone_is_refused_at_load(tmp_path):
    """A tampered or truncated scoring plan fails when the export is loaded, naming it, never at a request."""
    results = finished_run(tmp_path / "results", method="ncm", rounds_per_task=1, local_epochs=1)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(results / SCORING_FILE))
    tensors["head/weight"] = tensors["head/weight"][:, :-1].contiguous()  # one feature short
    save_file(tensors, str(results / SCORING_FILE))
    with pytest.raises(ExportError, match="its scoring plan does not fit backbone 'tiny-bert' and method 'ncm'"):
        Classifier(results, device="cpu")
    (results / SCORING_FILE).unlink()
    with pytest.raises(ExportError, match=SCORING_FILE):
        Classifier(results, device="cpu")


def test_the_card_carries_no_path_of_the_machine_that_ran(tmp_path):
    """The run's configuration in the card leaves out the client-local settings: where data lay on some disk."""
    results = finished_run(tmp_path / "results", method="ncm", rounds_per_task=1, local_epochs=1)
    config = json.loads((results / CARD_FILE).read_text())["scoring"]["config"]
    assert config["data_dir"] == "" and "train_file" not in config["settings"]["data"]
    assert str(tmp_path) not in json.dumps(config) and "own-text" not in json.dumps(config["settings"])
