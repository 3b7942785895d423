"""Leader election on a ``coordination.k8s.io`` Lease, as client-go's ``leaderelection`` with ``LeaseLock``.

Replicas of the regional scheduler all run their informers (a warm standby) but only the holder of
the Lease schedules. The holder renews the Lease every ``retry_period_s``; if it cannot renew within
``renew_deadline_s`` it stops leading, and the process exits (as kube-scheduler does) so that it never
binds without the Lease. A standby takes the Lease once its record has not changed for
``lease_duration_s`` *by the standby's own clock* (client-go's rule: it compares what it observed, never
the holder's timestamps, so clock skew between machines does not matter). Updates carry the Lease's
``resourceVersion``, so two candidates cannot both win (the loser gets 409 Conflict).

The official Python client has an elector too, but it cannot be stopped and never releases the Lease;
a clean shutdown here gives the Lease up (holder emptied), so a standby takes over at once instead of
after a lease duration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(self, api: client.ApiClient, *, namespace: str, name: str, identity: str,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0, retry_period_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not lease_duration_s > renew_deadline_s > retry_period_s > 0:
            raise ValueError("need lease_duration_s > renew_deadline_s > retry_period_s > 0 "
                             f"(got {lease_duration_s}, {renew_deadline_s}, {retry_period_s})")
        self.coordination = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.clock = clock
        self.leading = threading.Event()
        self.lost = threading.Event()
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0

    def _spec(self, lease: Any | None, *, release: bool = False) -> dict[str, Any]:
        now = _now_micro()
        spec = lease.spec if lease is not None else None
        holder = spec.holder_identity if spec is not None else None
        transitions = (spec.lease_transitions or 0) if spec is not None else 0
        taking = holder != self.identity
        return {
            "holderIdentity": "" if release else self.identity,
            "leaseDurationSeconds": 1 if release else max(1, round(self.lease_duration_s)),
            "acquireTime": now if taking or spec is None or spec.acquire_time is None else
            spec.acquire_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "renewTime": now,
            "leaseTransitions": transitions + (1 if taking and holder else 0),
        }

    def try_acquire_or_renew(self) -> bool:
        now = self.clock()
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(None)}
            try:
                self.coordination.create_namespaced_lease(self.namespace, body)
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            return True
        spec = lease.spec
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = spec.holder_identity or ""
        duration = spec.lease_duration_seconds or self.lease_duration_s
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False  # held by someone alive
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": lease.metadata.resource_version},
                "spec": self._spec(lease)}
        try:
            self.coordination.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def run(self, stop: threading.Event) -> None:
        """Acquire, then renew until ``stop`` (release) or until renewing fails for ``renew_deadline_s``
        (``lost`` is set)."""
        while not stop.is_set() and not self.leading.is_set():
            try:
                if self.try_acquire_or_renew():
                    self._last_renew = self.clock()
                    log.info("leader election: %s holds lease %s/%s", self.identity, self.namespace, self.name)
                    self.leading.set()
                    break
            except Exception as exc:
                log.warning("leader election: cannot read lease %s/%s: %s", self.namespace, self.name, exc)
            stop.wait(self.retry_period_s)
        while not stop.is_set():
            stop.wait(self.retry_period_s)
            if stop.is_set():
                break
            try:
                if self.try_acquire_or_renew():
                    self._last_renew = self.clock()
                    continue
                log.error("leader election: lease %s/%s was taken by another holder", self.namespace, self.name)
            except Exception as exc:
                log.warning("leader election: renewing failed: %s", exc)
                if self.clock() - self._last_renew < self.renew_deadline_s:
                    continue
            self.leading.clear()
            self.lost.set()
            return
        if self.leading.is_set():
            self.release()

    def release(self) -> None:
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity != self.identity:
                return
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "resourceVersion": lease.metadata.resource_version},
                    "spec": self._spec(lease, release=True)}
            self.coordination.replace_namespaced_lease(self.name, self.namespace, body)
            log.info("leader election: released lease %s/%s", self.namespace, self.name)
        except Exception as exc:
            log.warning("leader election: could not release the lease: %s", exc)
        finally:
            self.leading.clear()
