"""The global scheduler's engine: routes accepted workloads and follows them to Running or Failed.

Workers (threads, one per stream or duty, each stopping when ``stop`` is set and cleaning up after
itself):

* **router**: takes queued workloads in batches, routes each through the staged
  :class:`~global_scheduler.routing.base.Router` over one registry snapshot per batch (reserving
  what it assigns so a batch spreads as it would one by one; ``routing_pass.decide_pass``, in a
  child process with ``routing.worker_process``), records the new attempt *before*
  publishing (so the cluster's first event always matches), then publishes one pipelined batch of
  ``DispatchMessage`` per cluster. If the attempts cannot be made durable they are rolled back and the
  workloads requeued (nothing was published). If the publish fails, the attempt stands (it is
  durable, and the publish may have landed all the same: a reply lost to a timeout) and the same
  messages are published again to the same cluster, with back-off, until they go through, so an
  attempt never reaches two clusters. Every few seconds it freezes the garbage
  collector's view of live objects (``gc.freeze``): full collections over a growing store were the
  API's latency tail.
* **summaries**: applies ``ClusterSummary`` entries from ``meridian:summary`` to the registry.
* **events**: applies ``PlacementEvent`` entries from every ``meridian:{cluster}:events``; an event of
  an old attempt is ignored. ``FAILED`` excludes that cluster for the workload and reroutes it.
* **sweeper**: marks silent clusters down and reroutes their workloads (failover); a release is sent
  to the silent cluster so that, should it come back, it frees what it held. When a cluster comes
  back, deferrable workloads that have not started on a dirtier cluster move back (failback).
* **reconciler**: on start (once the summary backlog is read) and every ``reconcile.interval_s``,
  compares the ``DISPATCHED`` workloads with what their clusters' summaries say they hold, and
  publishes a lost dispatch again (same attempt) or reroutes off a cluster that is down or unknown
  (:mod:`global_scheduler.reconcile`): a crash between the durable write and the publish, or a lost
  event, would otherwise leave a workload ``DISPATCHED`` for ever.

Hazards: a publish that fails may have landed in part or in whole; publishing the same attempt again
is harmless because the regional worker applies a ``(workload, attempt)`` once. Malformed entries go
to the stream's dead-letter stream and never stop a worker.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from global_scheduler.reconcile import REPUBLISH, decide
from global_scheduler.registry import ClusterRegistry, Fit, HoldingsView
from global_scheduler.routing.base import DEFER, NO_CLUSTER, Router, RoutingPolicy
from global_scheduler.routing.registry import get_policy
from global_scheduler.routing_pass import (
    PassDecision,
    PassItem,
    PassResult,
    RoutingWorker,
    RoutingWorkerRestingError,
    decide_pass,
)
from global_scheduler.settings import GlobalSchedulerSettings
from global_scheduler.store import ACTIVE_ON_CLUSTER, TERMINAL, Entry, WorkloadStore
from meridian import observability as obs
from meridian.bus import (
    MOVES_STREAM,
    SUMMARY_STREAM,
    BusError,
    BusUnavailableError,
    StreamBus,
    dispatch_stream,
    events_stream,
)
from meridian.bus.consumer import backoff_delay
from meridian.bus.health import GroupGauges
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures
from protos import dispatch_pb2 as dpb
from protos import global_api_pb2 as api
from protos import telemetry_pb2 as tpb

log = logging.getLogger(__name__)

EVENTS_GROUP = "global-scheduler"
CLASS_WEIGHTS = {  # perf, cost, energy, fairness (the simulator's class defaults)
    "latency-sensitive": (0.7, 0.05, 0.15, 0.1),
    "batch": (0.1, 0.1, 0.7, 0.1),
}
DEFAULT_EXPECTED_DURATION_H = 4.0
# The attempt a release names for a workload the scheduler does not know: every attempt there goes.
STALE_ATTEMPT_ALL = 2**62


def workload_class(spec: api.WorkloadSpec) -> str:
    return spec.workload_class or ("batch" if spec.deferrable else "latency-sensitive")


def workload_kind(spec: api.WorkloadSpec) -> int:
    """What a member cluster creates: a Job for batch work (it ends), a Deployment for a service."""
    return dpb.WORKLOAD_KIND_BATCH if workload_class(spec) == "batch" else dpb.WORKLOAD_KIND_SERVICE


class GlobalScheduler:
    def __init__(self, *, settings: GlobalSchedulerSettings, bus: StreamBus, policy: RoutingPolicy | None = None,
                 instance: str | None = None, clock: Callable[[], float] = time.time,
                 fence: object | None = None) -> None:
        """``fence``: high availability (global_scheduler/leadership.py): the store's writes go through it and are
        refused once this replica is no longer the leader."""
        self.settings = settings
        self.bus = bus
        self.clock = clock
        self.instance = instance or f"global-{uuid.uuid4().hex[:8]}"
        self.store = WorkloadStore(bus if settings.store.persist else None, fence=fence,  # type: ignore[arg-type]
                                   buckets=settings.store.buckets, replicas=settings.store.wait_replicas)
        self.registry = ClusterRegistry.from_settings(settings.registry)  # reads registry.config_file
        kwargs = {"checkpoint": settings.routing.checkpoint} if settings.routing.policy == "gnn" else {}
        self.worker: RoutingWorker | None = None
        if settings.routing.worker_process:
            if policy is not None:
                raise ValueError("routing.worker_process builds its policy from routing.policy in the child; "
                                 "pass no policy object")
            self.worker = RoutingWorker(settings.routing.policy, kwargs, timeout_s=settings.routing.worker_timeout_s,
                                        nice=settings.routing.worker_nice)
        if policy is None:
            policy = get_policy(settings.routing.policy, **kwargs)
        self.router = Router(policy)
        self.policy_name = policy.name
        self._latency = obs.DECISION_LATENCY.labels(component="global", policy=self.policy_name)
        self._dispatch_lag = obs.DISPATCH_LAG.labels(policy=self.policy_name)
        self._fallbacks_seen: dict[int, int] = {}  # per process that routed (see routing_pass.PassResult)
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._deferred: dict[str, float] = {}
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.dispatched_total = 0
        # cluster → {workload id: utilisation at which its latency SLO breaks}, for the routing features.
        self._slo_crit: dict[str, dict[str, float]] = {}
        self._slo_lock = threading.Lock()
        self.decision_seconds: deque[float] = deque(maxlen=100_000)
        # Accepted → dispatch published, per dispatch (a reroute counts again, from the first acceptance).
        self.dispatch_lag_seconds: deque[float] = deque(maxlen=100_000)
        self.routed_by: Counter[int] = Counter()  # workloads decided, per process id (the routing worker's or ours)
        self._started_s = self.clock()
        # workload → (attempt, unix s) of its last place published by this instance (reconciliation's clock).
        self._dispatch_sent: dict[str, tuple[int, float]] = {}
        self._dispatch_sent_lock = threading.Lock()
        self._summaries_read = threading.Event()  # the summary backlog has been applied once
        # (cluster, workload) → when reconciliation last released a stale copy there (unix s).
        self._stale_released: dict[tuple[str, str], float] = {}
        # cluster → places whose publish failed, published again by the router (its thread only).
        self._unsent: dict[str, list[tuple[str, int, bytes]]] = {}
        self._unsent_failures = 0
        self._unsent_retry_s = 0.0  # monotonic

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._started_s = self.clock()
        self.bus.ensure_group(SUMMARY_STREAM, self.instance, start_id="0")
        if self.worker is not None:
            try:
                log.info("routing worker process %d is up", self.worker.start())
            except Exception as exc:  # routing still works, in this process
                log.error("routing worker did not start (%s: %s); routing in the API's process until it does",
                          type(exc).__name__, exc)
        self.resume()
        if self.settings.routing.gc_freeze_interval_s:
            # Start-up (torch, the model, the restored store) leaves millions of objects; without this the first
            # full collections, 0.2-0.4 s each, land on the first seconds of traffic.
            gc.collect()
            gc.freeze()
        for name, target in (("router", self._router_loop), ("summaries", self._summary_loop),
                             ("events", self._events_loop), ("sweeper", self._sweep_loop),
                             ("reconciler", self._reconcile_loop)):
            t = threading.Thread(target=self._guard(name, target), name=f"{self.instance}-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def resume(self) -> int:
        """Load what a previous run accepted and requeue its pending workloads (deferred ones wait for their
        hour). Workloads already on a cluster continue from the events that cluster sends; a dispatched one
        that its cluster never received is found by reconciliation."""
        restored = self.store.restore()
        pending = 0
        for w in restored:
            if w.state != api.WORKLOAD_STATE_PENDING:
                continue
            pending += 1
            if w.not_before_unix_s > self.clock():
                self._hold(w.id, w.not_before_unix_s)
            else:
                self.enqueue(w.id)
        if restored:
            log.info("restored %d workloads (%d pending) from the store", len(restored), pending)
        return len(restored)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=timeout_s)
        self._threads.clear()
        if self.worker is not None:
            self.worker.close()

    def _guard(self, name: str, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            failures = 0
            while not self._stop.is_set():
                try:
                    loop()
                    return
                except (BusUnavailableError, BusError) as exc:
                    delay = backoff_delay(self.settings.bus.backoff_s, failures)
                    failures += 1
                    log.warning("%s: bus unavailable (%s); retrying in %.1f s", name, exc, delay)
                    self._stop.wait(delay)
                except Exception:
                    log.exception("%s worker crashed; restarting", name)
                    self._stop.wait(1.0)
        return run

    # ------------------------------------------------------------------ API-facing operations
    def enqueue(self, wid: str) -> None:
        with self._cv:
            if wid in self._queued:
                return
            self._queued.add(wid)
            self._deferred.pop(wid, None)
            self._queue.append(wid)
            self._cv.notify()

    def cancel(self, wid: str) -> api.Workload | None:
        w = self.store.get(wid)
        if w is None or w.state in TERMINAL:
            return w
        if w.state in ACTIVE_ON_CLUSTER and w.cluster:
            self._publish_release(w.cluster, wid, w.attempt, "cancelled by the operator")
        with self._cv:
            self._deferred.pop(wid, None)
        self._forget_slo(wid)
        return self.store.update(wid, state=api.WORKLOAD_STATE_CANCELLED, message="cancelled by the operator")

    def queue_depth(self) -> int:
        with self._cv:
            return len(self._queue) + len(self._deferred)

    # ------------------------------------------------------------------ router
    def _workload_features(self, w: api.Workload, requests, regions: Sequence[str], now_s: float) -> WorkloadFeatures:
        spec = w.spec
        allowed = None
        if spec.allowed_regions:
            allowed_set = set(spec.allowed_regions)
            allowed = np.array([r in allowed_set for r in regions], dtype=bool)
        origin = regions.index(spec.origin_region) if spec.origin_region in regions else -1
        wts = (spec.weights.performance, spec.weights.cost, spec.weights.energy, spec.weights.fairness)
        if not any(wts):
            wts = CLASS_WEIGHTS[workload_class(spec)]
        return WorkloadFeatures(
            replicas=spec.replicas, milli_cpu=float(requests.milli_cpu), memory_bytes=float(requests.memory_bytes),
            gpu=requests.gpu_fraction, origin_region=origin,
            latency_slo_ms=spec.latency_slo_ms if origin >= 0 else 0.0, allowed_regions=allowed,
            deferrable=spec.deferrable, deadline_hours=max(0.0, (spec.deadline_unix_s - now_s) / 3600.0)
            if spec.deferrable else 0.0, weights=wts, expected_duration_h=DEFAULT_EXPECTED_DURATION_H)

    def _take_batch(self) -> list[str]:
        now = self.clock()
        with self._cv:
            due = [wid for wid, nb in self._deferred.items() if nb <= now]
            for wid in due:
                del self._deferred[wid]
                if wid not in self._queued:
                    self._queued.add(wid)
                    self._queue.append(wid)
            if not self._queue:
                self._cv.wait(timeout=0.1)
            batch = []
            while self._queue and len(batch) < self.settings.routing.batch_max:
                wid = self._queue.popleft()
                self._queued.discard(wid)
                batch.append(wid)
            return batch

    def _hold(self, wid: str, until_s: float) -> None:
        with self._cv:
            self._deferred[wid] = until_s

    def _router_loop(self) -> None:
        freeze_every = self.settings.routing.gc_freeze_interval_s
        next_freeze = time.monotonic() + freeze_every
        while not self._stop.is_set():
            if self._unsent and time.monotonic() >= self._unsent_retry_s:
                self.publish_unsent()
            batch = self._take_batch()
            if batch:
                self.route_batch(batch)
            if freeze_every and time.monotonic() >= next_freeze:
                # Hazard: reference cycles that became garbage before a freeze are never collected; the
                # engine keeps workloads for its lifetime anyway and creates no cycles on the hot path.
                gc.freeze()
                next_freeze = time.monotonic() + freeze_every

    def _forget_slo(self, wid: str) -> None:
        with self._slo_lock:
            for crits in self._slo_crit.values():
                crits.pop(wid, None)

    def _slo_ceiling(self, names: Sequence[str]) -> np.ndarray:
        with self._slo_lock:
            return np.array([min(self._slo_crit.get(n, {}).values(), default=1.0) for n in names])

    def _run_pass(self, names: list[str], feats: ClusterFeatures, items: list[PassItem]) -> PassResult:
        if self.worker is not None and items:
            try:
                return self.worker.run(names, feats, items)
            except RoutingWorkerRestingError:
                pass
            except Exception as exc:
                log.warning("routing worker failed (%s: %s); this pass is routed in the API's process and the "
                            "next one starts a new worker", type(exc).__name__, exc)
                obs.POLICY_FALLBACKS.labels(component="global", policy=self.policy_name,
                                            reason="routing worker failed").inc()
        return decide_pass(self.router, names, feats, items)

    def route_batch(self, batch: list[str]) -> None:
        """Route one batch in stages: gather its pending workloads, decide them in one pass, apply each
        decision (dispatch, defer or no cluster), then make the attempts durable and publish them."""
        now = self.clock()
        names, regions, feats = self.registry.features(now)
        feats.tightest_slo_utilisation = self._slo_ceiling(names)
        if not names:
            self._wait_for_clusters(batch, now)
            return
        todo = self._pass_items(batch, regions, now)
        result = self._run_pass(names, feats, [item for _, _, item in todo])
        self.routed_by[result.pid] += len(result.decisions)
        outgoing: dict[str, list[tuple[str, int, bytes]]] = {}
        for (wid, entry, item), decision in zip(todo, result.decisions, strict=True):
            self.decision_seconds.append(decision.seconds)
            self._latency.observe(decision.seconds)
            if decision.cluster >= 0:
                cluster = names[decision.cluster]
                region = regions[feats.region_index[decision.cluster]]
                place = self._dispatch(wid, entry, item, decision, cluster, region, now)
                if place is not None:
                    outgoing.setdefault(cluster, []).append(place)
            elif decision.cluster == DEFER:
                self._defer(wid, entry, now)
            else:
                assert decision.cluster == NO_CLUSTER
                self._no_cluster(wid, entry, decision, now)
        self._count_fallbacks(result)
        self._make_durable_and_publish(outgoing)

    def _wait_for_clusters(self, batch: list[str], now: float) -> None:
        """No cluster has reported: every workload of the batch waits a second."""
        for wid in batch:
            self.store.update(wid, message="waiting: no cluster has reported yet")
            self._hold(wid, now + 1.0)

    def _pass_items(self, batch: list[str], regions: Sequence[str], now: float) -> list[tuple[str, Entry, PassItem]]:
        """The batch's workloads still pending, each with what the pass needs of it."""
        todo = []
        for wid in batch:
            entry = self.store.entry(wid)
            if entry is None or entry.workload.state != api.WORKLOAD_STATE_PENDING:
                continue
            r = entry.requests
            n = entry.workload.spec.replicas
            need = (float(n * r.milli_cpu), float(n * r.memory_bytes), n * r.gpu_fraction)
            todo.append((wid, entry, PassItem(self._workload_features(entry.workload, r, regions, now),
                                              frozenset(entry.excluded_clusters), need)))
        return todo

    def _dispatch(self, wid: str, entry: Entry, item: PassItem, decision: PassDecision, cluster: str, region: str,
                  now: float) -> tuple[str, int, bytes] | None:
        """Reserve the workload's room on ``cluster`` and record the new attempt in the store (not yet
        durable); the place to publish, or None when the workload changed meanwhile."""
        w = entry.workload
        attempt = w.attempt + 1
        self.registry.reserve(cluster, *item.need)
        if decision.slo_crit is not None:
            with self._slo_lock:
                self._slo_crit.setdefault(cluster, {})[wid] = decision.slo_crit
        self._note_dispatch(wid, attempt, now)  # before the store says DISPATCHED: reconciliation reads both
        updated = self.store.update(wid, expect_attempt=w.attempt, copy=False,
                                    state=api.WORKLOAD_STATE_DISPATCHED,
                                    cluster=cluster, region=region, attempt=attempt,
                                    message=f"dispatched to {cluster} (attempt {attempt})")
        if updated is None:
            return None
        return wid, attempt, self._place_payload(cluster, entry, attempt, now)

    def _defer(self, wid: str, entry: Entry, now: float) -> None:
        """Hold a deferrable workload for a cleaner hour, never past its deadline."""
        until = min(now + self.settings.routing.defer_recheck_s, entry.workload.spec.deadline_unix_s)
        self.store.update(wid, not_before_unix_s=until,
                          message=f"deferred for a cleaner hour; next look at {time.strftime('%H:%M:%S', time.gmtime(until))} UTC")
        self._hold(wid, until)

    def _no_cluster(self, wid: str, entry: Entry, decision: PassDecision, now: float) -> None:
        """No cluster takes the workload now: it fails if none ever can, else it waits and is routed again."""
        w = entry.workload
        # The rule SubmitWorkload applies too (registry.fit_outlook): FAILED only when no reporting
        # cluster can hold it and no region it allows may still gain one that could.
        outlook = self.registry.fit_outlook(replicas=w.spec.replicas, milli_cpu=entry.requests.milli_cpu,
                                            memory_bytes=entry.requests.memory_bytes,
                                            gpu=entry.requests.gpu_fraction,
                                            allowed_regions=set(w.spec.allowed_regions) or None)
        reason = max(decision.diagnosis, key=decision.diagnosis.get) if decision.diagnosis else "no cluster"
        obs.PLACEMENT_FAILURES.labels(component="global", cluster="", reason=reason).inc()
        if outlook.fit is Fit.NEVER:
            self.store.update(wid, state=api.WORKLOAD_STATE_FAILED,
                              message=f"no allowed cluster can ever fit it: {outlook.reason} ({decision.explain})")
        else:
            why = decision.explain if outlook.fit is Fit.NOW else f"{outlook.reason} ({decision.explain})"
            self.store.update(wid, message="waiting: " + why)
            self._hold(wid, now + 2.0)

    def _count_fallbacks(self, result: PassResult) -> None:
        """Count the model failures of the deciding process since its last pass."""
        seen = self._fallbacks_seen.get(result.pid, 0)
        if result.fallbacks > seen:
            obs.POLICY_FALLBACKS.labels(component="global", policy=self.policy_name, reason="model unavailable").inc(
                result.fallbacks - seen)
            self._fallbacks_seen[result.pid] = result.fallbacks

    def _make_durable_and_publish(self, outgoing: dict[str, list[tuple[str, int, bytes]]]) -> None:
        """Make the batch's attempts durable, then publish them per cluster; if they cannot be made durable,
        roll them back and route them again (nothing was published)."""
        if outgoing:
            # The attempts are durable before any cluster hears of them (a restart never dispatches twice).
            try:
                self.store.flush()
            except (BusUnavailableError, BusError) as exc:
                for cluster, items in outgoing.items():
                    self._requeue(cluster, items, f"store unavailable ({exc})")
                return
        for cluster, items in outgoing.items():
            self._publish_places(cluster, items)

    def _publish_places(self, cluster: str, items: list[tuple[str, int, bytes]]) -> bool:
        """Publish (workload, attempt, place) to ``cluster``; if that fails, keep them to publish again."""
        try:
            self.bus.publish_many(dispatch_stream(cluster), [p for _, _, p in items],
                                  maxlen=self.settings.bus.dispatch_maxlen)
        except (BusUnavailableError, BusError) as exc:
            # Not rolled back: the attempt is durable, and the entries may be in the stream (a lost reply);
            # another cluster must never get the same attempt. The router publishes them here again.
            log.warning("dispatch of %d workloads to %s failed (%s); publishing them there again", len(items),
                        cluster, exc)
            self._unsent.setdefault(cluster, []).extend(items)
            self._unsent_retry_s = time.monotonic() + backoff_delay(self.settings.bus.backoff_s, self._unsent_failures)
            self._unsent_failures += 1
            return False
        self.dispatched_total += len(items)
        sent = self.clock()
        for wid, attempt, _ in items:
            self._note_dispatch(wid, attempt, sent)
            entry = self.store.entry(wid)
            if entry is not None:
                lag = sent - entry.workload.created_unix_s
                self.dispatch_lag_seconds.append(lag)
                self._dispatch_lag.observe(lag)
        obs.PLACEMENTS.labels(component="global", cluster=cluster, policy=self.policy_name).inc(len(items))
        return True

    def publish_unsent(self) -> None:
        """Publish again the places whose publish failed, those still DISPATCHED to that cluster at that attempt
        (a failover or a cancel since has moved them on)."""
        unsent, self._unsent = self._unsent, {}
        ok = True
        for cluster, items in unsent.items():
            current = [(wid, attempt, payload) for wid, attempt, payload in items
                       if (w := self.store.get(wid)) is not None and w.state == api.WORKLOAD_STATE_DISPATCHED
                       and w.attempt == attempt and w.cluster == cluster]
            if current:
                ok = self._publish_places(cluster, current) and ok
        if ok:
            self._unsent_failures = 0

    @staticmethod
    def _place_payload(cluster: str, entry: Entry, attempt: int, now_s: float) -> bytes:
        w, r = entry.workload, entry.requests
        return dpb.DispatchMessage(cluster=cluster, place=dpb.PlaceWorkload(
            workload_id=w.id, attempt=attempt, name=w.spec.name, tenant=w.spec.tenant, priority=w.spec.priority,
            replicas=w.spec.replicas, requests=dpb.ReplicaRequests(milli_cpu=r.milli_cpu, memory_bytes=r.memory_bytes,
                                                                   gpu=r.gpu, gpu_milli=r.gpu_milli),
            dispatched_at_s=now_s, kind=workload_kind(w.spec), image=w.spec.image)).SerializeToString()

    def _note_dispatch(self, wid: str, attempt: int, at_s: float) -> None:
        with self._dispatch_sent_lock:
            self._dispatch_sent[wid] = (attempt, at_s)

    def _requeue(self, cluster: str, items: list[tuple[str, int, bytes]], why: str) -> None:
        """Roll back attempts that were never published (nothing reached the cluster) and route them again."""
        log.warning("dispatch to %s failed (%s); requeueing %d workloads", cluster, why, len(items))
        for wid, attempt, _ in items:
            self.store.update(wid, expect_attempt=attempt, state=api.WORKLOAD_STATE_PENDING,
                              attempt=attempt - 1, message=f"dispatch to {cluster} failed; retrying")
            self._hold(wid, self.clock() + 1.0)

    def _publish_release(self, cluster: str, wid: str, attempt: int, reason: str) -> None:
        msg = dpb.DispatchMessage(cluster=cluster, release=dpb.ReleaseWorkload(workload_id=wid, attempt=attempt,
                                                                              reason=reason))
        try:
            self.bus.publish(dispatch_stream(cluster), msg.SerializeToString(), maxlen=self.settings.bus.dispatch_maxlen)
        except (BusUnavailableError, BusError) as exc:
            log.warning("release of %s on %s not sent: %s", wid, cluster, exc)

    def reroute(self, wid: str, *, reason: str, move: str, exclude: str | None = None,
                release_on: str | None = None) -> None:
        """Back to PENDING and into the queue (or FAILED after ``max_attempts``). ``move`` classes it for the
        metric and the ``meridian:moves`` record (failover, failback, rejected, reconciliation)."""
        w = self.store.get(wid)
        if w is None or w.state in TERMINAL:
            return
        self._forget_slo(wid)
        if w.cluster:
            self._record_move(wid, w.attempt, w.cluster, move, reason)
        if release_on:
            self._publish_release(release_on, wid, w.attempt, reason)
        if w.attempt >= self.settings.routing.max_attempts:
            self.store.update(wid, state=api.WORKLOAD_STATE_FAILED, message=f"{reason}; gave up after {w.attempt} attempts")
            return
        changes: dict[str, object] = {"state": api.WORKLOAD_STATE_PENDING, "message": f"{reason}; rerouting",
                                      "cluster": "", "nodes": []}
        if exclude:
            changes["exclude_cluster"] = exclude
        if self.store.update(wid, expect_attempt=w.attempt, **changes) is not None:
            self.enqueue(wid)

    def _record_move(self, wid: str, attempt: int, cluster: str, kind: str, reason: str) -> None:
        obs.WORKLOAD_MOVES.labels(kind=kind, cluster=cluster).inc()
        log.debug("workload %s attempt %d: %s off %s (%s)", wid, attempt, kind, cluster, reason)
        move = dpb.WorkloadMove(workload_id=wid, attempt=attempt, from_cluster=cluster, kind=kind, reason=reason,
                                time_s=self.clock())
        try:
            self.bus.publish(MOVES_STREAM, move.SerializeToString(), maxlen=self.settings.bus.dispatch_maxlen)
        except (BusUnavailableError, BusError) as exc:  # the move itself stands: the record is for audits
            log.warning("move of %s not recorded on %s: %s", wid, MOVES_STREAM, exc)

    # ------------------------------------------------------------------ summaries
    def _summary_loop(self) -> None:
        stream = SUMMARY_STREAM
        while not self._stop.is_set():
            try:
                entries = self.bus.read_group(stream, self.instance, self.instance, count=self.settings.bus.batch,
                                              block_ms=self.settings.bus.block_ms)
            except BusError:  # unreachable, or answering errors (LOADING after a restart, NOPERM): unreadable
                self.registry.bus_unreachable(self.clock())  # not the clusters' silence: the guard backs off
                raise
            self.registry.bus_readable(self.clock())
            for entry in entries:
                try:
                    summary = tpb.ClusterSummary.FromString(entry.payload)
                    if not summary.cluster:
                        raise ValueError("summary without a cluster name")
                except Exception as exc:
                    self.bus.dead_letter(stream, entry, reason=f"decode error: {exc}", group=self.instance,
                                         consumer=self.instance)
                    obs.STREAM_DEAD_LETTERS.labels(stream=stream, reason="decode").inc()
                    continue
                seen = min(self.clock(), summary.generated_unix_ms / 1000.0) if summary.generated_unix_ms else self.clock()
                if self.registry.apply(summary, now_s=seen):
                    self._on_cluster_up(summary.cluster)
            if entries:
                self.bus.ack(stream, self.instance, [e.entry_id for e in entries])
            if len(entries) < self.settings.bus.batch:
                self._summaries_read.set()

    def _on_cluster_up(self, cluster: str) -> None:
        """Failback: deferrable workloads not yet running on a dirtier cluster move to the recovered one."""
        names, _regions, feats = self.registry.features()
        if cluster not in names:
            return
        carbon = dict(zip(names, feats.carbon_now, strict=True))
        for other in names:
            if other == cluster or carbon[other] <= carbon[cluster] * 1.1:
                continue
            for wid in self.store.on_cluster(other):
                w = self.store.get(wid)
                if w is not None and w.spec.deferrable and w.state in (api.WORKLOAD_STATE_DISPATCHED,
                                                                       api.WORKLOAD_STATE_SCHEDULED):
                    self.reroute(wid, reason=f"failback: {cluster} recovered and is cleaner", move="failback",
                                 release_on=other)

    # ------------------------------------------------------------------ events
    def _events_loop(self) -> None:
        groups: dict[str, GroupGauges] = {}
        claim_every_s = max(1.0, self.settings.bus.claim_idle_ms / 3000.0)
        next_claim = 0.0
        while not self._stop.is_set():
            got = 0
            claim = time.monotonic() >= next_claim
            if claim:
                next_claim = time.monotonic() + claim_every_s
            for cluster in self.registry.names():
                stream = events_stream(cluster)
                first = stream not in groups
                if first:
                    self.bus.ensure_group(stream, EVENTS_GROUP, start_id="0")
                    groups[stream] = GroupGauges(self.bus, stream, EVENTS_GROUP)
                groups[stream].maybe_update()
                # What a dead instance read and never acknowledged (a restart, or a new leader's term, gets a new
                # consumer name). One engine consumes at a time (one process, or the leader of replicas), so at
                # its first look everything pending is a predecessor's: taken at once, not after claim_idle_ms.
                entries = self.bus.claim_stale(stream, EVENTS_GROUP, self.instance,
                                               min_idle_ms=0 if first else self.settings.bus.claim_idle_ms,
                                               count=self.settings.bus.batch) if claim or first else []
                entries += self.bus.read_group(stream, EVENTS_GROUP, self.instance, count=self.settings.bus.batch,
                                               block_ms=None)
                got += len(entries)
                for entry in entries:
                    try:
                        event = dpb.PlacementEvent.FromString(entry.payload)
                        if not event.workload_id:
                            raise ValueError("event without a workload id")
                    except Exception as exc:
                        self.bus.dead_letter(stream, entry, reason=f"decode error: {exc}", group=EVENTS_GROUP,
                                             consumer=self.instance)
                        obs.STREAM_DEAD_LETTERS.labels(stream="meridian:events", reason="decode").inc()
                        continue
                    self.apply_event(event)
                if entries:
                    self.store.flush()  # the news is durable before the cluster's entry is acknowledged
                    self.bus.ack(stream, EVENTS_GROUP, [e.entry_id for e in entries])
            if not got:
                self._stop.wait(0.05)

    def apply_event(self, event: dpb.PlacementEvent) -> None:
        w = self.store.get(event.workload_id)
        if w is None or w.attempt != event.attempt or w.state in TERMINAL or w.cluster != event.cluster:
            return  # an old attempt's news
        if event.phase == dpb.PLACEMENT_PHASE_SCHEDULED and w.state == api.WORKLOAD_STATE_DISPATCHED:
            self.store.update(w.id, expect_attempt=event.attempt, state=api.WORKLOAD_STATE_SCHEDULED,
                              nodes=list(event.nodes), ready_replicas=event.ready_replicas,
                              message=f"scheduled on {event.cluster}")
        elif event.phase == dpb.PLACEMENT_PHASE_RUNNING and w.state in (api.WORKLOAD_STATE_DISPATCHED,
                                                                        api.WORKLOAD_STATE_SCHEDULED,
                                                                        api.WORKLOAD_STATE_RUNNING):
            changes: dict[str, object] = {"state": api.WORKLOAD_STATE_RUNNING, "message": f"running on {event.cluster}",
                                          "ready_replicas": event.ready_replicas or w.spec.replicas}
            if event.nodes:
                changes["nodes"] = list(event.nodes)
            self.store.update(w.id, expect_attempt=event.attempt, **changes)
        elif event.phase == dpb.PLACEMENT_PHASE_WAITING and w.state in (api.WORKLOAD_STATE_DISPATCHED,
                                                                        api.WORKLOAD_STATE_SCHEDULED):
            # Replicas the member's scheduler cannot place yet: its words, until it places them or gives up.
            self.store.update(w.id, expect_attempt=event.attempt, ready_replicas=event.ready_replicas,
                              message=f"waiting on {event.cluster}: {event.reason}")
        elif event.phase == dpb.PLACEMENT_PHASE_SUCCEEDED:
            self._forget_slo(w.id)
            self.store.update(w.id, expect_attempt=event.attempt, state=api.WORKLOAD_STATE_SUCCEEDED,
                              ready_replicas=0, message=f"completed on {event.cluster}")
        elif event.phase == dpb.PLACEMENT_PHASE_FAILED:
            # Released there as well: a member that created objects for it (a Deployment whose replicas
            # could not be placed) removes them.
            self.reroute(w.id, reason=f"{event.cluster} rejected it: {event.reason}", move="rejected",
                         exclude=event.cluster, release_on=event.cluster)

    # ------------------------------------------------------------------ liveness
    def _sweep_loop(self) -> None:
        next_purge = 0.0
        while not self._stop.wait(self.settings.registry.sweep_interval_s):
            self.store.flush()  # everything else that changed (cancels, deferrals, messages)
            if time.monotonic() >= next_purge:  # a scan of the whole store: once a minute, not every sweep
                next_purge = time.monotonic() + 60.0
                self.store.purge(self.clock() - self.settings.store.terminal_retention_s)
            for cluster in self.registry.sweep(self.clock()):
                log.warning("cluster %s stopped reporting; rerouting its workloads", cluster)
                for wid in self.store.on_cluster(cluster):
                    self.reroute(wid, reason=f"cluster {cluster} stopped reporting", move="failover",
                                 release_on=cluster)

    # ------------------------------------------------------------------ reconciliation
    def _reconcile_loop(self) -> None:
        interval_s = self.settings.reconcile.interval_s
        if not interval_s:
            return
        while not self._summaries_read.wait(0.1):  # a pass before the backlog is read would judge nothing
            if self._stop.is_set():
                return
        while not self._stop.is_set():
            self.reconcile()
            self._stop.wait(interval_s)

    def reconcile(self) -> Counter[tuple[str, str]]:
        """One pass over the ``DISPATCHED`` workloads (:mod:`global_scheduler.reconcile`); returns how many were
        re-published or rerouted, by (action, reason). Nothing is judged while the bus cannot be read."""
        done: Counter[tuple[str, str]] = Counter()
        readable_since = self.registry.readable_since()
        if readable_since is None:
            return done
        now = self.clock()
        grace_s = self.settings.reconcile.grace_s
        heard_window_s = now - max(self._started_s, readable_since)
        dispatched = self.store.dispatched()
        with self._dispatch_sent_lock:
            sent = dict(self._dispatch_sent)
        views: dict[str, HoldingsView | None] = {}
        republish: dict[str, list[tuple[str, int, str]]] = {}
        reroutes: list[tuple[str, str, str]] = []
        for wid, cluster, attempt in dispatched:
            if cluster not in views:
                views[cluster] = self.registry.holdings_view(cluster)
            sent_attempt, sent_s = sent.get(wid, (0, 0.0))
            verdict = decide(workload_id=wid, view=views[cluster],
                             dispatched_s=sent_s if sent_attempt == attempt else self._started_s, now_s=now,
                             grace_s=grace_s, heard_window_s=heard_window_s,
                             cluster_timeout_s=self.settings.registry.cluster_timeout_s)
            if verdict is None:
                continue
            if verdict.action == REPUBLISH:
                republish.setdefault(cluster, []).append((wid, attempt, verdict.reason))
            else:
                reroutes.append((wid, cluster, verdict.reason))
        for wid, cluster, reason in reroutes:
            why = "it has not reported since this scheduler started" if reason == "cluster_unknown" else "it is down"
            self.reroute(wid, reason=f"reconciliation: dispatched to {cluster}, but {why}", move="reconciliation",
                         release_on=cluster)
            done["reroute", reason] += 1
        for cluster, items in republish.items():
            done.update(self._republish(cluster, items, now))
        stale = self._release_stale_copies(now, grace_s)
        if stale:
            done["release", "stale_copy"] += stale
        self._forget_dispatches({wid: attempt for wid, _, attempt in dispatched}, older_than_s=now - grace_s)
        for (action, reason), n in done.items():
            obs.RECONCILIATIONS.labels(action=action, reason=reason).inc(n)
        if reroutes:
            log.warning("reconciliation rerouted %d dispatched workloads off clusters down or unknown: %s",
                        len(reroutes), _some(f"{wid} ({cluster})" for wid, cluster, _ in reroutes))
        return done

    def _release_stale_copies(self, now_s: float, grace_s: float) -> int:
        """Release what a cluster holds that is not its to hold: a copy left on a cluster that was down when its
        workload moved (the release sent then may be trimmed away, or the cluster's state restored from a backup),
        one of a cancelled or failed workload, or of a workload this scheduler does not know. A repeated release
        is harmless, and releases only the attempt named and older: a newer attempt routed here stays. Returns
        how many were released."""
        stale: list[str] = []
        for cluster in self.registry.names():
            view = self.registry.holdings_view(cluster)
            if view is None or view.workloads is None or not view.ready:
                continue
            for wid in view.workloads:
                w = self.store.get(wid)
                if w is not None and now_s - w.updated_unix_s < grace_s:
                    continue  # just moved or cancelled: the release that sent it on is on its way
                if now_s - self._stale_released.get((cluster, wid), float("-inf")) < grace_s:
                    continue  # released already; give the cluster time to apply it
                if w is None:
                    if view.generated_s - self._started_s < grace_s:
                        continue  # a summary older than this scheduler's restored store judges nothing
                    attempt, why = STALE_ATTEMPT_ALL, "unknown to the global scheduler"
                elif w.cluster != cluster:
                    state = api.WorkloadState.Name(w.state).removeprefix("WORKLOAD_STATE_").lower()
                    attempt, why = w.attempt, f"it is {state}" + (f" on {w.cluster}" if w.cluster else "")
                elif w.state in (api.WORKLOAD_STATE_FAILED, api.WORKLOAD_STATE_CANCELLED):
                    attempt, why = w.attempt, api.WorkloadState.Name(w.state).removeprefix("WORKLOAD_STATE_").lower()
                else:
                    continue
                reason = f"stale copy: {why}"
                self._stale_released[cluster, wid] = now_s
                self._record_move(wid, attempt, cluster, "stale_copy", reason)
                self._publish_release(cluster, wid, attempt, reason)
                stale.append(f"{wid} on {cluster}")
        for key in [k for k, at in self._stale_released.items() if now_s - at > 10 * grace_s]:
            del self._stale_released[key]
        if stale:
            log.warning("reconciliation released %d stale copies: %s", len(stale), _some(stale))
        return len(stale)

    def _republish(self, cluster: str, items: list[tuple[str, int, str]], now_s: float) -> Counter[tuple[str, str]]:
        """Publish the places of ``items`` (workload, attempt, reason) again, those still DISPATCHED there."""
        payloads, kept = [], []
        for wid, attempt, reason in items:
            entry = self.store.entry(wid)
            w = entry.workload if entry is not None else None
            if w is None or w.state != api.WORKLOAD_STATE_DISPATCHED or w.attempt != attempt or w.cluster != cluster:
                continue  # news arrived, or it moved on, since the pass began
            payloads.append(self._place_payload(cluster, entry, attempt, now_s))  # type: ignore[arg-type]
            kept.append((wid, attempt, reason))
        done: Counter[tuple[str, str]] = Counter()
        if not payloads:
            return done
        try:
            self.bus.publish_many(dispatch_stream(cluster), payloads, maxlen=self.settings.bus.dispatch_maxlen)
        except (BusUnavailableError, BusError) as exc:
            log.warning("reconciliation could not publish %d dispatches to %s again (%s); next pass", len(kept),
                        cluster, exc)
            return done
        sent = self.clock()
        for wid, attempt, reason in kept:
            self._note_dispatch(wid, attempt, sent)
            done[REPUBLISH, reason] += 1
        log.warning("reconciliation published %d dispatches to %s again (%s): %s", len(kept), cluster,
                    ", ".join(f"{reason} {n}" for (_, reason), n in sorted(done.items())),
                    _some(f"{wid} attempt {attempt}" for wid, attempt, _ in kept))
        return done

    def _forget_dispatches(self, dispatched: dict[str, int], *, older_than_s: float) -> None:
        """Drop publish times of attempts no longer DISPATCHED (kept a grace period: a dispatch being made
        now may not be in the store's answer yet)."""
        with self._dispatch_sent_lock:
            stale = [wid for wid, (attempt, at_s) in self._dispatch_sent.items()
                     if at_s < older_than_s and dispatched.get(wid) != attempt]
            for wid in stale:
                del self._dispatch_sent[wid]


def _some(names: Iterable[str], limit: int = 5) -> str:
    """The first ``limit`` names and how many more (a log line stays one line)."""
    items = list(names)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more
