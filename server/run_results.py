"""What a coordinator's run leaves: each task's model as the task ends, the results once it is done.

Functions of the run (:class:`server.run.Run`, which calls them as it commits past a task and keeps ``export``
and ``summary`` as its methods): the model exported after each task, beside the results, for a server that
watches them (:func:`export_task`); the results of a run ``DONE`` (:func:`export`), a pure function of its
state; and its summary (:func:`summary`), what the results and ``lorm-server``'s last line hold. The files
themselves are written by ``server/results.py``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from common.privacy.ledger import privacy_summary
from server.results import TrainedModel

if TYPE_CHECKING:
    from server.run import Run

log = logging.getLogger("lorm.coordinator")


def export(run: Run) -> None:
    """The results of a run ``DONE``: a pure function of its state, so a restart after a crash that cut it
    short writes it again."""
    assert run.strategy is not None and run.spec is not None
    if run.reporter is None:
        run.emit(f"run {run.config.run_id} done: FAA {run.matrix.faa():.2f}")
        return
    out = run.reporter.finish(run.live_config, TrainedModel.of(run.strategy, run.spec), summary(run))
    run.emit(
        f"run {run.config.run_id} done: FAA {run.matrix.faa():.2f} "
        f"(sample-weighted {run.matrix.faa_weighted():.2f}), results in {out}"
    )


def export_task(run: Run, task: int) -> None:
    """The model as it stands at the end of task ``task``, exported beside the results
    (``RunReporter.export_task``), for a server that watches them; called once the run is committed past
    the task, before anything of the next one happens. An export that fails is logged: the run goes on."""
    assert run.strategy is not None and run.spec is not None
    if run.reporter is None:
        return
    try:
        out = run.reporter.export_task(run.live_config, TrainedModel.of(run.strategy, run.spec), task, run.history)
    except (OSError, ValueError) as err:  # a full disk, a non-finite tensor: the run is not the export
        log.error("could not export the model after task %d: %s", task, err)
        return
    run.emit(f"task {task} exported: {out}")


def summary(run: Run) -> dict:
    return {
        "run_id": run.config.run_id,
        "config": json.loads(run.config.to_json()),
        "seconds": time.time() - run.started,
        "history": run.history,
        **run.matrix.summary(),
        **privacy_summary(run.history),
    }
