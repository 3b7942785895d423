"""Pending pods waiting for a decision, as kube-scheduler's ``PriorityQueue``: active, backoff, unschedulable.

* **active**: ready to be tried, highest priority first, then oldest first.
* **backoff**: tried and failed for a transient reason (a binding error), or moved out of
  unschedulable by a cluster change before its back-off ran out; it becomes active once the back-off
  (``initial × 2^(attempts-1)``, at most ``maximum``) has passed since its last attempt.
* **unschedulable**: no node could hold it. It stays there until something that could make it fit
  happens (a node added or changed, a pod deleted: :meth:`cluster_changed`), or until
  ``flush_after_s`` has passed, so an unschedulable pod costs nothing while the cluster is quiet
  instead of being retried in a busy loop.
* **parked**: a pod Meridian refuses (a feature it does not implement); only an update of the pod
  itself brings it back.

An update of a queued pod that only touches its status (the scheduler's own ``PodScheduled``
condition, for one) does not move it: otherwise every failure would wake its own pod at once.

A pod in flight was decided on the view it was popped with. A cluster change, or an update of the
pod's own spec, that arrives before its verdict would be lost if the verdict then put it in
unschedulable (or parked): such a pod goes to backoff instead, as kube-scheduler's
``moveRequestCycle`` does.
"""

from __future__ import annotations

import heapq
import itertools
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


def spec_fingerprint(obj: Mapping[str, Any]) -> str:
    """What a pod's scheduling depends on: spec, labels and annotations, not status or bookkeeping."""
    meta = obj.get("metadata") or {}
    return json.dumps([obj.get("spec"), meta.get("labels"), meta.get("annotations")], sort_keys=True, default=str)


@dataclass
class QueuedPod:
    key: str
    obj: dict[str, Any]
    fingerprint: str
    priority: int = 0
    attempts: int = 0
    last_attempt_s: float = 0.0
    added_s: float = 0.0
    where: str = "active"  # active | backoff | unschedulable | parked | in-flight
    unschedulable_since_s: float = 0.0
    seq: int = field(default=0)
    # While in flight: the queue's count of cluster changes when it was popped, and whether its spec
    # changed since (either makes an unschedulable or parked verdict out of date).
    cluster_changes_at_pop: int = 0
    updated_in_flight: bool = False


class SchedulingQueue:
    def __init__(self, *, initial_backoff_s: float = 1.0, max_backoff_s: float = 10.0,
                 flush_after_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.flush_after_s = flush_after_s
        self.clock = clock
        self._cond = threading.Condition()
        self._pods: dict[str, QueuedPod] = {}
        # Heaps; an entry whose ``seq`` or ``where`` moved on since it was pushed is skipped when popped.
        self._active: list[tuple[int, float, int, str]] = []  # (-priority, added, seq, key)
        self._backoff: list[tuple[float, int, str]] = []  # (due, seq, key)
        self._flush: list[tuple[float, int, str]] = []  # (unschedulable since + flush_after, seq, key)
        self._seq = itertools.count()
        self._cluster_changes = 0
        self._closed = False

    # ------------------------------------------------------------------ producers (informer)
    def add(self, key: str, obj: dict[str, Any]) -> None:
        """A pending pod was added or updated."""
        fingerprint = spec_fingerprint(obj)
        priority = int((obj.get("spec") or {}).get("priority") or 0)
        with self._cond:
            entry = self._pods.get(key)
            if entry is None:
                entry = QueuedPod(key, obj, fingerprint, priority, added_s=self.clock())
                self._pods[key] = entry
                self._push(entry)
                return
            changed = entry.fingerprint != fingerprint
            entry.obj, entry.fingerprint, entry.priority = obj, fingerprint, priority
            if changed and entry.where in ("unschedulable", "parked"):
                self._to_backoff(entry)
            elif changed and entry.where == "in-flight":
                entry.updated_in_flight = True

    def delete(self, key: str) -> None:
        with self._cond:
            self._pods.pop(key, None)

    def cluster_changed(self) -> None:
        """A node was added or changed, or a pod freed resources: unschedulable pods may fit now."""
        with self._cond:
            self._cluster_changes += 1
            for _, seq, key in self._flush:
                entry = self._pods.get(key)
                if entry is not None and entry.where == "unschedulable" and entry.seq == seq:
                    self._to_backoff(entry)
            self._flush = []

    # ------------------------------------------------------------------ consumer (scheduling cycle)
    def _backoff_s(self, entry: QueuedPod) -> float:
        return min(self.initial_backoff_s * 2 ** max(entry.attempts - 1, 0), self.max_backoff_s)

    def _to_backoff(self, entry: QueuedPod) -> None:
        entry.where = "backoff"
        entry.seq = next(self._seq)
        heapq.heappush(self._backoff, (entry.last_attempt_s + self._backoff_s(entry), entry.seq, entry.key))
        self._cond.notify()

    def _push(self, entry: QueuedPod) -> None:
        entry.where = "active"
        entry.seq = next(self._seq)
        heapq.heappush(self._active, (-entry.priority, entry.added_s, entry.seq, entry.key))
        self._cond.notify()

    def _promote(self, now: float) -> float | None:
        """Move due backoff (and long-unschedulable) pods to active; the time until the next is due."""
        while self._flush and self._flush[0][0] <= now:
            _, seq, key = heapq.heappop(self._flush)
            entry = self._pods.get(key)
            if entry is not None and entry.where == "unschedulable" and entry.seq == seq:
                self._to_backoff(entry)
        while self._backoff and self._backoff[0][0] <= now:
            _, seq, key = heapq.heappop(self._backoff)
            entry = self._pods.get(key)
            if entry is not None and entry.where == "backoff" and entry.seq == seq:
                self._push(entry)
        dues = [h[0][0] for h in (self._backoff, self._flush) if h]
        return min(dues) if dues else None

    def pop(self, timeout_s: float = 1.0) -> QueuedPod | None:
        """The next pod to try (now in flight), or None after ``timeout_s`` or once closed."""
        deadline = self.clock() + timeout_s
        with self._cond:
            while not self._closed:
                now = self.clock()
                next_due = self._promote(now)
                while self._active:
                    _, _, seq, key = heapq.heappop(self._active)
                    entry = self._pods.get(key)
                    if entry is not None and entry.where == "active" and entry.seq == seq:
                        entry.where = "in-flight"
                        entry.attempts += 1
                        entry.last_attempt_s = now
                        entry.cluster_changes_at_pop = self._cluster_changes
                        entry.updated_in_flight = False
                        return entry
                remaining = deadline - now
                if remaining <= 0:
                    return None
                wait = remaining if next_due is None else max(0.0, min(remaining, next_due - now))
                self._cond.wait(wait if wait > 0 else 0.001)
        return None

    def done(self, entry: QueuedPod) -> None:
        """The pod was bound (or assumed and handed to a binder): it leaves the queue."""
        with self._cond:
            if self._pods.get(entry.key) is entry:
                del self._pods[entry.key]

    def unschedulable(self, entry: QueuedPod) -> None:
        """No node could hold the pod; it waits for a cluster change (or for its own update)."""
        with self._cond:
            if self._pods.get(entry.key) is not entry:
                return
            if entry.updated_in_flight or entry.cluster_changes_at_pop != self._cluster_changes:
                self._to_backoff(entry)  # something it may now fit with arrived while it was decided
            else:
                entry.where = "unschedulable"
                entry.unschedulable_since_s = self.clock()
                entry.seq = next(self._seq)
                heapq.heappush(self._flush, (entry.unschedulable_since_s + self.flush_after_s, entry.seq, entry.key))

    def park(self, entry: QueuedPod) -> None:
        """Meridian refuses the pod; it waits for an update of its own spec."""
        with self._cond:
            if self._pods.get(entry.key) is not entry:
                return
            if entry.updated_in_flight:
                self._to_backoff(entry)  # edited while its old spec was being refused
            else:
                entry.where = "parked"

    def retry(self, key: str, obj: dict[str, Any] | None = None) -> None:
        """A transient failure (a binding error): try again after the back-off."""
        with self._cond:
            entry = self._pods.get(key)
            if entry is None:
                if obj is None:
                    return
                entry = QueuedPod(key, obj, spec_fingerprint(obj), int((obj.get("spec") or {}).get("priority") or 0),
                                  attempts=1, last_attempt_s=self.clock(), added_s=self.clock())
                self._pods[key] = entry
            self._to_backoff(entry)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def counts(self) -> dict[str, int]:
        out = {"active": 0, "backoff": 0, "unschedulable": 0, "parked": 0, "in-flight": 0}
        with self._cond:
            for entry in self._pods.values():
                out[entry.where] += 1
        return out

    def __len__(self) -> int:
        with self._cond:
            return len(self._pods)
