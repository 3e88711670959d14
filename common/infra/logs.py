"""Process logging: one line per event, plain text for people or JSON for collectors.

Every record carries the run, task, round and client it belongs to, where known: the
process sets what it knows once (``set_context(run=..., client=...)``, then the step it is
working on), and a call may pass its own with ``extra={"task": ..., "round": ...}``.
A JSON line is one object: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``, then the
known fields of ``run``, ``task``, ``round``, ``client``, and ``exc`` for a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from common.wire.instructions import DenseStep

FORMATS = ("plain", "json")
FIELDS = ("run", "task", "round", "client")
ENV_FORMAT = "LORM_LOG_FORMAT"

_context: dict[str, Any] = {}
_context_lock = threading.Lock()


def report_text(report: dict) -> str:
    """A strategy's step report in a log line: ``; ridge_lambda 10000.0`` (nested values left out)."""
    flat = [f"{k} {v}" for k, v in report.items() if not isinstance(v, (dict, list))]
    return "; " + ", ".join(flat) if flat else ""


def loss_text(loss: float) -> str:
    """``loss 0.1234`` for a training step; a step that only gathers statistics has no loss (NaN)."""
    return f"loss {loss:.4f}" if math.isfinite(loss) else "no training loss"


STATISTICS_STEPS = {"task_gram": "task Gram", "features": "features"}  # phase value -> name: steps that do not train


def step_name(phase: str, factors: str, fisher: bool = False) -> str:
    """How a log line names a step: ``train B`` (the factor it trains; ``train -`` when none), or,
    for a step that only gathers statistics, ``task Gram (statistics only, no training)`` (``task
    Fisher`` when the statistic is the Fisher: EWC)."""
    if phase in STATISTICS_STEPS:
        name = "task Fisher" if fisher and phase == "task_gram" else STATISTICS_STEPS[phase]
        return f"{name} (statistics only, no training)"
    if phase == "evaluate":
        return "evaluation"
    return f"{phase} {factors or '-'}"


def plan_name(plan: Any) -> str:
    """:func:`step_name` of a ``RoundPlan``."""
    step = plan.instruction
    return step_name(plan.phase.value, step.factors(), isinstance(step, DenseStep) and step.send_fisher)


def step_loss(phase: str, loss: float) -> str:
    """The loss part of a step's log line: empty for a statistics step (its name says it)."""
    return "" if phase in STATISTICS_STEPS else loss_text(loss)


def set_context(**fields: Any) -> None:
    """Set (or, with ``None``, forget) fields every later record of this process carries."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError(f"log context fields must be among {FIELDS}, got {unknown}")
    with _context_lock:
        for key, value in fields.items():
            if value is None:
                _context.pop(key, None)
            else:
                _context[key] = value


@contextlib.contextmanager
def context_kept() -> Iterator[None]:
    """Put the process's log context back as it was on exit (in-process clients set theirs in threads of a process
    whose own records must not carry them afterwards)."""
    with _context_lock:
        before = dict(_context)
    try:
        yield
    finally:
        with _context_lock:
            _context.clear()
            _context.update(before)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    with _context_lock:
        known = dict(_context)
    for key in FIELDS:  # a call's own extra= wins over the process context
        value = getattr(record, key, None)
        if value is not None:
            known[key] = value
    return {key: known[key] for key in FIELDS if key in known}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class PlainFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        known = _fields(record)
        if not known:
            return text
        # Context after the message, so that a reader's eye (and a grep) finds the event first.
        return f"{text}  [{' '.join(f'{k}={v}' for k, v in known.items())}]"


def default_format() -> str:
    return os.environ.get(ENV_FORMAT, "plain") or "plain"


def add_logging_arguments(parser) -> None:
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=default_format(),
        help=f"plain text or one JSON object per line (default: ${ENV_FORMAT} or plain)",
    )


def setup_logging(fmt: str = "plain", level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Route every logger of the process to one handler on ``stream`` (stdout) in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings become records too: JSON output stays one object per line
