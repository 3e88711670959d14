"""The micro-batcher: concurrent requests share forward passes, each gets its own answers, in order."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from serve.batcher import MicroBatcher


class Recorder:
    """A model that returns each sample doubled and records the batches it saw (optionally slow)."""

    def __init__(self, seconds: float = 0.0, fail_on: object = None) -> None:
        self.batches: list[list[int]] = []
        self.seconds, self.fail_on = seconds, fail_on
        self.threads: set[int] = set()

    def __call__(self, samples: list[int]) -> list[int]:
        self.batches.append(list(samples))
        self.threads.add(threading.get_ident())
        if self.fail_on in samples:
            raise ValueError(f"cannot score {self.fail_on}")
        time.sleep(self.seconds)
        return [2 * s for s in samples]


async def serve(model: Recorder, requests: list[list[int]], **options) -> list:
    batcher = MicroBatcher(model, **options)
    batcher.start()
    try:
        return await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)
    finally:
        await batcher.stop()


def test_concurrent_requests_share_batches_and_get_their_own_answers():
    model = Recorder(seconds=0.01)
    requests = [[10 * i + k for k in range(i % 3 + 1)] for i in range(40)]  # 1 to 3 samples each, 80 in all
    answers = asyncio.run(serve(model, requests, max_batch=8, max_wait_s=0.5))
    assert answers == [[2 * s for s in r] for r in requests]
    assert all(len(b) <= 8 for b in model.batches)
    assert len(model.batches) == 10  # 80 samples in full batches of 8: nobody waited alone
    assert sorted(s for b in model.batches for s in b) == sorted(s for r in requests for s in r)
    assert threading.get_ident() not in model.threads  # the model ran off the event loop


def test_a_request_larger_than_a_batch_is_cut_across_batches():
    model = Recorder()
    answers = asyncio.run(serve(model, [list(range(20)), [100]], max_batch=8, max_wait_s=0.05))
    assert answers == [[2 * s for s in range(20)], [200]]
    assert [len(b) for b in model.batches] == [8, 8, 5]  # the small request rides in the last piece's batch


def test_a_lone_request_waits_at_most_max_wait():
    model = Recorder()
    start = time.monotonic()
    assert asyncio.run(serve(model, [[1]], max_batch=32, max_wait_s=0.2)) == [[2]]
    assert 0.2 <= time.monotonic() - start < 2.0 and model.batches == [[1]]


def test_a_failed_batch_fails_its_requests_only():
    model = Recorder(fail_on=7)

    async def run() -> tuple[list, list]:
        batcher = MicroBatcher(model, max_batch=4, max_wait_s=0.05)
        batcher.start()
        try:
            first = await asyncio.gather(batcher.submit([7]), batcher.submit([1]), return_exceptions=True)
            second = await asyncio.gather(batcher.submit([2]))
            return first, second
        finally:
            await batcher.stop()

    first, second = asyncio.run(run())
    assert all(isinstance(a, ValueError) and "cannot score 7" in str(a) for a in first)
    assert second == [[4]]  # the batcher goes on after a failure


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        MicroBatcher(Recorder(), max_batch=0)
