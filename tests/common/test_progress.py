"""Progress inside a run (common/infra/progress.py): the ETA from finished units, and what is written where."""

from __future__ import annotations

import io

import pytest

from common.infra.progress import Progress, duration_text, kind_of


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_unit(p: Progress, clock: Clock, label: str, seconds: float, batches: int = 4) -> None:
    p.begin(label)
    for b in range(1, batches + 1):
        clock.now += seconds / batches
        p.batch(b, batches)
    p.end()


def test_the_eta_weighs_each_remaining_unit_by_the_mean_of_its_kind():
    clock = Clock()
    p = Progress(["train", "train", "statistics", "statistics", "evaluate"], io.StringIO(), False, clock=clock)
    assert p.eta() is None and p.run_text() == "run 0% done"  # nothing finished: no guess
    run_unit(p, clock, "t0", 10.0)
    # left: one train (10 s) and three units of kinds not seen yet, at the overall mean (10 s)
    assert p.eta() == pytest.approx(40.0)
    run_unit(p, clock, "t1", 20.0)
    run_unit(p, clock, "s0", 2.0)
    assert p.eta() == pytest.approx(2.0 + (10.0 + 20.0 + 2.0) / 3)  # a statistics unit, then an evaluation
    assert p.run_text() == "run 60% done, ETA 13 s"
    clock.now += 1.0  # a unit under way counts as partly done
    p.begin("s1")
    clock.now += 1.5
    assert p.eta() == pytest.approx(2.0 + 32.0 / 3 - 1.5)


def test_plain_lines_at_most_every_interval_with_batches_and_the_step_eta():
    clock, out = Clock(), io.StringIO()
    p = Progress(["train"] * 3, out, interactive=False, every_s=30.0, clock=clock)
    run_unit(p, clock, "task 0 round 0 train B, client 1/3", 20.0, batches=10)
    assert out.getvalue() == ""  # 20 s: nothing yet
    p.begin("task 0 round 0 train B, client 2/3")
    clock.now += 12.0
    p.batch(3, 10)
    lines = out.getvalue().splitlines()
    assert lines == ["progress: task 0 round 0 train B, client 2/3, batch 3/10; step ETA 28 s; run 33% done, ETA 28 s"]
    clock.now += 1.0
    p.batch(4, 10)
    assert len(out.getvalue().splitlines()) == 1  # the next line waits 30 s more


def test_a_terminal_gets_one_status_line_redrawn_and_cleared():
    clock, out = Clock(), io.StringIO()
    p = Progress(["train"], out, interactive=True, clock=clock)
    p.begin("task 0 round 0 train B, client 1/1")
    clock.now += 0.1
    p.batch(1, 5)  # within 0.2 s of the last draw: not redrawn
    clock.now += 0.3
    p.batch(2, 5)
    p.end()
    text = out.getvalue()
    assert text.count("\r\033[K") == 3 and "\n" not in text  # two draws, then cleared for the log
    assert text.endswith("batch 2/5; step ETA 1 s; run 0% done\r\033[K")


def test_a_client_without_the_schedule_sees_its_step_only_and_lines_go_to_its_logger():
    clock, lines = Clock(), []
    p = Progress([], io.StringIO(), interactive=False, every_s=0.0, clock=clock, emit=lines.append)
    p.begin("task 1 round 2 train B")
    clock.now += 5.0
    p.batch(1, 2)
    assert lines[-1] == "progress: task 1 round 2 train B, batch 1/2; step ETA 5 s"


def test_durations_and_kinds():
    assert [duration_text(s) for s in (45, 720, 3 * 3600)] == ["45 s", "12 min", "3.0 h"]
    assert [kind_of(p) for p in ("train", "task_gram", "features", "evaluate")] == [
        "train",
        "statistics",
        "statistics",
        "evaluate",
    ]
