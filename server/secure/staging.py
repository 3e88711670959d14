"""What the coordinator lends a secure step of its store: the step's staged submissions and the run's keys.

A :class:`Staging` is the coordinator's store under the open step's key, as the step's secure aggregation
(:mod:`server.secure.step`) sees it: where its session's state is saved, its masked inputs staged and read
back, and the run's record of every public key advertised so far (``server.store.SEEN_KEYS``, kept beside the
generations), by which the stages (:mod:`server.secure.stages`) refuse a replayed advertise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from common.infra.faults import fault_point
from common.secagg.persistence import apply_record, session_record
from common.secagg.server_session import ServerSession
from common.wire.messages import ClientUpdate
from server.store import Storage


@dataclass
class Staging:
    """The open step's staged submissions, as its secure aggregation sees them: the coordinator's store
    under the step's key, and the step's own set of indices whose submission is staged."""

    store: Storage
    key: str
    submitted: set[int]

    def save(self, state: dict) -> None:
        """The step's secure state, whole (a round closed, a session restarted)."""
        self.store.save_secagg(self.key, state)

    def record(self, session: ServerSession, stage: str, index: int) -> None:
        """Client ``index``'s call of ``stage``: only what it added to ``session``, appended."""
        self.store.append_secagg(self.key, session_record(session, stage, index))

    def saved(self) -> dict | None:
        """The step's secure state as last saved, with the records appended since replayed onto its session."""
        state, records = self.store.load_secagg(self.key)
        if state is not None:
            for record in records:
                apply_record(state["session"], record)
        return state

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
        return self.store.seen_keys()

    def remember_keys(self, fingerprints: Iterable[str]) -> None:
        """Add ``fingerprints`` to the run's record of advertised keys (kept beside its generations: the
        staging of a step is dropped once it is merged, the record outlives it)."""
        self.store.add_seen_keys(set(fingerprints))


def fingerprint(point: bytes) -> str:
    """What the run's record of keys holds of a key's fingerprint (:func:`key_fingerprints`): 16 bytes, hex."""
    return point[:16].hex()
