"""What a run leaves in its results directory, live and at the end.

- ``tensorboard/``: event files with the mean client loss per step and the accuracy on every
  seen task after each task (written as steps finish);
- ``config.json``, ``metrics.json`` (accuracy matrix, both FAA figures, forgetting, history);
- ``accuracy.png``: accuracy on each task across the tasks trained;
- ``adapter/`` (standard PEFT LoRA adapter) — or, for full fine-tuning baselines,
  ``delta.safetensors`` (the model is ``W0 + delta``) — and ``head.safetensors``;
- ``model.json`` (written after them): the card that makes the directory a self-contained export
  (``common/wire/model_card.py``; ``lorm-predict`` and ``lorm-serve`` read it).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from torch import Tensor

from common.infra.faults import fault_point
from common.run.config import RunConfig
from common.run.schedule import run_tasks
from common.wire.messages import LowRank, ModelSpec
from common.wire.model_card import ADAPTER_DIR, CARD_FILE, DELTA_FILE
from server.export import (
    export_adapter,
    export_card,
    export_dense_delta,
    export_head,
    export_tensors,
    model_card,
    write_metrics,
)
from server.store import atomic_write_bytes


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

    def finish(
        self,
        config: RunConfig,
        spec: ModelSpec,
        adapter: dict[str, LowRank],
        head_w: Tensor,
        head_b: Tensor,
        summary: dict,
        dense_delta: dict[str, Tensor] | None = None,
        exports: dict[str, dict[str, Tensor]] | None = None,
    ) -> Path:
        # A head of more rows than the schedule's classes (data.max_classes) is exported as the schedule's: the
        # rows past them are in no task, never trained.
        rows = run_tasks(config, spec.num_classes)[-1][1]
        spec, head_w, head_b = dataclasses.replace(spec, num_classes=rows), head_w[:rows], head_b[:rows]
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / CARD_FILE).unlink(missing_ok=True)  # an earlier export here stops being one until this is whole
        atomic_write_bytes(self.dir / "config.json", json.dumps(json.loads(config.to_json()), indent=1).encode())
        if dense_delta is not None:
            export_dense_delta(self.dir / DELTA_FILE, dense_delta, spec)
        elif adapter:
            export_adapter(
                self.dir / ADAPTER_DIR, adapter, spec, rank_per_task=config.rank, lora_scale=config.lora_scale
            )
        for kind, named in (exports or {}).items():
            export_tensors(self.dir, kind, named)
        fault_point("export")
        export_head(self.dir, head_w, head_b)
        write_metrics(self.dir, summary)
        weights = "delta" if dense_delta is not None else "adapter" if adapter else "none"
        card = model_card(
            config, spec, head_w, weights=weights, tasks_trained=len(summary["accuracy"]), parts=list(exports or {})
        )
        export_card(self.dir, card)
        plot_accuracy(
            summary["accuracy"], self.dir / "accuracy.png", title=f"{config.run_id}: FAA {summary['faa']:.2f}"
        )
        if self._writer is not None:
            self.writer.add_scalar("faa/paper", summary["faa"], len(summary["accuracy"]) - 1)
            self.writer.add_scalar("faa/sample_weighted", summary["faa_weighted"], len(summary["accuracy"]) - 1)
            self.writer.close()
        return self.dir


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
