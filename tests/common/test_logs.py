"""Log lines: one JSON object per event with its run/task/round/client context, or plain text."""

from __future__ import annotations

import io
import json
import logging

import pytest

from common.infra import logs


@pytest.fixture
def capture():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield stream
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logs.set_context(run=None, task=None, round=None, client=None)


def test_json_lines_carry_context_and_call_fields(capture):
    logs.setup_logging("json", stream=capture)
    logs.set_context(run="r1", client="c7")
    log = logging.getLogger("lorm.test")
    log.info("joined %s", "now")
    log.info("merged", extra={"task": 2, "round": 1})
    logs.set_context(client=None)
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        log.exception("failed")
    lines = capture.getvalue().splitlines()
    assert len(lines) == 3  # a multi-line traceback stays inside one line
    first, second, third = map(json.loads, lines)
    assert first["msg"] == "joined now" and first["level"] == "INFO" and first["logger"] == "lorm.test"
    assert (first["run"], first["client"]) == ("r1", "c7") and "task" not in first
    assert (second["task"], second["round"], second["client"]) == (2, 1, "c7")
    assert "client" not in third and "RuntimeError: boom" in third["exc"] and third["level"] == "ERROR"
    assert first["ts"].endswith("Z") and first["ts"][10] == "T"


def test_plain_lines_show_the_event_first_then_the_context(capture):
    logs.setup_logging("plain", stream=capture)
    logs.set_context(run="r1")
    logging.getLogger("lorm.test").info("task 0 round 1 merged", extra={"task": 0, "round": 1})
    (line,) = capture.getvalue().splitlines()
    assert line.endswith("INFO lorm.test task 0 round 1 merged  [run=r1 task=0 round=1]")


def test_unknown_format_and_field_are_refused():
    with pytest.raises(ValueError, match="log format must be one of"):
        logs.setup_logging("xml")
    with pytest.raises(ValueError, match="log context fields"):
        logs.set_context(step=3)


def test_a_statistics_step_has_no_loss_rather_than_nan():
    assert logs.loss_text(0.12345) == "loss 0.1235"
    assert logs.loss_text(float("nan")) == "no training loss"


def test_steps_are_named_for_what_they_do():
    assert logs.step_name("train", "B") == "train B"
    assert logs.step_name("train", "") == "train -"  # full fine-tuning trains no factor
    assert logs.step_name("task_gram", "") == "task Gram (statistics only, no training)"
    assert logs.step_name("features", "") == "features (statistics only, no training)"
    assert logs.step_name("evaluate", "") == "evaluation"
    assert logs.step_loss("features", float("nan")) == ""  # the name says it: no "no training loss"
    assert logs.step_loss("train", 0.5) == "loss 0.5000"
