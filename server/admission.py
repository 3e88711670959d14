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
- **idle streams**: a Push that receives no message, or a Pull whose next message is not taken,
  for ``idle_s`` seconds is cancelled, which frees its thread.

It also contains failures: an exception that escapes a handler without a status (a bug, a full
disk) is logged with its traceback and answered ``INTERNAL``, never gRPC's default ``UNKNOWN``
with the exception's text.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import grpc

from server.auth import Authenticator

log = logging.getLogger("lorm.server")


@dataclass(frozen=True)
class Limits:
    per_client: int = 4  # a client needs one Pull or Push at a time; 4 leaves room for retries overlapping
    reserve: int = 4  # pool threads kept free of coordinator calls: health checks and refusals
    idle_s: float = 120.0  # seconds a stream may go without a message before it is cancelled

    def __post_init__(self) -> None:
        if self.per_client < 1 or self.reserve < 1 or not self.idle_s > 0:
            raise ValueError(
                f"admission limits must be positive, got per_client {self.per_client}, "
                f"reserve {self.reserve}, idle_s {self.idle_s}"
            )


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


class _Watchdog:
    """Cancels ``context`` unless :meth:`feed` is called at least every ``idle_s`` seconds."""

    def __init__(self, context: grpc.ServicerContext, idle_s: float) -> None:
        self.context, self.idle_s = context, idle_s
        self._timer: threading.Timer | None = None
        self.fired = False
        self.feed()

    def _fire(self) -> None:
        self.fired = True
        self.context.cancel()

    def feed(self) -> None:
        self.stop()
        self._timer = threading.Timer(self.idle_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _fed(items: Iterator[Any], dog: _Watchdog) -> Iterator[Any]:
    for item in items:
        dog.feed()
        yield item


class AdmissionInterceptor(grpc.ServerInterceptor):
    """Applies a :class:`CallLimiter` and idle deadlines to every call of ``service``; others pass."""

    def __init__(self, limiter: CallLimiter, auth: Authenticator, service: str) -> None:
        self.limiter, self.auth, self.prefix = limiter, auth, f"/{service}/"

    def _caller(self, context: grpc.ServicerContext) -> str:
        who = self.auth.identity(context) if self.auth.required else None
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
    def _admitted(self, context: grpc.ServicerContext) -> Iterator[None]:
        caller = self._caller(context)
        try:
            with self.limiter.slot(caller):
                yield
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
            with self._admitted(context):
                dog = _Watchdog(context, self.limiter.limits.idle_s)  # a reader that stops reading is cut off
                try:
                    for message in behavior(request, context):
                        yield message
                        dog.feed()
                finally:
                    dog.stop()

        return handle

    def _stream_unary(self, behavior: Callable) -> Callable:
        def handle(request_iterator, context):
            with self._admitted(context):
                dog = _Watchdog(context, self.limiter.limits.idle_s)  # a sender that stops sending is cut off
                try:
                    return behavior(_fed(request_iterator, dog), context)
                finally:
                    dog.stop()

        return handle
