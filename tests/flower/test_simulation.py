"""The run on Flower's simulation engine (Ray backend) equals the in-process engine's, bit for bit: the same
coordinator folds the same clients' updates, only the transport differs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import Context, Message  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402

from common.privacy.ledger import privacy_summary  # noqa: E402
from common.run.config import RunConfig  # noqa: E402
from common.run.presets import preset  # noqa: E402
from engine.simulation import run_inprocess  # noqa: E402
from flower import client_app, records  # noqa: E402
from flower.server_app import SECURE_ON_FLOWER, RunRefused, settings  # noqa: E402
from flower.simulation import simulate  # noqa: E402
from proto import codec  # noqa: E402

from own_data import disjoint_clients, owned_config  # noqa: E402

pytestmark = pytest.mark.long(60)

CENTRAL = {"epsilon": 1.0, "clip": 2.0, "seed": 5, "mode": "central"}


def _same_as_in_process(config: RunConfig, tmp_path: Path, supernodes: int | None = None) -> dict:
    """The checks; the in-process run's privacy statement."""
    native = run_inprocess(config)
    coord = simulate(config, supernodes=supernodes).coord
    assert privacy_summary(coord.run.history) == privacy_summary(native.history)
    strategy = coord.run.strategy
    assert strategy is not None
    assert coord.run.matrix.correct == native.matrix.correct and coord.run.matrix.total == native.matrix.total
    assert torch.equal(strategy.head_w, native.head_weight) and torch.equal(strategy.head_b, native.head_bias)
    adapter = strategy.adapter()
    assert adapter.keys() == native.adapter.keys()
    for name, low in adapter.items():
        assert torch.equal(low.b, native.adapter[name].b) and torch.equal(low.a, native.adapter[name].a), name
    assert [h["phase"] for h in coord.run.history] == [h["phase"] for h in native.history]
    return privacy_summary(native.history)


def test_own_data_of_each_virtual_node_and_a_private_closed_form_head_equal_the_in_process_engine(
    tmp_path: Path,
) -> None:
    """``data.clients_dir``: virtual node i reads clients_dir/client<i>.csv, as the in-process engine's client i;
    the ridge head under central differential privacy (the coordinator noises the summed statistics) folds the
    same statistics and draws the same noise, and the privacy statement is the in-process engine's."""
    config = owned_config(disjoint_clients(tmp_path / "clients"), method="ridge", run_id="flower-owned")
    config = dataclasses.replace(config, settings={**config.settings, "dp": CENTRAL})
    statement = _same_as_in_process(config, tmp_path)
    assert statement["privacy"]["mode"] == "central" and statement["privacy"]["epsilon"] <= CENTRAL["epsilon"]


@pytest.mark.slow  # 37 s of a worker: the default suite's local-DP run below has spare nodes too, and the deployment
# test runs the tiny preset's tasks on Flower
def test_the_tiny_preset_on_a_federation_larger_than_the_run_equals_the_in_process_engine(tmp_path: Path) -> None:
    """The tiny preset on five virtual nodes, three clients: nodes 0 to 2 (by ``partition-id``) hold the run's
    slots, the other two are sent nothing past their hello, and the run is the in-process engine's."""
    _same_as_in_process(RunConfig(**{**preset("tiny"), "run_id": "flower-tiny"}), tmp_path, supernodes=5)


def test_local_differential_privacy_on_flower_is_the_in_process_runs_noise_and_statement(tmp_path: Path) -> None:
    """Each ClientApp trains with DP-SGD and noises its Grams by its own ledger: the same noise, head and privacy
    statement as the in-process engine's, because the noise is keyed by the seed, the step and the client's slot.
    On one node more than the run's clients: the spare node is sent nothing past its hello."""
    dp = {"epsilon": 8.0, "clip": 1.0, "seed": 5, "mode": "local", "sample_rate": 0.5}
    changes = {"run_id": "flower-dp-lorm", "num_tasks": 1, "rounds_per_task": 1}
    config = RunConfig(**{**preset("tiny"), **changes, "settings": {**preset("tiny")["settings"], "dp": dp}})
    statement = _same_as_in_process(config, tmp_path, supernodes=config.num_clients + 1)
    assert statement["privacy"]["mode"] == "local" and statement["privacy"]["epsilon"] <= dp["epsilon"]


def test_a_run_with_secure_aggregation_is_refused_at_start_naming_the_native_coordinator() -> None:
    with pytest.raises(RunRefused) as refused:
        settings({"lorm-args": "--preset tiny --set secagg.enabled=true"})
    assert str(refused.value) == SECURE_ON_FLOWER and "lorm-server" in str(refused.value)


def test_a_node_whose_update_names_another_client_fails_the_run_before_it_is_recorded() -> None:
    """The hostile node computes its update honestly, then names another client in it: the ServerApp goes by the
    node's authenticated id, so the push is refused and the run fails naming it."""
    forger = ClientApp()
    forger.query("hello")(client_app.hello)
    forger.query("join")(client_app.join)

    @forger.train("lorm")
    def train(msg: Message, context: Context) -> Message:
        honest = records.wire(client_app._step(msg, context).content)
        envelope, update = codec.update_from_proto(records.update_chunks(honest))
        forged = dataclasses.replace(update, client_id="node-1")
        return Message(records.update_content(forged, envelope.idempotency_key), reply_to=msg)

    changes = {"run_id": "flower-forged", "num_clients": 2, "num_tasks": 1, "rounds_per_task": 1}
    config = RunConfig(**{**preset("tiny"), **changes})
    with pytest.raises(RunRefused, match="a push of 'node-1' from node-"):
        simulate(config, nodes=forger)
