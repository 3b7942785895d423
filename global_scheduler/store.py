"""Workloads the global scheduler has accepted: records, idempotency keys, watchers.

One lock guards the maps; every change bumps the record's version and notifies a condition that
``WatchWorkload`` streams wait on. Records are kept as protobuf ``Workload`` messages so the API returns
them without conversion (copies are handed out, never the stored message).

Durability: with a bus, every record is also kept in Redis, in one of ``buckets`` hashes chosen by its id
(:func:`bucket_key`, ``meridian:workloads:{b007}``: each bucket its own hash tag, so a Redis Cluster spreads
the records over its primaries and no single key holds them all). A new
workload is written *before* ``SubmitWorkload`` answers, so an accepted workload and its idempotency key
survive a restart of the scheduler (the same key after a restart still gives the same workload, never
two). New records are written by group commit: concurrent submissions join one open batch and one of
them writes the whole batch in a single ``HSET`` while the others wait for it, so no lock is held over
a round trip to Redis (holding the store's lock there serialised every API call behind Redis). A record
becomes visible (``get``, the router, a second submission with its key) only once its batch is written;
a submission with a key whose record is still being written waits for that write's outcome.

With ``replicas`` > 0 (a Redis with replicas, e.g. a Redis Cluster) every write waits for that many replicas
(``WAIT``) before the submission or the dispatch it guards is acknowledged, so a primary lost in a failover
takes no accepted workload with it; a write its replicas did not confirm fails the submission (the caller
retries with its idempotency key). Such a failed write may still be on the primary: after a restart,
:meth:`WorkloadStore.restore` keeps only the newest record per idempotency key, the one whose submission
was answered, so a retried submission is never routed twice.

Later changes mark the record dirty and :meth:`WorkloadStore.flush` writes all dirty records in one
round trip; the engine flushes before it publishes a dispatch and before it acknowledges events, so what
Redis holds is never behind what the clusters were told. Not kept: excluded clusters of a workload
(a rejecting cluster may be tried once more after a restart).

High availability: with a ``fence`` every write (new records, flushes, purges) runs in one Redis script
that first checks the leader lock still holds this replica's fencing token; a deposed leader's write is
refused whole (:mod:`global_scheduler.leadership`), and since the router flushes a new attempt before
publishing it, a deposed leader never publishes a new attempt.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from global_scheduler.validation import ParsedRequests, parse_requests
from meridian.bus import StreamBus
from meridian.bus.streams import workload_bucket
from protos import global_api_pb2 as api

log = logging.getLogger(__name__)

#: Default number of workload buckets: enough to spread over the primaries of a large Redis Cluster; fixed
#: for the life of a store's data (restore reads buckets 0 … n-1).
DEFAULT_BUCKETS = 16


def bucket_keys(buckets: int = DEFAULT_BUCKETS) -> list[str]:
    """Every bucket of a store with ``buckets`` buckets (what ``restore`` reads)."""
    return [workload_bucket(i) for i in range(buckets)]


def bucket_key(workload_id: str, buckets: int) -> str:
    """The hash holding ``workload_id``'s record: a stable hash of the id (crc32), not Python's salted ``hash``."""
    return workload_bucket(zlib.crc32(workload_id.encode()) % buckets)

TERMINAL = frozenset({api.WORKLOAD_STATE_FAILED, api.WORKLOAD_STATE_CANCELLED, api.WORKLOAD_STATE_SUCCEEDED})
ACTIVE_ON_CLUSTER = frozenset({api.WORKLOAD_STATE_DISPATCHED, api.WORKLOAD_STATE_SCHEDULED,
                               api.WORKLOAD_STATE_RUNNING})


class HashWriter(Protocol):
    """Where the store's records are written: the bus, or a fence in front of it."""

    def hash_set(self, key: str, items: Mapping[str, bytes], *, replicas: int = 0) -> None: ...

    def hash_delete(self, key: str, fields: Sequence[str], *, replicas: int = 0) -> None: ...


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


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


@dataclass
class _Batch:
    """New records waiting for one write; ``done`` is set once it succeeded or failed (``error``)."""

    records: dict[str, Entry] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None


class WorkloadStore:
    def __init__(self, bus: StreamBus | None = None, *, fence: HashWriter | None = None,
                 buckets: int = DEFAULT_BUCKETS, replicas: int = 0) -> None:
        """``fence`` (high availability, :class:`global_scheduler.leadership.Fence`): writes go through it, and
        are refused (``FencedError``, nothing written) unless this replica still holds the leader lock.
        ``buckets``: how many hashes the records are split over; ``replicas``: how many replicas must confirm
        every write before it is acknowledged (0: the primary's reply is enough)."""
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, not {buckets}")
        self.buckets = buckets
        self.replicas = replicas
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._entries: dict[str, Entry] = {}
        self._order: list[str] = []
        self._by_key: dict[str, str] = {}
        self._bus = bus
        self._writer: HashWriter | None = fence if fence is not None and bus is not None else bus
        self._dirty: set[str] = set()
        self._flush_lock = threading.Lock()  # one flush at a time: a late older snapshot must not win
        self._commit_lock = threading.Lock()  # one batch of new records in flight at a time
        self._open: _Batch | None = None  # the batch that new submissions join
        self._writing: dict[str, _Batch] = {}  # idempotency key → the batch holding its unwritten record

    def __len__(self) -> int:
        return len(self._entries)

    def create(self, spec: api.WorkloadSpec, requests: ParsedRequests, idempotency_key: str,
               now_s: float | None = None) -> tuple[api.Workload, bool]:
        """Returns (workload, created). Same key + same spec → the existing workload, created=False.
        With a bus it returns only once the record is in Redis; a bus error raises and keeps nothing."""
        spec_bytes = spec.SerializeToString(deterministic=True)
        now_s = time.time() if now_s is None else now_s
        while True:
            with self._lock:
                if idempotency_key:
                    existing = self._by_key.get(idempotency_key)
                    if existing is not None:
                        entry = self._entries[existing]
                        if entry.spec_bytes != spec_bytes:
                            raise IdempotencyConflictError(idempotency_key, existing)
                        return self._copy(entry.workload), False
                    pending = self._writing.get(idempotency_key)
                else:
                    pending = None
                if pending is None:
                    wid = uuid.uuid4().hex
                    w = api.Workload(id=wid, state=api.WORKLOAD_STATE_PENDING, created_unix_s=now_s,
                                     updated_unix_s=now_s, idempotency_key=idempotency_key,
                                     message="accepted; waiting for routing")
                    w.spec.CopyFrom(spec)
                    entry = Entry(w, requests, spec_bytes)
                    if self._bus is None:
                        self._add(entry)
                        return self._copy(w), True
                    if self._open is None:
                        self._open = _Batch()
                    batch = self._open
                    batch.records[wid] = entry
                    if idempotency_key:
                        self._writing[idempotency_key] = batch
                    break
            # The same key's first record is being written: its outcome decides (the same workload, a
            # conflict, or, if that write failed, a fresh try).
            pending.done.wait()
        self._commit(batch)
        if batch.error is not None:
            # Every submission of the batch raises; each gets its own copy (one instance raised in many
            # threads at once would share, and garble, one traceback).
            raise copy.copy(batch.error) from batch.error
        return self._copy(w), True

    def _add(self, entry: Entry) -> None:
        """Make a (written) record visible; the caller holds ``_lock``."""
        w = entry.workload
        self._entries[w.id] = entry
        self._order.append(w.id)
        if w.idempotency_key:
            self._by_key[w.idempotency_key] = w.id

    def _commit(self, batch: _Batch) -> None:
        """Write ``batch`` unless a writer before us already did (it takes every record open at the time)."""
        with self._commit_lock:
            if batch.done.is_set():
                return
            with self._lock:
                taken, self._open = self._open, None
            assert taken is not None  # ``batch`` is not done, so it is still the open one
            try:
                # Raises BusUnavailableError before anything is kept: the callers answer UNAVAILABLE.
                self._write({wid: e.workload.SerializeToString() for wid, e in taken.records.items()})
            except Exception as exc:
                taken.error = exc
            with self._lock:
                for e in taken.records.values():
                    key = e.workload.idempotency_key
                    if key and self._writing.get(key) is taken:
                        del self._writing[key]
                    if taken.error is None:
                        self._add(e)
            taken.done.set()

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
            if self._bus is not None:
                self._dirty.add(wid)
            self._changed.notify_all()
            return self._copy(w) if copy else w

    def flush(self) -> int:
        """Write every changed record in one round trip; returns how many. On a bus error they stay dirty."""
        if self._bus is None:
            return 0
        with self._flush_lock:
            with self._lock:
                if not self._dirty:
                    return 0
                items = {wid: self._entries[wid].workload.SerializeToString() for wid in self._dirty}
                self._dirty.clear()
            try:
                self._write(items)
            except Exception:
                with self._lock:
                    self._dirty.update(items)
                raise
            return len(items)

    def _by_bucket(self, ids: Sequence[str] | Mapping[str, bytes]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for wid in ids:
            out.setdefault(bucket_key(wid, self.buckets), []).append(wid)
        return out

    def _write(self, records: Mapping[str, bytes]) -> None:
        """Write records to their buckets (one round trip per bucket touched); the first failure raises, and
        the caller treats the whole write as failed (a bucket already written is rewritten on retry)."""
        writer = self._writer
        assert writer is not None
        for key, ids in self._by_bucket(records).items():
            writer.hash_set(key, {wid: records[wid] for wid in ids}, replicas=self.replicas)

    def restore(self) -> list[api.Workload]:
        """Load the records a previous run kept (submission order). A record that cannot be read is logged
        and skipped, never fatal."""
        if self._bus is None:
            return []
        loaded: list[tuple[api.Workload, ParsedRequests]] = []
        for index in range(self.buckets):
            key = workload_bucket(index)
            for wid, raw in self._bus.hash_items(key):
                try:
                    w = api.Workload.FromString(raw)
                    if w.id != wid:
                        raise ValueError(f"record holds workload {w.id!r}")
                    loaded.append((w, parse_requests(w.spec.requests)))
                except Exception as exc:
                    log.error("workload record %s in %s is unreadable (%s); skipped", wid, key, exc)
        loaded.sort(key=lambda item: (item[0].created_unix_s, item[0].id))
        # One record per idempotency key: the newest is the submission that was answered; an older one is a
        # write whose acknowledgement failed (e.g. too few replicas), left on the primary. Never route both.
        newest = {w.idempotency_key: w.id for w, _ in loaded if w.idempotency_key}
        superseded = [w.id for w, _ in loaded if w.idempotency_key and newest[w.idempotency_key] != w.id]
        if superseded:
            log.warning("%d workload record(s) superseded by a later submission with the same idempotency key "
                        "(an unacknowledged write); not restored: %s", len(superseded), ", ".join(superseded[:10]))
            skip = set(superseded)
            loaded = [item for item in loaded if item[0].id not in skip]
        with self._lock:
            for w, requests in loaded:
                if w.id in self._entries:
                    continue
                self._add(Entry(w, requests, w.spec.SerializeToString(deterministic=True)))
        return [self._copy(w) for w, _ in loaded]

    def purge(self, older_than_unix_s: float) -> int:
        """Forget terminal workloads (failed, cancelled) last changed before the cutoff, here and in Redis;
        their idempotency keys become free again. Returns how many."""
        with self._lock:
            gone = [wid for wid, e in self._entries.items()
                    if e.workload.state in TERMINAL and e.workload.updated_unix_s < older_than_unix_s]
            if not gone:
                return 0
            if self._bus is not None:
                assert self._writer is not None
                for key, ids in self._by_bucket(gone).items():
                    self._writer.hash_delete(key, ids, replicas=self.replicas)
            dropped = set(gone)
            for wid in gone:
                e = self._entries.pop(wid)
                self._dirty.discard(wid)
                if e.workload.idempotency_key and self._by_key.get(e.workload.idempotency_key) == wid:
                    del self._by_key[e.workload.idempotency_key]
            self._order = [wid for wid in self._order if wid not in dropped]
            return len(gone)

    def excluded(self, wid: str) -> set[str]:
        with self._lock:
            entry = self._entries.get(wid)
            return set(entry.excluded_clusters) if entry else set()

    def list(self, *, tenant: str = "", state: int = 0, cluster: str = "", offset: int = 0,
             limit: int = 100, max_bytes: int | None = None) -> tuple[list[api.Workload], int | None]:
        """A page in submission order and the offset of the next page (None at the end). With ``max_bytes``
        the page also ends before the workloads' size in a response would pass it (at least one is kept)."""
        out: list[api.Workload] = []
        used_bytes = 0
        with self._lock:
            i = offset
            while i < len(self._order) and len(out) < limit:
                w = self._entries[self._order[i]].workload
                if (tenant and w.spec.tenant != tenant) or (state and w.state != state) or \
                        (cluster and w.cluster != cluster):
                    i += 1
                    continue
                if max_bytes is not None:
                    size = w.ByteSize()
                    size += 1 + _varint_bytes(size)  # its tag and length in the repeated field
                    if out and used_bytes + size > max_bytes:
                        break
                    used_bytes += size
                out.append(self._copy(w))
                i += 1
            return out, (i if i < len(self._order) else None)

    def on_cluster(self, cluster: str) -> list[str]:
        with self._lock:
            return [wid for wid, e in self._entries.items()
                    if e.workload.cluster == cluster and e.workload.state in ACTIVE_ON_CLUSTER]

    def dispatched(self) -> list[tuple[str, str, int]]:
        """(workload id, cluster, attempt) of every workload routed to a cluster that has sent no news of it."""
        with self._lock:
            return [(wid, e.workload.cluster, e.workload.attempt) for wid, e in self._entries.items()
                    if e.workload.state == api.WORKLOAD_STATE_DISPATCHED]

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
