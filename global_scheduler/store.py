"""Workloads the global scheduler has accepted: records, idempotency keys, watchers.

One lock guards the maps; every change bumps the record's version and notifies a condition that
``WatchWorkload`` streams wait on. Records are kept as protobuf ``Workload`` messages so the API returns
them without conversion (copies are handed out, never the stored message).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from global_scheduler.validation import ParsedRequests
from protos import global_api_pb2 as api

TERMINAL = frozenset({api.WORKLOAD_STATE_FAILED, api.WORKLOAD_STATE_CANCELLED})
ACTIVE_ON_CLUSTER = frozenset({api.WORKLOAD_STATE_DISPATCHED, api.WORKLOAD_STATE_SCHEDULED,
                               api.WORKLOAD_STATE_RUNNING})


class IdempotencyConflictError(Exception):
    def __init__(self, key: str, workload_id: str) -> None:
        self.key, self.workload_id = key, workload_id
        super().__init__(f"idempotency_key {key!r} was used for workload {workload_id} with a different spec")


@dataclass
class Entry:
    workload: api.Workload
    requests: ParsedRequests
    spec_bytes: bytes
    version: int = 0
    excluded_clusters: set[str] = field(default_factory=set)


class WorkloadStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._entries: dict[str, Entry] = {}
        self._order: list[str] = []
        self._by_key: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def create(self, spec: api.WorkloadSpec, requests: ParsedRequests, idempotency_key: str,
               now_s: float | None = None) -> tuple[api.Workload, bool]:
        """Returns (workload, created). Same key + same spec → the existing workload, created=False."""
        spec_bytes = spec.SerializeToString(deterministic=True)
        now_s = time.time() if now_s is None else now_s
        with self._lock:
            if idempotency_key:
                existing = self._by_key.get(idempotency_key)
                if existing is not None:
                    entry = self._entries[existing]
                    if entry.spec_bytes != spec_bytes:
                        raise IdempotencyConflictError(idempotency_key, existing)
                    return self._copy(entry.workload), False
            wid = uuid.uuid4().hex
            w = api.Workload(id=wid, state=api.WORKLOAD_STATE_PENDING, created_unix_s=now_s, updated_unix_s=now_s,
                             idempotency_key=idempotency_key, message="accepted; waiting for routing")
            w.spec.CopyFrom(spec)
            self._entries[wid] = Entry(w, requests, spec_bytes)
            self._order.append(wid)
            if idempotency_key:
                self._by_key[idempotency_key] = wid
            return self._copy(w), True

    @staticmethod
    def _copy(w: api.Workload) -> api.Workload:
        out = api.Workload()
        out.CopyFrom(w)
        return out

    def get(self, wid: str) -> api.Workload | None:
        with self._lock:
            entry = self._entries.get(wid)
            return None if entry is None else self._copy(entry.workload)

    def entry(self, wid: str) -> Entry | None:
        """The live entry (callers hold no lock: read-only use of immutable parts only)."""
        return self._entries.get(wid)

    def update(self, wid: str, *, expect_attempt: int | None = None, copy: bool = True,
               **changes: object) -> api.Workload | None:
        """Apply field changes; with ``expect_attempt`` only if the attempt still matches. Returns a copy (or,
        with ``copy=False``, the stored message itself, for callers that only test for None)."""
        with self._lock:
            entry = self._entries.get(wid)
            if entry is None:
                return None
            w = entry.workload
            if expect_attempt is not None and w.attempt != expect_attempt:
                return None
            for name, value in changes.items():
                if name == "nodes":
                    del w.nodes[:]
                    w.nodes.extend(value)  # type: ignore[arg-type]
                elif name == "exclude_cluster":
                    entry.excluded_clusters.add(str(value))
                else:
                    setattr(w, name, value)
            w.updated_unix_s = time.time()
            entry.version += 1
            self._changed.notify_all()
            return self._copy(w) if copy else w

    def excluded(self, wid: str) -> set[str]:
        with self._lock:
            entry = self._entries.get(wid)
            return set(entry.excluded_clusters) if entry else set()

    def list(self, *, tenant: str = "", state: int = 0, cluster: str = "", offset: int = 0,
             limit: int = 100) -> tuple[list[api.Workload], int | None]:
        """A page in submission order and the offset of the next page (None at the end)."""
        out: list[api.Workload] = []
        with self._lock:
            i = offset
            while i < len(self._order) and len(out) < limit:
                w = self._entries[self._order[i]].workload
                i += 1
                if (tenant and w.spec.tenant != tenant) or (state and w.state != state) or \
                        (cluster and w.cluster != cluster):
                    continue
                out.append(self._copy(w))
            return out, (i if i < len(self._order) else None)

    def on_cluster(self, cluster: str) -> list[str]:
        with self._lock:
            return [wid for wid, e in self._entries.items()
                    if e.workload.cluster == cluster and e.workload.state in ACTIVE_ON_CLUSTER]

    def watch(self, wid: str, *, is_active: Callable[[], bool], poll_s: float = 1.0) -> Iterator[api.Workload]:
        """Yield the workload now and after every change, until it is terminal or the caller leaves."""
        last = -1
        while True:
            with self._lock:
                entry = self._entries.get(wid)
                if entry is None:
                    return
                if entry.version == last:
                    if not is_active():
                        return
                    self._changed.wait(timeout=poll_s)
                    continue
                last = entry.version
                snapshot = self._copy(entry.workload)
            yield snapshot
            if snapshot.state in TERMINAL or not is_active():
                return

    def counts_by_state(self) -> dict[int, int]:
        with self._lock:
            counts: dict[int, int] = {}
            for e in self._entries.values():
                counts[e.workload.state] = counts.get(e.workload.state, 0) + 1
            return counts
