"""What the coordinator lends a secure step of its store: the step's staged submissions and the run's keys.

A :class:`Staging` is the coordinator's store under the open step's key, as the step's secure aggregation
(:mod:`server.secure.step`) sees it: where its session's state is saved, its masked inputs staged and read
back, and the run's record of every public key advertised so far (:data:`SEEN_KEYS`, kept beside the
generations), by which the stages (:mod:`server.secure.stages`) refuse a replayed advertise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from common.infra.faults import fault_point
from common.infra.files import atomic_write_json
from common.wire.messages import ClientUpdate
from server.store import Store


@dataclass
class Staging:
    """The open step's staged submissions, as its secure aggregation sees them: the coordinator's store
    under the step's key, and the step's own set of indices whose submission is staged."""

    store: Store
    key: str
    submitted: set[int]

    def save(self, state: dict) -> None:
        self.store.save_secagg(self.key, state)

    def load(self, index: int) -> ClientUpdate:
        return self.store.load_update(self.key, index)

    def stage(self, update: ClientUpdate, idempotency_key: str) -> None:
        self.store.stage_update(self.key, update, idempotency_key)
        fault_point("push.staged")
        self.submitted.add(update.client_index)

    def drop(self) -> None:
        """Forget the staged masked inputs (an abandoned session's), on disk and in memory."""
        self.store.drop_updates(self.key)
        self.submitted.clear()

    def seen_keys(self) -> set[str]:
        """The fingerprints (hex) of every public key advertised in the run's earlier secure sessions."""
        path = self.store.root / SEEN_KEYS
        return set(json.loads(path.read_text())) if path.exists() else set()

    def remember_keys(self, fingerprints: Iterable[str]) -> None:
        """Add ``fingerprints`` to the run's record of advertised keys (kept beside its generations: the
        staging of a step is dropped once it is merged, the record outlives it)."""
        seen = self.seen_keys()
        if not set(fingerprints) <= seen:
            atomic_write_json(self.store.root / SEEN_KEYS, sorted(seen | set(fingerprints)))


SEEN_KEYS = "secagg-seen-keys.json"  # in the store's root: 16 bytes of each key's fingerprint, hex, one list


def fingerprint(point: bytes) -> str:
    """What the run's record of keys holds of a key's fingerprint (:func:`key_fingerprints`): 16 bytes, hex."""
    return point[:16].hex()
