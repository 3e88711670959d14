"""The client's own floor (H3) and its own files (M6): what a coordinator's configuration
cannot decide for a client."""

from __future__ import annotations

import argparse

import pytest

from client.floor import Floor, FloorError, add_floor_arguments, check_floor, floor_from_args, pinned
from client.local import LocalSettingError, LocalSettings, applied, refuse_coordinator_local, split
from common.run.config import RunConfig
from common.run.settings import DataSettings, ModelSettings, SecAggSettings
from common.secagg.terms import threshold


def run(n: int = 10, **secagg) -> RunConfig:
    return RunConfig(num_clients=n, settings={"secagg": secagg} if secagg else {})


def floor(*argv: str) -> Floor:
    parser = argparse.ArgumentParser()
    add_floor_arguments(parser)
    return floor_from_args(parser.parse_args(list(argv)))


# ------------------------------------------------------------------ H3: the floor


def test_a_coordinator_that_lowers_the_threshold_to_one_is_refused_by_default():
    """The attack: threshold 1 lets the coordinator unmask any client from its own share alone."""
    low = run(10, enabled=True, threshold=1, unsafe_low_threshold=True)
    with pytest.raises(FloorError) as err:
        check_floor(low, Floor())
    assert "secagg.threshold=1" in str(err.value) and "num_clients=10" in str(err.value)
    assert "floor of 6 (mode honest's for 10)" in str(err.value)


def test_a_majority_is_accepted_and_a_raised_floor_refuses_it():
    majority = run(10, enabled=True)  # 0: a majority, 6 of 10
    accepted = check_floor(majority, Floor())
    assert (accepted.enabled, accepted.threshold, accepted.num_clients) == (True, 6, 10)
    assert "n 10 clients, threshold t 6" in accepted.describe()
    with pytest.raises(FloorError, match=r"secagg.threshold=6 .* floor of 7 \(--min-secagg-threshold 7\)"):
        check_floor(majority, floor("--min-secagg-threshold", "7"))
    assert check_floor(run(10, enabled=True, threshold=7), floor("--min-secagg-threshold", "7")).threshold == 7


def test_secure_aggregation_switched_off_is_refused_when_the_client_requires_it(monkeypatch):
    plain = run(10)
    assert check_floor(plain, Floor()).enabled is False  # no requirement: accepted, and logged as off
    with pytest.raises(FloorError, match="secagg.enabled=false.*--require-secure-aggregation"):
        check_floor(plain, floor("--require-secure-aggregation"))
    monkeypatch.setenv("LORM_REQUIRE_SECURE_AGGREGATION", "1")
    with pytest.raises(FloorError, match="LORM_REQUIRE_SECURE_AGGREGATION"):
        check_floor(plain, floor())


def test_too_few_clients_are_refused_with_or_without_secure_aggregation():
    for config in (run(2), run(2, enabled=True)):
        with pytest.raises(FloorError, match=r"num_clients=2, below this client's floor of 3 \(--min-clients 3\)"):
            check_floor(config, floor("--min-clients", "3"))
    assert check_floor(run(3), floor("--min-clients", "3")).num_clients == 3


def test_bad_floor_flags_are_refused():
    with pytest.raises(FloorError, match="--min-clients and --min-colluders must be >= 0"):
        floor("--min-clients", "-1")


def test_the_threshold_masked_with_is_the_checked_one_written_out():
    """A run of ``threshold 0`` (a majority) is pinned to the number checked: nothing recomputes it later."""
    config = run(10, enabled=True)
    accepted = check_floor(config, Floor())
    kept = pinned(config, accepted)
    assert kept.settings["secagg"]["threshold"] == 6 and threshold(kept.section(SecAggSettings), 10) == 6
    assert config.settings["secagg"] == {"enabled": True}  # the coordinator's configuration is left as it came


# ------------------------------------------------------------------ M6: the client's own files


@pytest.mark.parametrize(
    ("setting", "named", "flag"),
    [
        ({"data_dir": "/x"}, "data_dir=/x", "--data-dir or LORM_DATA_DIR"),
        ({"settings": {"data": {"train_file": "/etc/passwd"}}}, "data.train_file=/etc/passwd", "--train-file"),
        ({"settings": {"data": {"test_file": "/etc/shadow"}}}, "data.test_file=/etc/shadow", "--test-file"),
        ({"settings": {"data": {"root": "/home"}}}, "data.root=/home", "--image-root"),
        ({"settings": {"model": {"weights": "/tmp/evil.pt"}}}, "model.weights=/tmp/evil.pt", "--weights"),
        ({"extra": {"weights": "/tmp/evil.pt"}}, "model.weights=/tmp/evil.pt", "--weights"),  # the legacy key too
    ],
)
def test_a_coordinator_configuration_that_picks_a_clients_files_is_refused_by_name(setting, named, flag):
    config = RunConfig(**setting)
    with pytest.raises(LocalSettingError) as err:
        refuse_coordinator_local(config, LocalSettings())
    assert f"the coordinator's configuration sets {named}" in str(err.value) and flag in str(err.value)


def test_a_backbone_from_a_hub_repository_or_path_needs_the_clients_own_source():
    hub = RunConfig(backbone="bert:someone/backdoored-model")
    with pytest.raises(LocalSettingError, match="sets backbone=bert:someone/backdoored-model.*--backbone"):
        refuse_coordinator_local(hub, LocalSettings())
    refuse_coordinator_local(hub, LocalSettings(backbone="/models/my-copy"))  # the client's own: accepted
    assert applied(hub, LocalSettings(backbone="/models/my-copy")).backbone == "/models/my-copy"
    refuse_coordinator_local(RunConfig(backbone="minilm"), LocalSettings())  # a packaged name: its source is fixed


def test_the_clients_own_settings_go_into_the_configuration_it_builds_from():
    local = LocalSettings(data_dir="/data", train_file="t.csv", test_file="e.csv", weights="/w/model.safetensors")
    config = applied(RunConfig(dataset="textfile", settings={"data": {"label_column": "intent"}}), local)
    assert config.data_dir == "/data"
    assert config.section(DataSettings) == DataSettings(train_file="t.csv", test_file="e.csv", label_column="intent")
    assert config.section(ModelSettings).weights == "/w/model.safetensors"


def test_a_launcher_splits_a_configuration_into_the_coordinators_and_the_clients_flags():
    both = RunConfig(
        dataset="textfile",
        data_dir="/data",
        backbone="bert:org/model",
        settings={"data": {"train_file": "t.csv", "test_file": "e.csv", "classes": ["a", "b"]}},
    )
    shared, local = split(both)
    refuse_coordinator_local(shared, local)  # what the coordinator sends, the clients accept
    assert shared.data_dir == "" and shared.settings == {"data": {"classes": ["a", "b"]}}
    assert local.args() == [
        "--data-dir",
        "/data",
        "--train-file",
        "t.csv",
        "--test-file",
        "e.csv",
        "--backbone",
        "bert:org/model",
    ]
    assert applied(shared, local).to_json() == both.to_json()  # the clients rebuild the whole configuration


def test_the_signed_mode_floor_is_two_thirds_and_one():
    """secagg.mode=signed (a coordinator that deviates) needs t >= 2n/3 + 1: a majority is not enough."""
    signed = run(9, enabled=True, mode="signed")  # 0: the mode's default, 7 of 9
    assert check_floor(signed, Floor()).threshold == 7 and check_floor(signed, Floor()).mode == "signed"
    with pytest.raises(FloorError, match=r"secagg.threshold 6 for 9 clients in the signed mode.*at least 7"):
        check_floor(run(9, enabled=True, mode="signed", threshold=6, unsafe_low_threshold=True), Floor())


# ------------------------------------------------------------------ the privacy floor


def private_run(method: str = "lorm", **dp) -> RunConfig:
    return RunConfig(method=method, num_clients=10, settings={"dp": {"epsilon": 4.0, "mode": "local"} | dp})


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (RunConfig(method="lorm", num_clients=10), "no privacy budget"),  # switched off
        (private_run(epsilon=16.0), "dp.epsilon=16"),  # raised
        (private_run(delta=1e-3), "dp.delta=0.001"),
        (private_run("ncm", mode="central"), "dp.mode=central: the coordinator would add the noise"),
        (private_run(seed=0), "dp.seed=0: the noise would come from a seed the coordinator chose"),
    ],
)
def test_a_coordinator_that_weakens_the_privacy_a_client_requires_is_refused_by_name(config, named):
    """Each attack on a client that requires epsilon <= 8: the budget switched off or raised, the noise kept by the
    coordinator (central mode) or drawn from a seed it chose."""
    check_floor(config, Floor())  # without the requirement, every one of them is accepted
    with pytest.raises(FloorError, match=named) as err:
        check_floor(config, floor("--max-epsilon", "8"))
    assert "--max-epsilon 8" in str(err.value)


def test_a_run_within_the_clients_budget_is_accepted_in_local_and_distributed_mode(monkeypatch):
    assert check_floor(private_run(), floor("--max-epsilon", "4")).enabled is False
    distributed = RunConfig(
        method="ncm",
        num_clients=10,
        settings={"dp": {"epsilon": 1.0, "mode": "distributed"}, "secagg": {"enabled": True}},
    )
    assert check_floor(distributed, floor("--max-epsilon", "1")).threshold == 6
    monkeypatch.setenv("LORM_MAX_EPSILON", "2")
    with pytest.raises(FloorError, match="dp.epsilon=4.*LORM_MAX_EPSILON"):
        check_floor(private_run(), floor())
    with pytest.raises(FloorError, match="--max-epsilon must be > 0"):
        floor("--max-epsilon", "0")


# ------------------------------------------------------------------ floors a client sets for itself


@pytest.mark.parametrize("clients", [1, 2])
def test_a_secure_run_of_one_or_two_clients_is_refused_when_the_client_requires_secure_aggregation(clients):
    """A one-client "secure" run: threshold 1 of 1 is a majority, and the "sum" is the client's own input; of two,
    one input is the sum minus the other. --require-secure-aggregation puts the floor at 3 clients and t >= 2,
    whatever --min-clients says lower."""
    tiny = run(clients, enabled=True)
    assert check_floor(tiny, Floor()).threshold == clients // 2 + 1  # without the requirement: accepted, as before
    for argv in [("--require-secure-aggregation",), ("--require-secure-aggregation", "--min-clients", "1")]:
        with pytest.raises(FloorError, match=f"num_clients={clients}, below this client's floor of 3"):
            check_floor(tiny, floor(*argv))
    assert check_floor(run(3, enabled=True), floor("--require-secure-aggregation")).threshold == 2
    assert floor("--require-secure-aggregation", "--min-clients", "5").least_clients() == 5


def test_a_distributed_run_sized_for_fewer_colluders_than_the_client_allows_for_is_refused():
    """dp.colluders is the coordinator's choice: with --min-colluders K the client refuses a noise sized for fewer,
    and the line it logs names the n, t, k and epsilon it accepted."""
    distributed = RunConfig(
        method="ncm",
        num_clients=10,
        settings={"dp": {"epsilon": 1.0, "mode": "distributed", "colluders": 1}, "secagg": {"enabled": True}},
    )
    with pytest.raises(FloorError, match="dp.colluders=1, below this client's --min-colluders 2"):
        check_floor(distributed, floor("--min-colluders", "2"))
    accepted = check_floor(distributed, floor("--min-colluders", "1"))
    assert accepted.describe() == (
        "n 10 clients, threshold t 6, mode honest, epsilon 1, delta 1e-05 (distributed), colluders k 1"
    )
    assert check_floor(run(4), Floor()).describe() == "n 4 clients, secure aggregation off, no privacy budget"


# ------------------------------------------------------------------ the sparse graph


def test_a_sparse_graph_sized_for_too_few_colluders_is_refused():
    """The client derives the sparse graph's neighbours and threshold itself; a coordinator that states a low
    corruption target (small neighbourhoods a few colluders fill) or a weak failure bound is refused."""
    for weak in ({"corrupt": 0.0}, {"failure_bits": 20}):
        with pytest.raises(FloorError, match="sparse graph .* below this client's floor"):
            check_floor(run(1000, enabled=True, graph="sparse", **weak), Floor())
    config = run(1000, enabled=True, graph="sparse")
    accepted = check_floor(config, Floor())
    assert accepted.threshold == 119  # 168 neighbours at 10 % dropout and 5 % colluders, 2^-40
    kept = pinned(config, accepted)
    assert threshold(kept.section(SecAggSettings), 1000) == 119  # the pinned threshold is the same sparse graph
    with pytest.raises(FloorError, match="derived per neighbourhood"):
        check_floor(run(1000, enabled=True, graph="sparse", threshold=200), Floor())


PINNED, OTHER = "ab" * 32, "cd" * 32


def prior_run(method: str = "ridge", digest: str = PINNED) -> RunConfig:
    named = {method: {"prior_digest": digest, "prior_k": 16}} if digest else {}
    return RunConfig(method=method, num_clients=10, settings=named)


def test_a_coordinator_that_swaps_or_drops_the_public_prior_a_client_pinned_is_refused(monkeypatch):
    """A client that vetted one public prior (its digest from lorm-prior) refuses a run that names another, one that
    names none, and a method without a features pass."""
    pin = floor("--public-prior-digest", PINNED.upper())  # as lorm-prior prints it or in capitals
    for method in ("ridge", "ncm"):
        assert check_floor(prior_run(method), pin).num_clients == 10
    cases = {
        f"names the public prior {OTHER}": prior_run(digest=OTHER),
        "names no public prior": prior_run(digest=""),
        "names no public prior.*--public-prior-digest": RunConfig(method="lorm", num_clients=10),
    }
    for named, config in cases.items():
        check_floor(config, Floor())  # without the pin, each is accepted
        with pytest.raises(FloorError, match=named):
            check_floor(config, pin)
    monkeypatch.setenv("LORM_PUBLIC_PRIOR_DIGEST", PINNED)
    with pytest.raises(FloorError, match="LORM_PUBLIC_PRIOR_DIGEST"):
        check_floor(prior_run(digest=OTHER), floor())
    for bad in ("abc", "zz" * 32):
        with pytest.raises(FloorError, match="--public-prior-digest must be 64 hex digits"):
            floor("--public-prior-digest", bad)
