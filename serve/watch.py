"""The served model, and its replacement when a newer export appears in the watched directory.

The coordinator writes an export's ``model.json`` last and atomically (``server/results.py``), after
removing the previous one from the same directory; so a directory whose card is present holds a whole
export, and a card that changed means a new one. The newest export is the one whose card was written
last. A new export that fails to load is logged and skipped, and the model in use stays.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from common.wire.model_card import CARD_FILE

log = logging.getLogger("lorm.serve")
M = TypeVar("M")
DEPTH = 3  # how far below the watched directory exports are looked for: runs/<run>/results/model.json


@dataclass(frozen=True)
class Stamp:
    """Which export, and which writing of its card."""

    path: Path
    mtime_ns: int
    size: int


def exports(root: Path) -> list[Stamp]:
    """Every export at or below ``root`` (at most :data:`DEPTH` levels), oldest card first."""
    found = []
    for depth in range(DEPTH + 1):
        for card in root.glob("/".join(["*"] * depth + [CARD_FILE])):
            try:
                stat = card.stat()
            except FileNotFoundError:  # replaced between the listing and now
                continue
            found.append(Stamp(card.parent, stat.st_mtime_ns, stat.st_size))
    return sorted(found, key=lambda s: (s.mtime_ns, str(s.path)))


class ModelSlot(Generic[M]):
    """The model in use (``current``) and its ``version`` (1, 2, ... as exports replace it)."""

    def __init__(self, root: str | Path, load: Callable[[Path], M]) -> None:
        self.root, self.load = Path(root), load
        self.current: M | None = None
        self.stamp: Stamp | None = None
        self.version = 0
        self.error = ""  # why the newest export is not the one in use ("" when it is)
        self._failed: Stamp | None = None
        self._lock = threading.Lock()  # one poll at a time

    def poll(self) -> bool:
        """Load the newest export if it is not the one in use (nor one that already failed); ``True`` if the
        model changed. Runs the whole load before the swap: requests keep the old model until then."""
        with self._lock:
            found = exports(self.root)
            if not found:
                if self.current is None:
                    self.error = f"no export ({CARD_FILE}) in {self.root} yet"
                return False
            newest = found[-1]
            if newest == self.stamp or newest == self._failed:
                return False
            try:
                model = self.load(newest.path)
            except Exception as err:  # a broken export must not take the server down: keep serving the last one
                self._failed, self.error = newest, f"{newest.path}: {type(err).__name__}: {err}"
                log.error("could not load the export %s: %s", newest.path, self.error)
                return False
            self.current, self.stamp, self.version, self.error = model, newest, self.version + 1, ""
            log.info("serving %s (version %d)", newest.path, self.version)
            return True
