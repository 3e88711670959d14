"""The coordinator fixes the model: a client cannot describe an impossible one or impose another (attack 1)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pytest

from common.run.config import RunConfig
from common.run.schedule import MAX_NAME
from common.wire.messages import MAX_CLASS_NAME, ModelSpec
from server.checks import Options, Refused
from server.coordinator import Coordinator

SPEC = ModelSpec(layers={"l1": (5, 4), "l2": (3, 6)}, feature_dim=4, num_classes=6)
CONFIG = RunConfig(run_id="unit", num_clients=2, num_tasks=2, rounds_per_task=2, rank=2, seed=1)
# The attack as it was sent, with client-0's credentials, before any real client described its model.
IMPOSSIBLE = '{"layers":{"l":[1000000000000,32]},"feature_dim":32,"num_classes":9}'


def state_files(coord: Coordinator) -> dict[str, bytes]:
    return {
        str(p.relative_to(coord.store.root)): p.read_bytes()
        for p in sorted(Path(coord.store.root).rglob("*"))
        if p.is_file()
    }


def test_an_impossible_model_is_refused_before_anything_is_allocated(tmp_path):
    coord = Coordinator(CONFIG, tmp_path / "state")
    coord.join("c0", 0)
    before = state_files(coord)
    with pytest.raises(Refused) as err:
        coord.describe("c0", ModelSpec.from_json(IMPOSSIBLE))
    assert err.value.code == "INVALID_ARGUMENT" and "a dimension of 1000000000000, over the cap" in str(err.value)
    wide = ModelSpec(layers=SPEC.layers, feature_dim=4, num_classes=6, params={"w": (200_000, 200_000)})
    with pytest.raises(Refused, match="one step of this model needs about .* bytes, over the cap"):
        coord.describe("c0", wide)
    assert state_files(coord) == before and coord.run.spec is None and coord.run.strategy is None
    coord.describe("c0", SPEC)  # the real model still fixes the run
    coord.join("c1", 1)
    coord.describe("c1", SPEC)
    assert coord.status()["state"] == "running"


def test_the_operators_spec_fixes_the_model_and_another_is_refused_naming_the_difference(tmp_path):
    coord = Coordinator(CONFIG, tmp_path / "state", Options(model_spec=SPEC))
    assert coord.run.spec == SPEC and coord.run.strategy is not None  # known before any client describes
    coord.join("c0", 0)
    other = ModelSpec(layers={"l1": (5, 4), "l2": (3, 7)}, feature_dim=4, num_classes=6)
    with pytest.raises(Refused) as err:
        coord.describe("c0", other)
    assert err.value.code == "INVALID_ARGUMENT"
    assert "layers 'l2' of shape (3, 7) instead of (3, 6)" in str(err.value)
    with pytest.raises(Refused, match="num_classes 9 instead of 6"):
        coord.describe("c0", ModelSpec(layers=SPEC.layers, feature_dim=4, num_classes=9))
    coord.describe("c0", SPEC)
    # A restart with another --model-spec than the state's is refused at start-up.
    with pytest.raises(ValueError, match="differs from --model-spec"):
        Coordinator(CONFIG, tmp_path / "state", Options(model_spec=other))
    assert Coordinator(CONFIG, tmp_path / "state", Options(model_spec=SPEC)).run.spec == SPEC


def test_over_grpc_the_attack_is_invalid_argument_and_the_run_goes_on(tmp_path):
    from client.transport import Backoff, CoordinatorClient, Rejected
    from common.infra.tls import Security
    from proto import lorm_pb2 as pb
    from server.service import create_server

    coord = Coordinator(CONFIG, tmp_path / "state")
    server, port = create_server(coord, "127.0.0.1:0", security=Security(insecure=True))
    server.start()
    try:
        clients = [
            CoordinatorClient(
                f"127.0.0.1:{port}", f"c{i}", Backoff(give_up_s=3), call_timeout_s=5, security=Security(insecure=True)
            )
            for i in range(2)
        ]
        for i, c in enumerate(clients):
            c.join(i)
        request = pb.ModelDescription(run_id="unit", client_id="c0", model_spec_json=IMPOSSIBLE)
        with pytest.raises(grpc.RpcError) as err:
            clients[0].stub.Describe(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for c in clients:
            c.describe(SPEC)
        with pytest.raises(Rejected) as refused:  # another model after the run's is fixed: named, not UNKNOWN
            clients[1].describe(ModelSpec(layers=SPEC.layers, feature_dim=4, num_classes=9))
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert coord.status()["state"] == "running"
    finally:
        server.stop(0)


NAMED = ModelSpec(
    layers=SPEC.layers, feature_dim=4, num_classes=6, classes=("a", "b", "c", "d", "e", "f"), max_length=16
)


def test_a_description_names_its_classes_and_max_length_and_an_older_one_still_reads():
    assert ModelSpec.from_json(NAMED.to_json()) == NAMED
    older = '{"layers":{"l1":[5,4],"l2":[3,6]},"feature_dim":4,"num_classes":6}'  # no classes, no max_length
    assert ModelSpec.from_json(older) == SPEC and SPEC.classes is None and SPEC.max_length is None
    assert SPEC.completed_by(NAMED) and not NAMED.completed_by(SPEC) and not NAMED.completed_by(NAMED)
    assert MAX_CLASS_NAME == MAX_NAME  # a description holds any name a schedule may
    for bad, why in [
        ('"classes": ["a", "b"]', "expected a list of a name per head row"),
        ('"classes": ["a", "a", "c", "d", "e", "f"]', "class names repeat: \\['a'\\]"),
        ('"classes": ["a", "", "c", "d", "e", "f"]', "strings of 1 to 1000 characters"),
        ('"classes": ["a", 2, "c", "d", "e", "f"]', "strings of 1 to"),
        ('"classes": "abcdef"', "expected a list"),
        ('"max_length": -1', "max_length should be 0"),
    ]:
        with pytest.raises(ValueError, match=why):
            ModelSpec.from_json(older[:-1] + ", " + bad + "}")


def test_clients_whose_class_names_or_max_length_differ_are_refused_naming_the_difference(tmp_path):
    coord = Coordinator(CONFIG, tmp_path / "state")
    coord.join("c0", 0)
    coord.join("c1", 1)
    coord.describe("c0", NAMED)
    swapped = dataclasses.replace(NAMED, classes=("a", "c", "b", "d", "e", "f"))
    with pytest.raises(Refused, match="classes in another order: head row 1 is 'c' instead of 'b'"):
        coord.describe("c1", swapped)
    with pytest.raises(Refused, match=r"classes: unexpected \['z'\], missing \['f'\]"):
        coord.describe("c1", dataclasses.replace(NAMED, classes=("a", "b", "c", "d", "e", "z")))
    with pytest.raises(Refused, match="max_length 24 instead of 16"):
        coord.describe("c1", dataclasses.replace(NAMED, max_length=24))
    with pytest.raises(Refused, match="max_length None instead of 16"):  # an older client cannot be checked
        coord.describe("c1", SPEC)
    with pytest.raises(Refused, match="classes unknown instead of named"):
        coord.describe("c1", dataclasses.replace(NAMED, classes=None))
    coord.describe("c1", NAMED)
    assert coord.status()["state"] == "running"


def test_a_run_described_by_an_older_version_admits_clients_that_know_more_and_only_the_operator_completes_it(
    tmp_path,
):
    """A client may not write into the run's description what the operator's (older) file left open: it is
    admitted, the description unchanged (a hostile client would otherwise name the export's classes); a restart
    with a current --model-spec completes it, and that is committed."""
    coord = Coordinator(CONFIG, tmp_path / "state", Options(model_spec=SPEC))  # an older lorm-spec's file
    coord.join("c0", 0)
    coord.describe("c0", NAMED)
    coord.describe("c0", dataclasses.replace(NAMED, classes=("z", "y", "x", "w", "v", "u")))  # nothing to compare
    assert coord.run.spec == SPEC
    with pytest.raises(Refused, match="num_classes"):  # what the description knows is still checked
        coord.describe("c0", dataclasses.replace(NAMED, num_classes=5, classes=NAMED.classes[:5]))
    assert Coordinator(CONFIG, tmp_path / "state", Options(model_spec=NAMED)).run.spec == NAMED
    assert Coordinator(CONFIG, tmp_path / "state", Options(model_spec=SPEC)).run.spec == NAMED
