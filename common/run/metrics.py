"""Class-incremental metrics: the accuracy matrix, both FAA definitions and forgetting (docs/METHOD.md §4)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AccuracyMatrix:
    """``correct[t][j]`` / ``total[t][j]``: test results on task ``j`` after training task ``t``."""

    correct: list[list[int]] = field(default_factory=list)
    total: list[list[int]] = field(default_factory=list)

    def add(self, task: int, correct: list[int], total: list[int]) -> None:
        """Add one client's counts for the evaluation after ``task`` (counts per task 0..task)."""
        if len(correct) != task + 1 or len(total) != task + 1:
            raise ValueError(f"after task {task} expected {task + 1} counts, got {len(correct)} and {len(total)}")
        while len(self.correct) <= task:
            self.correct.append([0] * (len(self.correct) + 1))
            self.total.append([0] * (len(self.total) + 1))
        for j in range(task + 1):
            self.correct[task][j] += int(correct[j])
            self.total[task][j] += int(total[j])

    def accuracy(self) -> list[list[float]]:
        """``a[t][j]`` in percent."""
        return [
            [100.0 * c / n if n else float("nan") for c, n in zip(cs, ns)] for cs, ns in zip(self.correct, self.total)
        ]

    def faa(self) -> float:
        """Final average accuracy as the paper defines it: ``mean_j a[T][j]``."""
        last = self.accuracy()[-1]
        return sum(last) / len(last)

    def faa_weighted(self) -> float:
        """The reference code's figure: accuracy over all seen test samples after the last task."""
        return 100.0 * sum(self.correct[-1]) / sum(self.total[-1])

    def forgetting(self) -> float:
        """Mean over tasks ``j < T`` of ``max_{t<T} a[t][j] - a[T][j]`` (0 with one task)."""
        acc = self.accuracy()
        last = len(acc) - 1
        if last == 0:
            return 0.0
        drops = [max(acc[t][j] for t in range(j, last)) - acc[last][j] for j in range(last)]
        return sum(drops) / len(drops)

    def summary(self) -> dict:
        return {
            "accuracy": self.accuracy(),
            "correct": self.correct,
            "total": self.total,
            "faa": self.faa(),
            "faa_weighted": self.faa_weighted(),
            "forgetting": self.forgetting(),
        }


def format_summary(summary: dict) -> str:
    """A plain-text table of the accuracy matrix, both FAA figures, forgetting and time."""
    acc = summary["accuracy"]
    width = len(acc)
    lines = [
        "accuracy a[t][j] (%): rows = after task t, columns = task j",
        "      " + "".join(f"{'j=' + str(j):>8}" for j in range(width)),
    ]
    for t, row in enumerate(acc):
        lines.append(f"t={t:<4}" + "".join(f"{a:8.2f}" for a in row))
    lines.append(f"FAA (mean over tasks, paper): {summary['faa']:.2f}")
    lines.append(f"FAA (sample-weighted, reference code): {summary['faa_weighted']:.2f}")
    lines.append(f"forgetting: {summary['forgetting']:.2f}")
    if "seconds" in summary:
        lines.append(f"time: {summary['seconds']:.1f} s")
    return "\n".join(lines)
