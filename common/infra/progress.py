"""Progress inside a run: which client step is running, its batches, and an ETA for the whole run.

A run is a schedule of *units* (one client's step: a training round, a statistics pass, an
evaluation), each named by its kind; a client that does not know the run's schedule passes none
and sees its current step's ETA only (from its batch rate). The ETA is, over the units left, the mean seconds of
finished units of the same kind (of any kind while none of that kind has finished). On a
terminal one status line is redrawn in place, at most every 0.2 s; otherwise a plain line is
passed to ``emit`` (a logger, so that JSON logs stay JSON; by default written to the stream) at
most every ``every_s`` seconds (also at a unit's end when that much time has passed).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

KINDS = ("train", "statistics", "evaluate")


def kind_of(phase: str) -> str:
    """The kind of unit a step of ``phase`` (a ``Phase`` value) is."""
    return phase if phase in ("train", "evaluate") else "statistics"


def duration_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2.3 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """Progress over ``schedule`` (the kind of every unit of the run, in order)."""

    def __init__(
        self,
        schedule: list[str],
        stream: TextIO | None = None,
        interactive: bool | None = None,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self.schedule = schedule
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.emit = emit or self._write_line
        self.every_s = every_s
        self.clock = clock
        self.done = 0  # units finished
        self.seconds: dict[str, list[float]] = {}  # kind -> seconds of each finished unit
        self.label = ""
        self.started = self.last_write = clock()
        self.unit_started = self.started
        self.batches = (0, 0)
        self.drawn = False
        self.running = False  # between end() and the next begin()

    def _write_line(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def begin(self, label: str) -> None:
        """A unit starts: ``label`` says which (``task 0 round 1 train A, client 3/10``)."""
        self.label, self.batches, self.running = label, (0, 0), True
        self.unit_started = self.clock()
        self._show(force=self.interactive)

    def batch(self, done: int, total: int) -> None:
        """``done`` of ``total`` batches of the current unit are finished."""
        self.batches = (done, total)
        self._show()

    def end(self) -> None:
        """The current unit finished."""
        kind = self.schedule[self.done] if self.done < len(self.schedule) else "unscheduled"
        self.seconds.setdefault(kind, []).append(self.clock() - self.unit_started)
        self.done += 1
        self.running = False
        if self.interactive and self.drawn:
            self.stream.write("\r\033[K")  # clear the status line: log lines follow
            self.stream.flush()
            self.drawn = False
        elif not self.interactive:
            self._show()

    def eta(self) -> float | None:
        """Seconds left for the run's remaining units; ``None`` before any unit has finished."""
        finished = [s for times in self.seconds.values() for s in times]
        if not finished:
            return None
        overall = sum(finished) / len(finished)
        mean = {kind: sum(t) / len(t) for kind, t in self.seconds.items()}
        left = sum(mean.get(kind, overall) for kind in self.schedule[self.done :])
        if not self.running or self.done >= len(self.schedule):
            return left
        current = mean.get(self.schedule[self.done], overall)  # the unit under way counts as partly done
        return max(left - min(self.clock() - self.unit_started, current), 0.0)

    def step_eta(self) -> float | None:
        """Seconds left in the current unit, from its batch rate so far."""
        done, total = self.batches
        if not done or not total:
            return None
        return (self.clock() - self.unit_started) / done * (total - done)

    def text(self) -> str:
        done, total = self.batches
        parts = [self.label + (f", batch {done}/{total}" if total else "")]
        step = self.step_eta()
        if step is not None:
            parts.append(f"step ETA {duration_text(step)}")
        if self.schedule:
            parts.append(self.run_text())
        return "; ".join(parts)

    def run_text(self) -> str:
        """``run 40% done, ETA 12 min`` (no ETA before a unit has finished)."""
        share = 100.0 * self.done / max(len(self.schedule), 1)
        eta = self.eta()
        return f"run {share:.0f}% done" + (f", ETA {duration_text(eta)}" if eta is not None else "")

    def _show(self, force: bool = False) -> None:
        now = self.clock()
        if self.interactive:
            if force or now - self.last_write >= 0.2:
                self.stream.write("\r\033[K" + self.text())
                self.stream.flush()
                self.last_write, self.drawn = now, True
        elif now - self.last_write >= self.every_s:
            self.emit("progress: " + self.text())
            self.last_write = now
