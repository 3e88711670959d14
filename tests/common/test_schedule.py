"""The run's schedule of classes by name: stated from the configuration alone, sent at Join, checked
on receipt."""

from __future__ import annotations

import pytest

from client.transport import Backoff, CoordinatorClient
from common.infra.tls import Security
from common.methods.checks import validate
from common.run.config import RunConfig
from common.run.schedule import MAX_NAME, check_schedule, class_schedule, schedule_ranges, scheduled_classes
from common.wire.tensors import WireError
from proto import codec
from proto import lorm_pb2 as pb
from server.coordinator import Coordinator
from server.service import create_server

NAMES = ["weather", "alarm", "music", "balance", "greeting", "timer"]


def named(**changes: object) -> RunConfig:
    values: dict[str, object] = {"dataset": "textfile", "settings": {"data": {"classes": list(NAMES)}}, **changes}
    return validate(RunConfig(**values))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "schedule"),
    [
        ({"num_tasks": 3}, [["weather", "alarm"], ["music", "balance"], ["greeting", "timer"]]),
        ({"num_tasks": 2, "task_sizes": [4, 2]}, [["weather", "alarm", "music", "balance"], ["greeting", "timer"]]),
        (
            {"num_tasks": 2, "class_order": "alphabetical"},
            [["alarm", "balance", "greeting"], ["music", "timer", "weather"]],
        ),
        ({"num_tasks": 2, "num_classes": 4}, [["weather", "alarm"], ["music", "balance"]]),
        ({"num_tasks": 4}, [["weather"], ["alarm"], ["music", "balance"], ["greeting", "timer"]]),  # larger tasks last
    ],
)
def test_the_schedule_is_the_configurations_classes_cut_into_its_tasks(changes, schedule):
    config = named(**changes)
    assert class_schedule(config) == schedule
    assert scheduled_classes(schedule) == [n for task in schedule for n in task]
    ranges = schedule_ranges(schedule)
    assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_a_configuration_that_names_no_classes_states_no_schedule():
    assert class_schedule(RunConfig()) is None  # synthetic: the clients' data numbers its classes
    assert class_schedule(RunConfig(dataset="clinc150", settings={"data": {"classes": ["a", "b"]}})) is None
    assert class_schedule(RunConfig(dataset="textfile")) is None


@pytest.mark.parametrize(
    ("schedule", "named"),
    [
        ([], "one or more tasks"),
        ([["a"], []], "one or more tasks"),
        ([["a", "b"], ["b"]], "unique, repeated: ['b']"),
        ([["a", ""]], "strings of 1 to"),
        ([["a", "x" * (MAX_NAME + 1)]], "strings of 1 to"),
    ],
)
def test_a_malformed_schedule_is_refused_by_what_is_wrong(schedule, named):
    with pytest.raises(ValueError, match="the schedule here: .*" + named.replace("[", r"\[").replace("]", r"\]")):
        check_schedule(schedule, "the schedule here")


def test_the_schedule_on_the_wire_round_trips_and_is_checked_on_receipt():
    schedule = [["alarm", "balance"], ["greeting"]]
    assert codec.schedule_from_proto(codec.schedule_to_proto(schedule)) == schedule
    assert codec.schedule_to_proto(None) == [] and codec.schedule_from_proto([]) is None
    with pytest.raises(WireError, match="tasks: .*repeated: \\['alarm'\\]"):
        codec.schedule_from_proto([pb.TaskClasses(classes=["alarm"]), pb.TaskClasses(classes=["alarm"])])


@pytest.mark.parametrize(
    ("config", "schedule"),
    [
        (named(num_tasks=2, num_clients=1), [["weather", "alarm", "music"], ["balance", "greeting", "timer"]]),
        (RunConfig(num_clients=1), None),
    ],
)
def test_a_client_learns_the_schedule_at_join_from_a_coordinator_without_data(tmp_path, config, schedule):
    coordinator = Coordinator(config, tmp_path / "state")  # it reads no data: it has none
    server, port = create_server(coordinator, "127.0.0.1:0", security=Security(insecure=True))
    server.start()
    try:
        client = CoordinatorClient(f"127.0.0.1:{port}", "c0", Backoff(give_up_s=5), security=Security(insecure=True))
        assert client.join(0)[1] == 0
        assert client.schedule == schedule
        client.close()
    finally:
        server.stop(0)


def test_a_run_on_the_clients_own_data_must_name_its_classes():
    with pytest.raises(ValueError, match="data.owned: .*data.classes, with dataset one of"):
        validate(RunConfig(settings={"data": {"owned": True}}))
    with pytest.raises(ValueError, match="data.owned: .*got dataset 'textfile', 0 classes"):
        validate(RunConfig(dataset="textfile", settings={"data": {"owned": True}}))
    with pytest.raises(ValueError, match="data.clients_dir is the clients' own data: set data.owned=true"):
        named(settings={"data": {"classes": NAMES, "clients_dir": "/x"}})
    assert class_schedule(named(num_tasks=2, settings={"data": {"classes": NAMES, "owned": True}})) is not None


def test_own_text_data_fixes_max_length_rather_than_each_client_counting_its_own():
    owned = {"data": {"classes": NAMES, "owned": True}}
    with pytest.raises(ValueError, match="data.owned with max_length 0: each client would count") as refused:
        named(max_length=0, settings=owned)
    assert "the largest of the sites' counts (--set max_length=N; each site's: lorm-sim --count-tokens" in str(
        refused.value
    )  # what to pass, and how each site finds its number
    assert named(max_length=64, settings=owned).max_length == 64
    assert named(max_length=0, settings={"data": {"classes": NAMES}}).max_length == 0  # one dataset: counted alike
    images = named(dataset="imagefolder", max_length=0, settings=owned)  # no tokens to count
    assert images.max_length == 0
