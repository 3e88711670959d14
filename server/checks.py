"""What the coordinator admits: each check of a client's call in one place, as pure functions.

Every refusal is a :class:`Refused` carrying the gRPC status code name the servicer answers
with. The checks read the run's configuration and caps; none changes state, so a refused call
leaves the coordinator exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.run.config import RunConfig
from common.run.settings import DataSettings
from common.wire.messages import EvalReport, ModelSpec, Phase
from common.wire.tensors import DEFAULT_MAX_TOTAL_BYTES


class Refused(Exception):
    """A call the coordinator refuses; ``code`` is a gRPC status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Options:
    quorum: int = 0  # minimum submissions to close a step at its deadline (0 -> all clients)
    round_deadline_s: float = 0.0  # seconds a step waits for all clients (0 -> forever)
    retry_after_s: float = 0.2  # what a waiting client is told
    idle_retry_s: float = 2.0  # what a client is told while an open run waits for the operator's next task
    start_with: int = 0  # clients joined that start the run; the others may join at any later step (0 -> all)
    results_dir: str = ""  # where the adapter, head and metrics go at the end ("" -> <state>/results)
    results: bool = True  # False: none written (the in-process engine without --results-dir)
    max_push_bytes: int = DEFAULT_MAX_TOTAL_BYTES  # cap on the tensor bytes one push may declare, any step
    max_num_samples: int = 100_000_000  # cap on one client's samples per task and on eval totals per task
    model_spec: ModelSpec | None = None  # the run's model, fixed by the operator (lorm-spec, --model-spec);
    #                                       None: the first client's Describe fixes it, within the caps below
    max_model_dim: int = 1 << 18  # cap on every dimension of a described model (vocabularies included)
    max_model_tensors: int = 100_000  # cap on its LoRA layers plus backbone parameters
    # the run's CA (PEM path): in secagg's signed mode every advertise's certificate is checked against it at
    # advertise, so that a client with a certificate of its own making never reaches a roster ("": the issuer is
    # left to the clients, who refuse such a roster)
    secagg_ca: str = ""


def check_run_id(config: RunConfig, run_id: str) -> None:
    """The one run-id check of every call that names a run."""
    if run_id != config.run_id:
        raise Refused("FAILED_PRECONDITION", f"run_id: this coordinator runs {config.run_id!r}, got {run_id!r}")


def check_step(open_step: tuple[int, int, Phase], task: int, round_: int, phase: Phase) -> None:
    """A submission must be for the open step ``(task, round, phase)``."""
    if (task, round_, phase) != open_step:
        t, r, p = open_step
        raise Refused(
            "FAILED_PRECONDITION",
            f"stale or early submission: the open step is task {t} round {r} "
            f"{p.value}, got task {task} round {round_} {phase.value}",
        )


def sample_bounds(config: RunConfig, options: Options, class_range: tuple[int, int]) -> tuple[int, int]:
    """``(lo, hi)`` for one client's ``num_samples`` of a task with ``class_range``, from what the run fixes.

    Every client holds at least ``min_client_samples`` of each task (the partition redraws until it
    does; with 0, a client may hold none), or on its own data (``data.owned``) none or more; with
    ``train_per_class`` no client can hold more than that many per class of the task;
    ``Options.max_num_samples`` caps it in any case.
    """
    lo, hi = class_range
    cap = options.max_num_samples
    if config.train_per_class > 0:
        cap = min(cap, config.train_per_class * (hi - lo))
    least = 0 if config.section(DataSettings).owned else config.min_client_samples
    return least, cap


def check_counts(report: EvalReport, config: RunConfig, options: Options, tasks: list[tuple[int, int]]) -> None:
    """The one eval-count check: a ``0 <= correct <= total`` pair per task seen, ``total`` within what the
    test set can hold (``tasks``: each task's class range)."""
    if len(report.correct) != report.task + 1 or len(report.total) != report.task + 1:
        raise Refused("INVALID_ARGUMENT", f"correct/total: expected {report.task + 1} counts each")
    for j, (c, t) in enumerate(zip(report.correct, report.total, strict=True)):
        cap = options.max_num_samples
        if config.test_per_class > 0:
            lo, hi = tasks[j]
            cap = min(cap, config.test_per_class * (hi - lo))
        if not 0 <= c <= t <= cap:
            raise Refused(
                "INVALID_ARGUMENT",
                f"correct/total: expected 0 <= correct <= total <= {cap} for task {j}, got {c} of {t}",
            )


def admit_spec(spec: ModelSpec, config: RunConfig, options: Options, what: str) -> None:
    """Refuse a model over the caps before anything is allocated for it (INVALID_ARGUMENT)."""
    tensors = len(spec.layers) + len(spec.params)
    dims = [d for shape in (*spec.layers.values(), *spec.params.values()) for d in shape]
    largest = max([*dims, spec.feature_dim, spec.num_classes])
    need = spec.state_bytes(config.rank, full_grams=config.gamma_backbone > 0)
    if tensors > options.max_model_tensors:
        raise Refused(
            "INVALID_ARGUMENT", f"{what}: {tensors} layers and parameters, over the cap of {options.max_model_tensors}"
        )
    if largest > options.max_model_dim:
        raise Refused("INVALID_ARGUMENT", f"{what}: a dimension of {largest}, over the cap of {options.max_model_dim}")
    if need > options.max_push_bytes:
        raise Refused(
            "INVALID_ARGUMENT",
            f"{what}: one step of this model needs about {need} bytes, over the cap of {options.max_push_bytes}",
        )


def check_same_spec(run: ModelSpec, described: ModelSpec, client_id: str) -> None:
    if described != run:
        raise Refused(
            "INVALID_ARGUMENT",
            f"model_spec_json: client {client_id!r} built another model than the run's: {run.difference(described)}",
        )
