"""What a run leaves in its results directory, live and at the end.

- ``tensorboard/``: event files with the mean client loss per step and the accuracy on every
  seen task after each task (written as steps finish);
- ``config.json``, ``metrics.json`` (accuracy matrix, both FAA figures, forgetting, history);
- ``accuracy.png``: accuracy on each task across the tasks trained;
- ``adapter/`` (standard PEFT LoRA adapter) — or, for full fine-tuning baselines,
  ``delta.safetensors`` (the model is ``W0 + delta``) — and ``head.safetensors``;
- ``scoring.safetensors``: the run's evaluation plan of the model, which the card's ``scoring`` completes (how its
  clients scored: ``lorm-predict`` and ``lorm-serve`` score so, every method);
- ``model.json`` (written after them): the card that makes the directory a self-contained export
  (``common/wire/model_card.py``; ``lorm-predict`` and ``lorm-serve`` read it);
- ``task-<t>/``: the model as it stood when task ``t`` ended (its evaluation closed), an export of its own
  (the model's files and card, no metrics), written while the run goes on, so that ``lorm-serve`` watching
  the results serves each task's model as it comes. A sibling of the final export's files rather than a
  folder deeper, so that ``lorm-serve --models runs`` finds it within its three levels
  (``runs/<run>/results/task-<t>/model.json``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from common.infra.faults import fault_point
from common.infra.files import atomic_write_bytes
from common.privacy.ledger import privacy_summary
from common.run.config import RunConfig
from common.wire.messages import LowRank, ModelSpec, RoundPlan
from common.wire.model_card import ADAPTER_DIR, CARD_FILE, DELTA_FILE
from server.export import (
    export_adapter,
    export_card,
    export_dense_delta,
    export_head,
    export_scoring,
    export_tensors,
    model_card,
    scoring,
    write_metrics,
)
from server.strategies import Strategy


@dataclass(frozen=True)
class TrainedModel:
    """What an export holds of a run's model: the strategy's merged state, its head cut to the schedule's classes."""

    spec: ModelSpec  # num_classes (and classes) cut as the head
    adapter: dict[str, LowRank]  # the merged backbone delta (B_cat, A_cat) per layer; {}: none
    head_w: Tensor  # (num_classes, feature_dim)
    head_b: Tensor  # (num_classes,)
    dense_delta: dict[str, Tensor] | None = None  # full fine-tuning: W0 + delta, instead of the adapter
    exports: dict[str, dict[str, Tensor]] = field(default_factory=dict)  # a method's own parts by kind
    # the plan that evaluates the model after a task (0-based), as its clients scored it (Strategy.eval_plan);
    # None: no scoring plan is exported
    evaluation: Callable[[int], RoundPlan] | None = None

    @classmethod
    def of(cls, strategy: Strategy, spec: ModelSpec) -> TrainedModel:
        """``strategy``'s model as it stands. A head of more rows than the schedule's classes (data.max_classes)
        is exported as the schedule's: the rows past them are in no task, never trained."""
        rows = strategy.tasks[-1][1]
        classes = None if spec.classes is None else spec.classes[:rows]
        return cls(
            dataclasses.replace(spec, num_classes=rows, classes=classes),
            strategy.adapter(),
            strategy.head_w[:rows],
            strategy.head_b[:rows],
            strategy.dense_delta(),
            strategy.exports(),
            strategy.eval_plan,
        )


def task_dir(results: Path, task: int) -> Path:
    """Where the export of the model after task ``task`` (0-based) goes."""
    return results / f"task-{task}"


class RunReporter:
    def __init__(self, results_dir: str | Path) -> None:
        self.dir = Path(results_dir)
        self._writer = None

    @property
    def writer(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.dir / "tensorboard"))
        return self._writer

    def step(self, number: int, entry: dict) -> None:
        """One finished step (an entry of the run history)."""
        loss = entry.get("loss")
        if loss is not None and math.isfinite(loss):
            self.writer.add_scalar(f"loss/train_task{entry['task']}", loss, number)
            self.writer.add_scalar("loss/train", loss, number)
        accuracy = entry.get("accuracy")
        if accuracy is not None:
            task = entry["task"]
            for j, a in enumerate(accuracy):
                self.writer.add_scalar(f"accuracy/task{j}", a, task)
            self.writer.add_scalar("accuracy/mean_seen_tasks", sum(accuracy) / len(accuracy), task)
        self.writer.flush()

    def replay(self, history: list[dict]) -> None:
        """After a restart: the event files become the committed ``history`` alone.

        A step can reach the event files and then be lost in a crash before its state is
        committed; the restarted coordinator redoes it and would write it twice. So the old files
        go and the committed steps are written again, once each."""
        events = self.dir / "tensorboard"
        if not events.is_dir():
            return
        for old in events.glob("events.out.tfevents.*"):
            old.unlink()
        for number, entry in enumerate(history):
            self.step(number, entry)

    def export_task(self, config: RunConfig, model: TrainedModel, task: int, history: list[dict]) -> Path:
        """The export of ``model`` after task ``task`` (0-based): ``task-<task>/``, its card saying ``task + 1``
        tasks learned and the privacy its steps so far (``history``) guarantee. Written again whole when called
        again."""
        out = task_dir(self.dir, task)
        self._export(out, config, model, task + 1, privacy=privacy_summary(history).get("privacy", {}))
        return out

    def task_exported(self, task: int) -> bool:
        """Whether the export after task ``task`` is whole (its card, written last, is there)."""
        return (task_dir(self.dir, task) / CARD_FILE).is_file()

    def finish(self, config: RunConfig, model: TrainedModel, summary: dict) -> Path:
        """The run's results once it is done: ``config.json``, the model's export with ``metrics.json``, the
        accuracy plot, and the final figures in the event files."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / CARD_FILE).unlink(missing_ok=True)  # an earlier export here stops being one until this is whole
        atomic_write_bytes(self.dir / "config.json", json.dumps(json.loads(config.to_json()), indent=1).encode())
        self._export(self.dir, config, model, len(summary["accuracy"]), summary, summary.get("privacy", {}))
        plot_accuracy(
            summary["accuracy"], self.dir / "accuracy.png", title=f"{config.run_id}: FAA {summary['faa']:.2f}"
        )
        if self._writer is not None:
            self.writer.add_scalar("faa/paper", summary["faa"], len(summary["accuracy"]) - 1)
            self.writer.add_scalar("faa/sample_weighted", summary["faa_weighted"], len(summary["accuracy"]) - 1)
            self.writer.close()
        return self.dir

    @staticmethod
    def _export(
        out: Path,
        config: RunConfig,
        model: TrainedModel,
        tasks_trained: int,
        summary: dict | None = None,
        privacy: dict | None = None,
    ) -> None:
        """``model``'s files in ``out``, then ``summary`` as ``metrics.json`` when given, then the card: an old
        card goes first, so that the directory is an export only once it is whole again."""
        out.mkdir(parents=True, exist_ok=True)
        (out / CARD_FILE).unlink(missing_ok=True)
        spec = model.spec
        if model.dense_delta is not None:
            export_dense_delta(out / DELTA_FILE, model.dense_delta, spec)
        elif model.adapter:
            export_adapter(
                out / ADAPTER_DIR, model.adapter, spec, rank_per_task=config.rank, lora_scale=config.lora_scale
            )
        for kind, named in model.exports.items():
            export_tensors(out, kind, named)
        plan = model.evaluation(tasks_trained - 1) if model.evaluation is not None else None
        if plan is not None:
            export_scoring(out, plan)
        fault_point("export")
        export_head(out, model.head_w, model.head_b)
        if summary is not None:
            write_metrics(out, summary)
        weights = "delta" if model.dense_delta is not None else "adapter" if model.adapter else "none"
        card = model_card(
            config,
            spec,
            model.head_w,
            weights=weights,
            tasks_trained=tasks_trained,
            parts=list(model.exports),
            privacy=privacy,
            scoring=scoring(plan, config, spec) if plan is not None else None,
        )
        export_card(out, card)


def plot_accuracy(accuracy: list[list[float]], path: Path, title: str = "") -> None:
    """One line per task j: its accuracy after each task t >= j."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    tasks = len(accuracy)
    for j in range(tasks):
        ts = list(range(j, tasks))
        ax.plot(ts, [accuracy[t][j] for t in ts], marker="o", label=f"task {j}")
    ax.plot(
        range(tasks),
        [sum(row) / len(row) for row in accuracy],
        color="black",
        linestyle="--",
        linewidth=2,
        label="mean over seen tasks",
    )
    ax.set_xlabel("after training task")
    ax.set_ylabel("accuracy (%)")
    ax.set_xticks(range(tasks))
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
