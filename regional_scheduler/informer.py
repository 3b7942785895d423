"""List-and-watch of one Kubernetes resource, as client-go's reflector, on raw JSON.

``list`` (paginated) gives the whole set and a ``resourceVersion``; ``watch`` resumes from the last
``resourceVersion`` it saw (an event's or a bookmark's: ``allowWatchBookmarks`` lets the API server
advance it while nothing changes, so a resumed watch rarely finds its version compacted). A watch that
ends (server timeout, dropped connection) is resumed from there; ``410 Gone`` (the version is older
than etcd's history) means events were missed, so the informer lists again and hands the handler the
complete set (:meth:`InformerHandler.relisted`). Errors back off over a sequence of delays.

The objects are dicts parsed with ``json``: building the official client's model classes for a
backlog of thousands of pods costs more than scheduling them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)

ListFn = Callable[..., Any]


class InformerHandler(Protocol):
    def relisted(self, items: list[dict[str, Any]]) -> None:
        """The complete current set (first list, or a relist after 410 Gone)."""
        ...

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """``ADDED``, ``MODIFIED`` or ``DELETED``."""
        ...


class Informer:
    def __init__(self, *, name: str, list_fn: ListFn, handler: InformerHandler, field_selector: str | None = None,
                 page_size: int = 500, watch_timeout_s: int = 300,
                 backoff_s: Sequence[float] = (0.2, 0.5, 1.0, 2.0, 5.0), before_call: Callable[[], Any] | None = None,
                 request_timeout_s: float = 60.0) -> None:
        self.name = name
        self.list_fn = list_fn
        self.handler = handler
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = tuple(backoff_s)
        self.before_call = before_call
        self.request_timeout_s = request_timeout_s
        self.resource_version: str | None = None
        self.synced = threading.Event()
        self.relists = 0
        self.resumes = 0
        self._response: Any = None

    def _kwargs(self) -> dict[str, Any]:
        return {"field_selector": self.field_selector} if self.field_selector else {}

    def list(self) -> None:
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            if self.before_call is not None:
                self.before_call()
            resp = self.list_fn(limit=self.page_size, _continue=cont, _preload_content=False,
                                _request_timeout=self.request_timeout_s, **self._kwargs())
            body = json.loads(resp.data)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                self.resource_version = meta.get("resourceVersion")
                break
        self.handler.relisted(items)
        self.relists += 1
        self.synced.set()

    def watch(self, stop: threading.Event) -> None:
        """One watch request, until it ends; raises ApiException(410) when the version is gone."""
        if self.before_call is not None:
            self.before_call()
        # The server ends the watch after watch_timeout_s; the client's read timeout, a little longer,
        # catches an API server that vanished without closing the connection (bookmarks arrive about
        # once a minute, so a healthy watch is never silent that long).
        resp = self.list_fn(watch=True, resource_version=self.resource_version, allow_watch_bookmarks=True,
                            timeout_seconds=self.watch_timeout_s, _preload_content=False,
                            _request_timeout=(self.request_timeout_s, self.watch_timeout_s + 30), **self._kwargs())
        self._response = resp
        try:
            for line in iter_resp_lines(resp):
                if stop.is_set():
                    return
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=f"{obj.get('reason')}: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if kind != "BOOKMARK":
                    self.handler.event(kind, obj)
                if version:
                    self.resource_version = version
        finally:
            self._response = None
            resp.close()  # never back to the pool: a watch cut short leaves unread bytes on it

    def run(self, stop: threading.Event) -> None:
        failures = 0
        need_list = self.resource_version is None  # a caller may have listed already
        while not stop.is_set():
            try:
                if need_list:
                    self.list()
                    need_list = False
                self.watch(stop)
                self.resumes += 1
                failures = 0
            except ApiException as exc:
                if exc.status == 410:
                    log.info("informer %s: resourceVersion %s is gone; listing again", self.name, self.resource_version)
                    need_list = True
                    continue
                failures += 1
                delay = self.backoff_s[min(failures - 1, len(self.backoff_s) - 1)]
                log.warning("informer %s: %s %s; retrying in %.1f s", self.name, exc.status, exc.reason, delay)
                stop.wait(delay)
            except Exception as exc:  # connection refused, reset, timeouts: the API server is unreachable
                if stop.is_set():
                    return
                failures += 1
                delay = self.backoff_s[min(failures - 1, len(self.backoff_s) - 1)]
                log.warning("informer %s: API server unreachable (%s); retrying in %.1f s", self.name,
                            type(exc).__name__, delay)
                stop.wait(delay)

    def interrupt(self) -> None:
        """Unblock a watch waiting on the socket (shutdown)."""
        resp = self._response
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()
