"""Meridian as a secondary scheduler of a real cluster: pods with ``spec.schedulerName: meridian``.

The shape is kube-scheduler's:

* **informers** (:mod:`regional_scheduler.informer`) list and watch Nodes and Pods into the
  :class:`~regional_scheduler.service.RegionalScheduler`: every bound Pod is counted on its node
  whoever bound it, pending pods of this scheduler go to the :mod:`scheduling queue
  <regional_scheduler.scheduling_queue>`; terminal pods leave the watch (field selector, as
  kube-scheduler's) and free their resources.
* **scheduling cycle** (one thread): pop the next pod, decide through the service (filters, then the
  policy), *assume* it on the chosen node so the next decision sees it, hand it to the binding cycle.
  A pod no node can hold gets a ``FailedScheduling`` Event and a ``PodScheduled=False`` condition
  (reason ``Unschedulable``) with kube-scheduler's message, and waits in the unschedulable queue until
  the cluster changes. A pod Meridian refuses (pod affinity, volumes to bind, …) gets the same Event and
  condition naming the feature, and waits until it is edited.
* **binding cycle** (a pool of ``bind_workers`` threads): the Binding subresource
  (:class:`~regional_scheduler.binders.kubernetes.KubernetesBinder`). A failed binding rolls the
  assumption back and retries after a back-off; ``409 Conflict`` (bound already) is reconciled from the
  informer, never retried.
* every request to the API server goes through one token bucket (``kube_api_qps``/``kube_api_burst``,
  kube-scheduler's ``clientConnection.qps``/``burst``, same defaults), except the long-lived watches.
* **leader election** on a Lease (:mod:`regional_scheduler.leader_election`): standbys keep their
  informers warm and schedule only once they hold the Lease; a leader that loses it stops.

Hazards: an assumption whose binding hangs holds its resources until the binding returns (the client's
request timeout bounds it); a pod deleted while its binding is in flight is answered 404 and forgotten.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from regional_scheduler import kube_objects as ko
from regional_scheduler import scheduler_metrics as m
from regional_scheduler.binders.base import BindConflictError, Binder, BindError, BindRequest, PodGoneError
from regional_scheduler.binders.kubernetes import KubernetesBinder
from regional_scheduler.framework import StageError
from regional_scheduler.informer import Informer
from regional_scheduler.leader_election import LeaseElector
from regional_scheduler.rate_limit import TokenBucket
from regional_scheduler.scheduling_queue import QueuedPod, SchedulingQueue
from regional_scheduler.service import RegionalScheduler

log = logging.getLogger(__name__)


class KubeSchedulerSettings(BaseSettings):
    """The regional scheduler on Kubernetes (environment: ``MERIDIAN_REGIONAL_*``)."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_REGIONAL_")

    cluster: str = Field("local", description="This cluster's name (metrics, summaries, dispatch stream).")
    scheduler_name: str = Field("meridian", description="Pods with this spec.schedulerName are Meridian's.")
    policy: str = Field("fgd", description="Placement policy (regional_scheduler.policies.registry): fgd packs GPUs "
                        "with the least fragmentation; learned adds the trained correction.")
    kube_api_qps: float = Field(50.0, description="Client-side limit on API requests per second (kube-scheduler's "
                                "clientConnection.qps, same default); <= 0 disables it.")
    kube_api_burst: int = Field(100, ge=1, description="Requests allowed in a burst above the QPS (kube-scheduler's "
                                "clientConnection.burst, same default).")
    bind_workers: int = Field(16, ge=1, le=256, description="Bindings in flight at once. The API server's binding "
                              "path sets the pace once bindings run concurrently; 16 saturates a small control "
                              "plane without queueing much in the client.")
    leader_elect: bool = Field(True, description="Schedule only while holding the Lease (run 2 replicas).")
    lease_namespace: str = Field("meridian-system", description="Namespace of the leader Lease.")
    lease_name: str = Field("meridian-regional-scheduler", description="Name of the leader Lease.")
    lease_duration_s: float = Field(15.0, gt=0, description="A standby takes over after the leader's Lease has not "
                                    "been renewed this long (kube-scheduler's default).")
    renew_deadline_s: float = Field(10.0, gt=0, description="A leader that cannot renew this long stops.")
    retry_period_s: float = Field(2.0, gt=0, description="Between attempts to acquire or renew the Lease.")
    identity: str = Field(default_factory=lambda: f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
                          description="This replica's identity in the Lease (the pod name in Kubernetes).")
    initial_backoff_s: float = Field(1.0, gt=0, description="Back-off of a pod's first retry (kube-scheduler's).")
    max_backoff_s: float = Field(10.0, gt=0, description="Longest back-off between retries (kube-scheduler's).")
    unschedulable_flush_s: float = Field(300.0, gt=0, description="An unschedulable pod is retried after this even "
                                         "if the cluster did not change, so a missed event cannot strand it "
                                         "(kube-scheduler's podMaxInUnschedulablePodsDuration, 5 min).")
    watch_timeout_s: int = Field(300, ge=10, description="Server-side timeout of one watch request; it is resumed "
                                 "from its last resourceVersion.")
    request_timeout_s: float = Field(30.0, gt=0, description="Timeout of one API request other than watches.")
    bus_url: str = Field("", description="Redis of the node agents' telemetry (redis://…): its reports' usage, "
                         "power and carbon join this scheduler's state and its cluster summaries go to the global "
                         "tier. Empty: no telemetry, no summaries.")
    region: str = Field("local", description="Region named in the cluster summaries.")


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _PodHandler:
    def __init__(self, owner: KubernetesScheduler) -> None:
        self.owner = owner

    def relisted(self, items: list[dict[str, Any]]) -> None:
        self.owner.pods_relisted(items)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        self.owner.pod_event(kind, obj)


class _NodeHandler:
    def __init__(self, owner: KubernetesScheduler) -> None:
        self.owner = owner

    def relisted(self, items: list[dict[str, Any]]) -> None:
        self.owner.nodes_relisted(items)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        self.owner.node_event(kind, obj)


class KubernetesScheduler:
    def __init__(self, *, api: client.ApiClient, service: RegionalScheduler, settings: KubeSchedulerSettings,
                 binder: Binder | None = None) -> None:
        self.api = api
        self.service = service
        self.settings = settings
        self.profile = settings.scheduler_name
        self.limiter = TokenBucket(settings.kube_api_qps, settings.kube_api_burst)
        # Events go through a client of their own with the same limits, as kube-scheduler's event
        # broadcaster does (its own clientset): a burst of FailedScheduling events never slows binding.
        self.event_limiter = TokenBucket(settings.kube_api_qps, settings.kube_api_burst)
        self.binder = binder or KubernetesBinder(api, limiter=self.limiter,
                                                 request_timeout_s=settings.request_timeout_s)
        self.core = client.CoreV1Api(api)
        self.queue = SchedulingQueue(initial_backoff_s=settings.initial_backoff_s,
                                     max_backoff_s=settings.max_backoff_s,
                                     flush_after_s=settings.unschedulable_flush_s)
        self.pool = ThreadPoolExecutor(max_workers=settings.bind_workers, thread_name_prefix="meridian-bind")
        self.node_informer = Informer(name="nodes", list_fn=self.core.list_node, handler=_NodeHandler(self),
                                      watch_timeout_s=settings.watch_timeout_s, before_call=self.limiter.acquire)
        self.pod_informer = Informer(name="pods", list_fn=self.core.list_pod_for_all_namespaces,
                                     handler=_PodHandler(self),
                                     field_selector="status.phase!=Succeeded,status.phase!=Failed",
                                     watch_timeout_s=settings.watch_timeout_s, before_call=self.limiter.acquire)
        self.elector = LeaseElector(api, namespace=settings.lease_namespace, name=settings.lease_name,
                                    identity=settings.identity, lease_duration_s=settings.lease_duration_s,
                                    renew_deadline_s=settings.renew_deadline_s,
                                    retry_period_s=settings.retry_period_s) if settings.leader_elect else None
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.bound_total = 0
        self.unschedulable_total = 0
        self.errors_total = 0
        self._counter_lock = threading.Lock()

    # ------------------------------------------------------------------ informer handlers
    def node_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if kind == "DELETED":
            self.service.remove_node(name)
            return
        try:
            node = ko.node_from_api(obj)
        except ko.InvalidObjectError as exc:
            log.warning("node %s ignored: %s", name, exc)
            return
        if self.service.upsert_node(node):
            self.queue.cluster_changed()

    def nodes_relisted(self, items: list[dict[str, Any]]) -> None:
        nodes = []
        for obj in items:
            try:
                nodes.append(ko.node_from_api(obj))
            except ko.InvalidObjectError as exc:
                log.warning("node ignored: %s", exc)
        self.service.replace_nodes(nodes)
        self.queue.cluster_changed()

    def _bound_view(self, obj: dict[str, Any]) -> Any:
        try:
            return ko.pod_from_api(obj, check_supported=False)
        except ko.InvalidObjectError as exc:
            log.warning("bound pod %s not counted: %s", ko.pod_key(obj), exc)
            return None

    def pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        uid = meta.get("uid", "")
        key = ko.pod_key(obj)
        phase = (obj.get("status") or {}).get("phase")
        node = spec.get("nodeName")
        if kind == "DELETED" or phase in ("Succeeded", "Failed"):
            self.queue.delete(key)
            if self.service.remove_pod(uid):
                self.queue.cluster_changed()
            return
        if node:
            self.queue.delete(key)
            pod = self._bound_view(obj)
            if pod is not None:
                self.service.observe_bound(uid, pod, node, ko.gpu_devices_of(obj))
            return
        if spec.get("schedulerName") == self.profile and not meta.get("deletionTimestamp"):
            self.queue.add(key, obj)
        else:
            self.queue.delete(key)

    def pods_relisted(self, items: list[dict[str, Any]]) -> None:
        bound = {}
        for obj in items:
            node = (obj.get("spec") or {}).get("nodeName")
            if node and (pod := self._bound_view(obj)) is not None:
                bound[(obj.get("metadata") or {}).get("uid", "")] = (pod, node, ko.gpu_devices_of(obj))
        self.service.replace_bound(bound)
        for obj in items:
            if not (obj.get("spec") or {}).get("nodeName"):
                self.pod_event("ADDED", obj)
        self.queue.cluster_changed()

    # ------------------------------------------------------------------ scheduling cycle
    def schedule_one(self, entry: QueuedPod) -> None:
        obj = entry.obj
        meta = obj.get("metadata") or {}
        uid = meta.get("uid", "")
        if self.service.is_known(uid):  # assumed or bound already; a late update of it
            self.queue.done(entry)
            return
        started = time.perf_counter()
        try:
            pod = ko.pod_from_api(obj)
        except (ko.UnsupportedPodError, ko.InvalidObjectError) as exc:
            self.queue.park(entry)
            self._count("error", started)
            self.pool.submit(self._report_failure, obj, "SchedulerError", str(exc))
            return
        try:
            decision = self.service.decide(uid, pod)
        except StageError as exc:
            log.exception("scheduling %s failed", entry.key)
            self.queue.retry(entry.key)
            self._count("error", started)
            self.pool.submit(self._report_failure, obj, "SchedulerError", str(exc))
            return
        for stage, ms in decision.stage_ms.items():
            m.EXTENSION_POINT_DURATION.labels(extension_point=stage.capitalize(), status="Success",
                                              profile=self.profile).observe(ms / 1e3)
        if decision.placement is None:
            message = self.service.failure_message(pod, decision)
            self.queue.unschedulable(entry)
            m.ATTEMPT_DURATION.labels(result="unschedulable", profile=self.profile).observe(
                time.perf_counter() - started)
            self._count("unschedulable", started)
            self.pool.submit(self._report_failure, obj, "Unschedulable", message)
            return
        m.ATTEMPT_DURATION.labels(result="scheduled", profile=self.profile).observe(time.perf_counter() - started)
        node = self.service.node_name(decision)
        annotations = {}
        if pod.requests.gpu_milli_total and decision.placement.devices:
            annotations[ko.GPU_DEVICES_ANNOTATION] = ",".join(str(d) for d in decision.placement.devices)
        self.queue.done(entry)
        request = BindRequest(namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=uid, node=node,
                              annotations=annotations)
        self.pool.submit(self._bind, request, entry, started)

    def _bind(self, request: BindRequest, entry: QueuedPod, started: float) -> None:
        t0 = time.perf_counter()
        try:
            self.binder.bind(request)
        except BindConflictError:
            m.BIND_CONFLICTS.labels(cluster=self.service.cluster).inc()
            self.service.forget(request.uid)
            return
        except PodGoneError:
            self.service.forget(request.uid)
            return
        except BindError as exc:
            log.warning("%s", exc)
            self.service.forget(request.uid)
            self.queue.retry(entry.key, entry.obj)
            self.queue.cluster_changed()  # the assumption's resources are free again
            self._count("error", started)
            return
        except Exception:
            log.exception("binding %s failed", request.key)
            self.service.forget(request.uid)
            self.queue.retry(entry.key, entry.obj)
            self._count("error", started)
            return
        self.service.bound(request.uid)
        m.EXTENSION_POINT_DURATION.labels(extension_point="Bind", status="Success",
                                          profile=self.profile).observe(time.perf_counter() - t0)
        m.POD_SCHEDULING_SLI.labels(attempts=str(min(entry.attempts, 15))).observe(
            time.monotonic() - entry.added_s)
        self._count("scheduled", started)

    def _count(self, result: str, started: float) -> None:
        m.SCHEDULE_ATTEMPTS.labels(result=result, profile=self.profile).inc()
        m.E2E_DURATION.labels(result=result, profile=self.profile).observe(time.perf_counter() - started)
        with self._counter_lock:
            if result == "scheduled":
                self.bound_total += 1
            elif result == "unschedulable":
                self.unschedulable_total += 1
            else:
                self.errors_total += 1

    def _report_failure(self, obj: dict[str, Any], reason: str, message: str) -> None:
        """A ``FailedScheduling`` Event and the ``PodScheduled=False`` condition, as kube-scheduler writes them."""
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        now = _now_rfc3339()
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace,
                               "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            "reason": "FailedScheduling", "message": message, "type": "Warning",
            "source": {"component": self.profile}, "reportingComponent": self.profile,
            "reportingInstance": self.settings.identity, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        condition = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
                     "lastTransitionTime": now}
        try:
            self.event_limiter.acquire()
            self.core.create_namespaced_event(namespace, event, _request_timeout=self.settings.request_timeout_s)
        except Exception as exc:
            log.warning("could not post FailedScheduling for %s/%s: %s", namespace, name, exc)
        current = next((c for c in (obj.get("status") or {}).get("conditions") or []
                        if c.get("type") == "PodScheduled"), {})
        if (current.get("status"), current.get("reason"), current.get("message")) == ("False", reason, message):
            return  # unchanged: kube-scheduler skips the patch too
        try:
            self.limiter.acquire()
            self.core.patch_namespaced_pod_status(name, namespace, {"status": {"conditions": [condition]}},
                                                  _request_timeout=self.settings.request_timeout_s)
        except Exception as exc:
            log.warning("could not set PodScheduled=False on %s/%s: %s", namespace, name, exc)

    # ------------------------------------------------------------------ lifecycle
    def _start(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def start_informers(self) -> None:
        self._start(self.node_informer.run, "informer-nodes", self.stop)
        self._start(self.pod_informer.run, "informer-pods", self.stop)

    def wait_synced(self, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        for informer in (self.node_informer, self.pod_informer):
            if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def _publish_queue_gauges(self) -> None:
        counts = self.queue.counts()
        m.PENDING_PODS.labels(queue="active").set(counts["active"] + counts["in-flight"])
        m.PENDING_PODS.labels(queue="backoff").set(counts["backoff"])
        m.PENDING_PODS.labels(queue="unschedulable").set(counts["unschedulable"])
        m.PENDING_PODS.labels(queue="gated").set(counts["parked"])

    def run(self) -> int:
        """Informers, leader election, then the scheduling cycle until stopped (0) or the Lease is lost (1)."""
        self.start_informers()
        if self.elector is not None:
            self._start(self.elector.run, "leader-election", self.stop)
            while not self.stop.is_set() and not self.elector.leading.wait(0.2):
                pass
            if self.stop.is_set():
                return 0
        m.IS_LEADER.labels(cluster=self.service.cluster).set(1)
        self.wait_synced()
        log.info("scheduling pods with schedulerName %s (policy %s)", self.profile, self.service.policy_name)
        last_gauges = 0.0
        while not self.stop.is_set():
            if self.elector is not None and self.elector.lost.is_set():
                log.error("leader election lost; stopping so that a standby schedules")
                m.IS_LEADER.labels(cluster=self.service.cluster).set(0)
                self.shutdown()
                return 1
            entry = self.queue.pop(timeout_s=0.2)
            if entry is not None:
                self.schedule_one(entry)
            if time.monotonic() - last_gauges > 1.0:
                self._publish_queue_gauges()
                last_gauges = time.monotonic()
        self.shutdown()
        return 0

    def shutdown(self) -> None:
        """Stop scheduling, let bindings in flight finish, release the Lease."""
        self.stop.set()
        self.queue.close()
        self.pool.shutdown(wait=True, cancel_futures=False)
        self.node_informer.interrupt()
        self.pod_informer.interrupt()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        m.IS_LEADER.labels(cluster=self.service.cluster).set(0)


def api_client_from(kubeconfig: str | None, *, pool_size: int = 32) -> client.ApiClient:
    """An API client from a kubeconfig file, or the in-cluster config when run in a pod."""
    from kubernetes import config as kconfig

    configuration = client.Configuration()
    if kubeconfig:
        kconfig.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kconfig.load_incluster_config(client_configuration=configuration)
    else:
        kconfig.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)
