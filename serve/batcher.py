"""Concurrent requests' samples gathered into shared forward passes (a micro-batcher).

A request's samples wait in one queue. One batch at a time runs on a worker thread (the model's kernels
release the GIL, so the event loop keeps taking requests meanwhile), and the next batch is gathered while
it runs: up to ``max_batch`` samples, or whatever has come when the oldest waiting sample has waited
``max_wait_s``. Under load the queue already holds a full batch when a batch ends, so nothing waits; alone,
a request waits at most ``max_wait_s`` for company. A request larger than ``max_batch`` is cut across
batches and answered when its last piece is done.

The samples held at once (admitted and not yet answered: being prepared, waiting or in the running batch) are
at most ``max_queue``; a request that would pass it is refused at once (:class:`QueueFull`), before anything
of it is prepared, so that a burst costs its callers a retry, not the server its memory.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class QueueFull(RuntimeError):
    """The queue holds too many samples to admit a request now; the message says how many and the bound."""


@dataclass
class _Request:
    samples: Sequence[Any]
    future: asyncio.Future
    arrived: float
    taken: int = 0  # samples already put into a batch
    pending: int = 0  # batches holding a piece of it that have not finished
    results: list[Any] = field(init=False)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.samples)


class MicroBatcher(Generic[R]):
    """``await submit(samples)`` returns ``run(samples)``'s results in order; ``run`` sees batches that mix
    the samples of concurrent calls, at most ``max_batch`` of them; at most ``max_queue`` samples are held."""

    def __init__(
        self,
        run: Callable[[list[Any]], list[R]],
        max_batch: int = 32,
        max_wait_s: float = 0.005,
        max_queue: int = 512,
    ) -> None:
        if max_batch < 1 or not max_wait_s >= 0 or max_queue < 1:
            raise ValueError(
                f"max_batch must be >= 1, max_queue >= 1 and max_wait_s >= 0, got {max_batch}, {max_queue} and "
                f"{max_wait_s}"
            )
        self.run, self.max_batch, self.max_wait_s, self.max_queue = run, max_batch, max_wait_s, max_queue
        self.sizes: Counter[int] = Counter()  # batch size -> how many batches ran with it
        self.held = 0  # samples admitted and not yet answered
        self._queue: deque[_Request] = deque()
        self._arrived = asyncio.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lorm-batch")
        self._task: asyncio.Task | None = None

    async def submit(
        self, samples: Sequence[Any], prepare: Callable[[Sequence[Any]], Sequence[Any]] | None = None
    ) -> list[R]:
        """``run``'s results for ``samples``, or :class:`QueueFull` at once. ``prepare`` (on a thread, once the
        samples are admitted) turns them into what ``run`` takes, one for one: what it builds (decoded images)
        is counted against ``max_queue`` before it exists."""
        if self._task is None:
            raise RuntimeError("the batcher is not started (await start() first)")
        if not samples:
            return []
        n = len(samples)
        if n > self.max_queue:
            raise ValueError(f"{n} samples in one request, more than the queue holds ({self.max_queue})")
        if self.held + n > self.max_queue:
            raise QueueFull(
                f"the queue holds {self.held} samples and takes {self.max_queue} at most: {n} more do not fit now"
            )
        self.held += n
        try:
            if prepare is not None:
                samples = await asyncio.to_thread(prepare, samples)
                assert len(samples) == n, f"prepare returned {len(samples)} samples for {n}"
            request = _Request(samples, asyncio.get_running_loop().create_future(), time.monotonic())
            self._queue.append(request)
            self._arrived.set()
            return await request.future
        finally:  # answered, failed or abandoned by its caller: its samples no longer count
            self.held -= n

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="lorm-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for request in self._queue:
            if not request.future.done():
                request.future.set_exception(RuntimeError("the server is shutting down"))
        self._queue.clear()
        self._worker.shutdown(wait=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            pieces = await self._gather()
            if not pieces:
                continue
            samples = [s for request, lo, hi in pieces for s in request.samples[lo:hi]]
            self.sizes[len(samples)] += 1
            try:
                results = await loop.run_in_executor(self._worker, self.run, samples)
                if len(results) != len(samples):
                    raise RuntimeError(f"the model returned {len(results)} results for {len(samples)} samples")
            except Exception as err:  # the model's failure is each request's answer, not the server's end
                for request, _, _ in pieces:
                    if not request.future.done():
                        request.future.set_exception(err)
                continue
            at = 0
            for request, lo, hi in pieces:
                request.results[lo:hi] = results[at : at + hi - lo]
                at += hi - lo
                request.pending -= 1
                if request.pending == 0 and request.taken == len(request.samples) and not request.future.done():
                    request.future.set_result(request.results)

    async def _gather(self) -> list[tuple[_Request, int, int]]:
        """The next batch as (request, lo, hi) pieces: wait for a first sample, then for more until the batch
        is full or the oldest has waited ``max_wait_s``."""
        while not self._queue:
            self._arrived.clear()
            await self._arrived.wait()
        deadline = self._queue[0].arrived + self.max_wait_s
        while self._waiting() < self.max_batch and (left := deadline - time.monotonic()) > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                break
        pieces, room = [], self.max_batch
        while self._queue and room:
            request = self._queue[0]
            if request.future.done():  # its caller went away (cancelled): nothing to compute
                self._queue.popleft()
                continue
            lo = request.taken
            hi = min(len(request.samples), lo + room)
            request.taken, request.pending, room = hi, request.pending + 1, room - (hi - lo)
            pieces.append((request, lo, hi))
            if hi == len(request.samples):
                self._queue.popleft()
        return pieces

    def _waiting(self) -> int:
        return sum(len(r.samples) - r.taken for r in self._queue)
