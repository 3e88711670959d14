"""The client's retries: a busy coordinator's refusals are retried after a random wait within the busy bounds, so
that the clients of a burst refused together come back spread out, not as one wave."""

from __future__ import annotations

import grpc

import client.transport as transport
from client.transport import BUSY_RETRY_MAX_S, BUSY_RETRY_MIN_S, Backoff, CoordinatorClient
from common.infra.tls import Security


class Busy(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return "too many calls in progress"


def test_busy_refusals_are_retried_after_spread_waits_within_the_bounds(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(transport.time, "sleep", waits.append)
    backoff = Backoff(initial_s=0.001, max_s=0.01)  # far below the busy bounds: the busy wait decides every retry
    client = CoordinatorClient("127.0.0.1:1", "c0", backoff, security=Security(insecure=True))
    refusals = iter(range(200))

    def call() -> str:
        if next(refusals) < 199:
            raise Busy()
        return "done"

    try:
        assert client._call("push", call) == "done"
    finally:
        client.close()
    assert len(waits) == 199 and all(BUSY_RETRY_MIN_S <= w <= BUSY_RETRY_MAX_S for w in waits)
    # spread over the interval, not one fixed wait (199 uniform draws: a range under half of it has odds ~1e-57)
    assert max(waits) - min(waits) > (BUSY_RETRY_MAX_S - BUSY_RETRY_MIN_S) / 2
