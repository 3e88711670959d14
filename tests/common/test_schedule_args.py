"""The coordinator's schedule by name: ``--schedule FILE`` (one task per line, names separated by
commas) or repeated ``--task a,b,c`` fill ``data.classes`` and the task sizes; ``--open`` sets ``data.open``;
``data.max_classes`` is the head's rows."""

from __future__ import annotations

import argparse

import pytest

from common.methods.checks import validate
from common.run.arguments import add_config_arguments
from common.run.config import RunConfig
from common.run.schedule import (
    add_schedule_arguments,
    class_schedule,
    config_with_schedule,
    head_classes,
    read_schedule,
    run_tasks,
    same_but_schedule,
    with_schedule,
)
from common.run.schedule import schedule_from_args as values_with_schedule
from common.run.settings import DataSettings


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    add_schedule_arguments(parser)
    return parser.parse_args(list(argv))


BASE = {"dataset": "textfile", "num_tasks": 5}


def schedule_from_args(args: argparse.Namespace, base: dict) -> RunConfig:
    return validate(RunConfig.from_dict(values_with_schedule(args, base)))


def test_a_schedule_file_is_one_task_per_line(tmp_path):
    path = tmp_path / "schedule.txt"
    path.write_text("\ufeff# the first tasks\nalarm, balance\n\n  greeting,music,timer \n# more later\nweather\n")
    assert read_schedule(path) == [["alarm", "balance"], ["greeting", "music", "timer"], ["weather"]]
    config = schedule_from_args(parsed("--schedule", str(path), "--open"), BASE)
    data = config.settings["data"]
    names = ["alarm", "balance", "greeting", "music", "timer", "weather"]
    assert data == {"owned": True, "open": True, "classes": names}
    assert (config.num_tasks, config.task_sizes, config.class_order) == (3, [2, 3, 1], "natural")
    assert class_schedule(config) == read_schedule(path)


def test_repeated_task_flags_are_the_schedule_in_order():
    config = schedule_from_args(parsed("--task", "b,a", "--task", "c"), BASE)
    assert class_schedule(config) == [["b", "a"], ["c"]]
    assert "open" not in config.settings["data"]
    with pytest.raises(ValueError, match="set data.owned"):  # an open run is one on the clients' own data
        schedule_from_args(parsed("--open"), BASE)


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        ("a,b\nb,c\n", "unique, repeated: \\['b'\\]"),
        ("a,,b\n", "line 1: a task is class names"),
        ("a,b\n ,\n", "line 2"),
        ("# nothing\n\n", "one or more tasks"),
        ("a," + "x" * 1001 + "\n", "1 to 1000 characters"),
    ],
)
def test_a_schedule_file_with_a_duplicate_or_an_empty_name_is_refused(tmp_path, lines, why):
    path = tmp_path / "schedule.txt"
    path.write_text(lines)
    with pytest.raises(ValueError, match=why):
        schedule_from_args(parsed("--schedule", str(path)), BASE)


def test_task_flags_are_checked_and_exclude_a_file(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        schedule_from_args(parsed("--task", "a,b", "--task", "a"), BASE)
    with pytest.raises(ValueError, match="--task ''"):
        schedule_from_args(parsed("--task", ""), BASE)
    (tmp_path / "s").write_text("a\n")
    with pytest.raises(ValueError, match="pass one of them"):
        schedule_from_args(parsed("--schedule", str(tmp_path / "s"), "--task", "a"), BASE)


def test_the_heads_capacity_and_the_tasks_it_holds():
    config = schedule_from_args(parsed("--task", "a,b", "--task", "c"), BASE)
    capped = config.replace(settings={"data": {**config.settings["data"], "max_classes": 10}})
    assert head_classes(config, 3) == 3 and head_classes(capped, 3) == 10
    assert run_tasks(capped, 10) == [(0, 2), (2, 3)]  # the rows past the schedule are in no task
    with pytest.raises(ValueError, match="max_classes=2 is the head's rows, fewer than the 3"):
        validate(config.replace(settings={"data": {**config.settings["data"], "max_classes": 2}}))
    with pytest.raises(ValueError, match="set data.owned"):
        validate(RunConfig(settings={"data": {"open": True}}))


def test_the_live_configuration_cuts_the_longer_schedule_and_is_the_same_run():
    config = schedule_from_args(parsed("--task", "a,b", "--open"), BASE)
    assert with_schedule(config, [["a", "b"]]) is config
    longer = with_schedule(config, [["a", "b"], ["c", "d", "e"]])
    assert class_schedule(longer) == [["a", "b"], ["c", "d", "e"]]
    assert same_but_schedule(config, longer) and not same_but_schedule(config, longer.replace(seed=1))


def test_an_open_run_is_refused_for_a_method_that_sizes_its_state_by_the_tasks_it_starts_with():
    config = schedule_from_args(parsed("--task", "a,b", "--open"), BASE)
    with pytest.raises(ValueError, match="method 'coda-p' sizes its state by the tasks it starts with"):
        validate(config.replace(method="coda-p"))
    assert config.replace(method="l2p").section(DataSettings).open  # its pool does not depend on the tasks


def test_settings_that_need_a_schedule_are_checked_with_the_schedule_of_the_flags():
    """``data.max_classes`` needs ``data.owned`` and named classes, which ``--task`` gives: the flags are one
    configuration, checked once (it was checked before the schedule was read, and refused)."""
    config = validate(
        config_with_schedule(
            parsed("--set", "dataset=textfile", "--set", "data.max_classes=8", "--task", "a,b", "--open")
        )
    )
    assert config.section(DataSettings).max_classes == 8 and class_schedule(config) == [["a", "b"]]
    with pytest.raises(ValueError, match="set data.owned"):
        validate(config_with_schedule(parsed("--set", "dataset=textfile", "--set", "data.max_classes=8")))
