"""Admission of calls to the coordinator's service: no client can take the server's threads.

gRPC Python runs every handler, the health service's too, on one thread pool. A call that
sends nothing (an idle Push) or reads nothing (a stalled Pull) would hold its thread for as
long as the caller likes, so without limits one authenticated client could fill the pool and
starve every other client and the health probe. Three bounds, enforced before a handler runs
and while it runs:

- **per client**: at most ``per_client`` of the coordinator's calls in progress for one caller
  (its authenticated identity; its connection's peer address when the run authenticates
  nobody). Beyond it the call is answered ``RESOURCE_EXHAUSTED`` at once.
- **in all**: at most ``max_active`` of the coordinator's calls in progress, fewer than the pool's
  threads, so that ``reserve`` threads always remain for health checks and for refusals.
- **slow streams**: a stream's peer sets its pace, within two bounds on the time the handler
  spends waiting on it (for a Push's next message, for a Pull's reader to take one; the
  coordinator's own work does not count). One wait longer than ``idle_s`` seconds, or, after
  ``grace_s`` seconds of waiting in all, fewer than ``min_rate`` message bytes per second waited,
  and the call is cancelled, which frees its thread and slot. The idle bound alone let a Push
  that sends a byte a minute keep its slot for ever; with the rate bound a stream
  holds it at most ``grace_s`` + its bytes / ``min_rate`` seconds, and a Push's bytes are bounded
  by the declared size the coordinator accepts.

It also contains failures: an exception that escapes a handler without a status (a bug, a full
disk) is logged with its traceback and answered ``INTERNAL``, never gRPC's default ``UNKNOWN``
with the exception's text.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from server.auth import Authenticator

log = logging.getLogger("lorm.server")


@dataclass(frozen=True)
class Limits:
    per_client: int = 4  # a client needs one Pull or Push at a time; 4 leaves room for retries overlapping
    reserve: int = 4  # pool threads kept free of coordinator calls: health checks and refusals
    idle_s: float = 120.0  # seconds a stream may make the handler wait for one message before it is cancelled
    grace_s: float = 30.0  # seconds of waiting on a stream's peer before min_rate applies (a slow start)
    # Message bytes per second waited on the peer, after grace_s (0: no bound). 16 KiB/s is 300 times
    # slower than the 5 MB/s a push moves at 50 ms RTT (SERVER_OPTIONS), far below any working link.
    min_rate: float = 16 * 1024.0

    def __post_init__(self) -> None:
        if self.per_client < 1 or self.reserve < 1 or not self.idle_s > 0:
            raise ValueError(
                f"admission limits must be positive, got per_client {self.per_client}, "
                f"reserve {self.reserve}, idle_s {self.idle_s}"
            )
        for name, value in (("grace_s", self.grace_s), ("min_rate", self.min_rate)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"admission limit {name} must be a finite number >= 0, got {value}")


class Busy(Exception):
    """A call over one of the bounds; ``str()`` says which."""


class CallLimiter:
    """Counts the coordinator's calls in progress, per caller and in all."""

    def __init__(self, limits: Limits, max_active: int) -> None:
        if max_active < 1:
            raise ValueError(f"the pool leaves no thread for the coordinator's calls (max_active {max_active})")
        self.limits, self.max_active = limits, max_active
        self._lock = threading.Lock()
        self._active = 0
        self._by_caller: dict[str, int] = defaultdict(int)

    @contextmanager
    def slot(self, caller: str) -> Iterator[None]:
        with self._lock:
            if self._by_caller[caller] >= self.limits.per_client:
                raise Busy(
                    f"caller {caller!r} already has {self._by_caller[caller]} calls in progress "
                    f"(limit {self.limits.per_client}); retry after one of them ends"
                )
            if self._active >= self.max_active:
                raise Busy(
                    f"the coordinator has {self._active} calls in progress (limit {self.max_active}); retry later"
                )
            self._by_caller[caller] += 1
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                self._by_caller[caller] -= 1
                if not self._by_caller[caller]:
                    del self._by_caller[caller]

    def in_progress(self) -> int:
        with self._lock:
            return self._active


class _PeerClock:
    """Times one stream's waits on its peer; cancels the call when the peer is too slow (see the module).

    The handler calls :meth:`waiting` when it starts to wait on the peer and :meth:`moved` when the
    wait ends with a message; a timer armed for the time the current wait may last fires otherwise."""

    def __init__(self, context: grpc.ServicerContext, limits: Limits, what: str) -> None:
        self.context, self.limits, self.what = context, limits, what
        self.waited = 0.0  # seconds spent waiting on the peer, all waits so far
        self.bytes = 0  # message bytes the peer sent or took
        self.fired = ""  # why the call was cancelled ("" while it was not)
        self._since: float | None = None  # when the current wait began
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def _allowed(self) -> float:
        """Seconds the current wait may last: the idle bound, and the rate bound's remaining credit."""
        allowed = self.limits.idle_s
        if self.limits.min_rate > 0:
            allowed = min(allowed, self.limits.grace_s + self.bytes / self.limits.min_rate - self.waited)
        return max(allowed, 0.0)

    def waiting(self) -> None:
        with self._lock:
            self._since = time.monotonic()
            self._timer = threading.Timer(self._allowed(), self._fire)
            self._timer.daemon = True
            self._timer.start()

    def moved(self, nbytes: int) -> None:
        with self._lock:
            self._stop()
            if self._since is not None:
                self.waited += time.monotonic() - self._since
                self._since = None
            self.bytes += nbytes

    def stop(self) -> None:
        with self._lock:
            self._stop()
            self._since = None

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        with self._lock:
            if self._since is None:  # the wait ended as the timer fired
                return
            wait = time.monotonic() - self._since
            if wait >= self.limits.idle_s:
                self.fired = f"no message for {wait:.1f} s (idle limit {self.limits.idle_s:g} s)"
            else:
                self.fired = (
                    f"{self.bytes} bytes in {self.waited + wait:.1f} s of waiting on it, under "
                    f"{self.limits.min_rate:g} bytes/s after a grace of {self.limits.grace_s:g} s"
                )
        log.warning("cancelled %s: %s", self.what, self.fired)
        self.context.cancel()


def _size(message: Any) -> int:
    return message.ByteSize() if hasattr(message, "ByteSize") else len(message)


def _paced(items: Iterator[Any], clock: _PeerClock) -> Iterator[Any]:
    """``items`` (a request stream), each wait for the next one timed by ``clock``."""
    while True:
        clock.waiting()
        try:
            item = next(items)
        except StopIteration:
            clock.moved(0)
            return
        clock.moved(_size(item))
        yield item


class AdmissionInterceptor(grpc.ServerInterceptor):
    """Applies a :class:`CallLimiter` and the slow-stream bounds to every call of ``service``; others pass. The
    caller is its authenticated client identity (``auth``), or its connection's peer (``auth`` ``None``: a service
    whose callers are not the run's clients, the operator's)."""

    def __init__(self, limiter: CallLimiter, auth: Authenticator | None, service: str) -> None:
        self.limiter, self.auth, self.prefix = limiter, auth, f"/{service}/"

    def _caller(self, context: grpc.ServicerContext) -> str:
        who = self.auth.identity(context) if self.auth is not None and self.auth.required else None
        return who if who is not None else f"peer {context.peer()}"

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self.prefix):
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary), handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(handler.unary_stream), handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._stream_unary(handler.stream_unary), handler.request_deserializer, handler.response_serializer
            )
        raise ValueError(f"{handler_call_details.method}: bidirectional streams are not admitted")

    @contextmanager
    def _admitted(self, context: grpc.ServicerContext) -> Iterator[str]:
        caller = self._caller(context)
        try:
            with self.limiter.slot(caller):
                yield caller
        except Busy as err:  # only the slot raises it, before the handler runs
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        except Exception:
            if context.code() is not None:  # the handler answered with a status (context.abort raises)
                raise
            log.exception("internal error in a call from %s", caller)
            context.abort(grpc.StatusCode.INTERNAL, "internal error in the coordinator (its log has the details)")

    def _unary(self, behavior: Callable) -> Callable:
        def handle(request, context):
            with self._admitted(context):
                return behavior(request, context)

        return handle

    def _unary_stream(self, behavior: Callable) -> Callable:
        def handle(request, context):
            with self._admitted(context) as caller:
                clock = _PeerClock(context, self.limiter.limits, f"a stream's replies to {caller}")
                try:
                    for message in behavior(request, context):
                        clock.waiting()  # a reader that takes nothing, or takes it too slowly, is cut off
                        yield message
                        clock.moved(_size(message))
                finally:
                    clock.stop()

        return handle

    def _stream_unary(self, behavior: Callable) -> Callable:
        def handle(request_iterator, context):
            with self._admitted(context) as caller:
                clock = _PeerClock(context, self.limiter.limits, f"a request stream from {caller}")
                try:  # a sender that sends nothing, or trickles, is cut off
                    return behavior(_paced(iter(request_iterator), clock), context)
                finally:
                    clock.stop()

        return handle
