"""Server interceptors that keep one client from taking the API down.

``StreamLimitInterceptor``: a gRPC Python server runs every call on one of ``api.max_workers``
handler threads, and a stream (``WatchWorkload``, a reflection session) holds its thread for as long
as the client keeps it open. Forty idle watches once took all 32 threads, and ``ListClusters`` and the
health check then timed out. Streams are therefore counted, in total (``api.max_watches_total``, half
of the threads by default) and per bearer token (``api.max_watches_per_token``; per peer address
without a token), and one past either limit is answered ``RESOURCE_EXHAUSTED`` (reason
``TOO_MANY_WATCHES``) at once. The settings refuse to start unless ``api.reserved_workers`` threads
stay beyond the stream limit, so unary calls and the health service always have threads. A slot is
freed when the stream's handler returns: for a client that went away, within the store's watch poll
(1 s). Non-blocking handlers (grpcio's health ``Watch``) hold no thread and are not counted.

``UndecodableRequestInterceptor``: grpcio parses the request before any handler runs, and bytes that
are not the method's message made it answer ``INTERNAL 'Exception deserializing request!'`` and log
a traceback for each. Every handler's deserializer is wrapped: a ``DecodeError`` becomes an
:class:`UndecodableRequest` value, which the wrapped handler answers ``INVALID_ARGUMENT`` (reason
``UNDECODABLE_REQUEST``) with one log line, at most one a second (the others are counted in it).

Interceptors run outermost first: the bearer-token check comes before these, so an unauthenticated
stream is refused without taking a slot.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from global_scheduler.errors import rich_status

log = logging.getLogger(__name__)


def _header(details: grpc.HandlerCallDetails, name: str) -> str:
    for key, value in details.invocation_metadata or ():
        if key == name:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


def client_key(details: grpc.HandlerCallDetails) -> str | None:
    """Who a call counts against: a digest of its bearer token (the token itself is not kept), or None
    (then the peer address, known only inside the call)."""
    scheme, _, token = _header(details, "authorization").partition(" ")
    if scheme.lower() == "bearer" and token:
        return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    return None


def peer_host(peer: str) -> str:
    """``ipv4:127.0.0.1:5432`` → ``ipv4:127.0.0.1``; ``ipv6:[::1]:5432`` → ``ipv6:[::1]``."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class StreamLimiter:
    """Counts open streams in total and per client; thread-safe."""

    def __init__(self, *, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self.refused = 0

    @property
    def open(self) -> int:
        with self._lock:
            return sum(self._open.values())

    def acquire(self, client: str) -> str | None:
        """Take a slot for ``client``; None when taken, otherwise why not (the client is told)."""
        with self._lock:
            if self._open[client] >= self.per_client:
                self.refused += 1
                return (f"this client already has {self._open[client]} streams open, its limit "
                        "(api.max_watches_per_token): close one before opening another")
            if sum(self._open.values()) >= self.total:
                self.refused += 1
                return (f"the server has {self.total} streams open, its limit (api.max_watches_total), so that "
                        "unary calls keep their threads: retry later")
            self._open[client] += 1
            return None

    def release(self, client: str) -> None:
        with self._lock:
            self._open[client] -= 1
            if self._open[client] <= 0:
                del self._open[client]


def _is_non_blocking(behavior: Callable[..., Any] | None) -> bool:
    # grpcio's own marker for a handler that answers through a callback instead of holding a thread
    # (the health service's Watch); there is no declared interface to ask instead.
    return bool(getattr(behavior, "experimental_non_blocking", False))


class StreamLimitInterceptor(grpc.ServerInterceptor):
    """Counts streams per token where tokens are checked (``by_token``); without authentication any
    header could name a fresh "client", so streams count per peer address instead."""

    def __init__(self, limiter: StreamLimiter, *, by_token: bool) -> None:
        self.limiter = limiter
        self.by_token = by_token

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        if handler is None or not handler.response_streaming:
            return handler
        inner = handler.stream_stream if handler.request_streaming else handler.unary_stream
        if _is_non_blocking(inner):
            return handler
        token_key = client_key(handler_call_details) if self.by_token else None
        limiter = self.limiter

        def limited(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            key = token_key or peer_host(context.peer())
            refused = limiter.acquire(key)
            if refused is not None:
                context.abort_with_status(rich_status(grpc.StatusCode.RESOURCE_EXHAUSTED, refused,
                                                      reason="TOO_MANY_WATCHES"))
            try:
                yield from inner(request, context)
            finally:
                limiter.release(key)

        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(limited, **kw)
        return grpc.unary_stream_rpc_method_handler(limited, **kw)


@dataclass(frozen=True)
class UndecodableRequest:
    """What a wrapped deserializer returns for bytes that are not the method's message (never None:
    grpcio takes None for a failed deserialization and answers INTERNAL)."""

    size_bytes: int
    error: str


def tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return UndecodableRequest(len(data), str(exc)[:200])

    return deserialize


class UndecodableRequestInterceptor(grpc.ServerInterceptor):
    def __init__(self, *, log_interval_s: float = 1.0) -> None:
        self.refused = 0
        self._log_interval_s = log_interval_s
        self._lock = threading.Lock()
        self._last_log = -float("inf")
        self._unlogged = 0
        # Wrapped once per handler: registered handlers live as long as the server, and the hot path
        # (SubmitWorkload) then pays one dictionary lookup. Keyed by identity; the entry keeps the handler.
        self._wrapped: dict[int, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def _refuse(self, method: str, request: UndecodableRequest, context: grpc.ServicerContext) -> None:
        now = time.monotonic()
        with self._lock:
            self.refused += 1
            emit = now - self._last_log >= self._log_interval_s
            if emit:
                self._last_log, since, self._unlogged = now, self._unlogged, 0
            else:
                self._unlogged += 1
        if emit:
            more = f" ({since} more since the last line)" if since else ""
            log.warning("undecodable request to %s from %s (%d bytes): %s%s", method, context.peer(),
                        request.size_bytes, request.error, more)
        context.abort_with_status(rich_status(
            grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid message of {method}: {request.error}",
            reason="UNDECODABLE_REQUEST"))

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        cached = self._wrapped.get(id(handler))
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, handler_call_details.method or "?")
        if len(self._wrapped) < 1024:  # handlers made per call (none today) must not grow it forever
            self._wrapped[id(handler)] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        refuse = self._refuse
        kind = ("stream" if handler.request_streaming else "unary") + "_" + \
            ("stream" if handler.response_streaming else "unary")
        inner = getattr(handler, kind)

        if handler.request_streaming:
            def checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
                for request in requests:
                    if isinstance(request, UndecodableRequest):
                        refuse(method, request, context)
                    yield request

            def guarded(requests: Iterator[Any], context: grpc.ServicerContext, *args: Any, **kw: Any) -> Any:
                return inner(checked(requests, context), context, *args, **kw)
        else:
            def guarded(request: Any, context: grpc.ServicerContext, *args: Any, **kw: Any) -> Any:
                if isinstance(request, UndecodableRequest):
                    refuse(method, request, context)
                return inner(request, context, *args, **kw)

        if _is_non_blocking(inner):
            guarded.experimental_non_blocking = True  # type: ignore[attr-defined]
        make = getattr(grpc, f"{kind}_rpc_method_handler")
        return make(guarded, request_deserializer=tolerant(handler.request_deserializer),
                    response_serializer=handler.response_serializer)
