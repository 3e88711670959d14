"""How a step's update reaches the coordinator: pushed in the clear (:class:`Pushed`), or, under secure aggregation,
masked in the step's session (:class:`Masked`, the wrapper the session chooses once per step).

A delivery says whether the result it sends is kept across a restart of the step's secure session (:attr:`keeps`:
the same plan gets the same result, masked anew, never a second training over the same records).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from client.secure import SecureRounds
from client.transport import Transport
from common.wire.messages import ClientUpdate

log = logging.getLogger("lorm.client")


class Delivery(Protocol):
    keeps: ClassVar[bool]  # the result is kept across a restart of the step's secure session

    def send(self, update: ClientUpdate, key: str) -> None:
        """Send ``update`` under idempotency ``key``."""


@dataclass(frozen=True)
class Pushed:
    """The update in the clear, one push."""

    transport: Transport
    keeps: ClassVar[bool] = False

    def send(self, update: ClientUpdate, key: str) -> None:
        self.transport.push(update, key)


@dataclass(frozen=True)
class Masked:
    """The update's terms masked in the step's secure session (``rounds``, begun: its keys and shares sent), pushed,
    then the unmask request answered; ``unmasking`` (the client's ledger) is told the survivors before anything is
    revealed."""

    rounds: SecureRounds
    unmasking: Callable[[list[int]], None] | None
    keeps: ClassVar[bool] = True

    def send(self, update: ClientUpdate, key: str) -> None:
        summed = self.rounds.finish(update, functools.partial(self.rounds.client.push, key=key), self.unmasking)
        log.info("secure aggregation: pushed masked terms; the coordinator unmasks the sum of %d", summed)
