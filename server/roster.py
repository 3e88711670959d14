"""The run's client slots: which client id holds which index.

A client holds its slot for the whole run: the coordinator commits the roster in the run's meta
(``RunMeta.clients``) before it answers a Join, so a client that joins again, after its own restart or
the coordinator's, gets the index it held. Not thread-safe: the coordinator calls it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from server.checks import Refused


@dataclass
class Roster:
    size: int  # the run's clients (``RunConfig.num_clients``)
    clients: dict[str, int] = field(default_factory=dict)  # client id -> index, as committed

    def join(self, client_id: str, requested: int | None = None) -> tuple[int, bool]:
        """The index ``client_id`` holds, and whether it took it now: the one it holds already (another
        ``requested`` index is refused), else ``requested`` when that is free, else the lowest free one."""
        if client_id in self.clients:
            index = self.clients[client_id]
            if requested is not None and requested != index:
                raise Refused(
                    "FAILED_PRECONDITION", f"client {client_id!r} already holds index {index}, not {requested}"
                )
            return index, False
        taken = set(self.clients.values())
        if requested is not None:
            if not 0 <= requested < self.size:
                raise Refused("INVALID_ARGUMENT", f"requested_index must lie in 0..{self.size - 1}, got {requested}")
            if requested in taken:
                raise Refused("ALREADY_EXISTS", f"client index {requested} is held by another client")
            index = requested
        else:
            free = [i for i in range(self.size) if i not in taken]
            if not free:
                # Final for this run: retrying cannot free a slot (RESOURCE_EXHAUSTED would be retried).
                raise Refused("FAILED_PRECONDITION", f"all {self.size} client slots are taken")
            index = free[0]
        self.clients[client_id] = index
        return index, True

    def index_of(self, client_id: str) -> int:
        """The index ``client_id`` holds (``PERMISSION_DENIED`` if it has not joined)."""
        if client_id not in self.clients:
            raise Refused("PERMISSION_DENIED", f"client {client_id!r} has not joined this run")
        return self.clients[client_id]

    @property
    def full(self) -> bool:
        return len(self.clients) == self.size
