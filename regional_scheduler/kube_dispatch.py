"""Dispatch into a real member cluster: ``meridian:{cluster}:dispatch`` becomes Deployments and Jobs.

The global tier routes a workload to a cluster and publishes a ``PlaceWorkload`` on that cluster's
dispatch stream; this worker, part of the cluster's regional scheduler, creates the workload's object
in its own API server and reports what becomes of it. The member pulls its work, as Karmada's agent
does in its *Pull* mode, rather than the hub pushing it: each member's credentials stay in the member
(the hub holds no kubeconfig that could reach every cluster), a member keeps applying what it has
been sent while the hub is unreachable, and the release that a failover sends to a lost member waits
in its stream until the member is back, which is exactly when its stale copies must go.

* **Objects.** A service (``WORKLOAD_KIND_SERVICE``) becomes a ``Deployment``, batch work a ``Job``
  (``parallelism = completions = replicas``), in one namespace (``namespace``, default
  ``meridian-workloads``), with ``schedulerName: meridian`` so that this cluster's regional scheduler
  places the pods. Every object and pod carries ``meridian.io/workload`` and ``meridian.io/attempt``
  labels (``app.kubernetes.io/managed-by: meridian`` on the objects) and the workload's name and tenant
  as annotations. The object's name includes the attempt, so an attempt is one object: a Job's pod
  template cannot change, and a new attempt never rolls an old one's pods.
* **Server-side apply** with field manager ``meridian``: a repeated place of the same attempt (a
  redelivery, the global reconciliation) changes nothing, not even the ``resourceVersion``. When the
  only conflict is ``spec.replicas`` (an autoscaler scaled the member's Deployment through its scale
  subresource), the apply leaves ``replicas`` to it, as the Kubernetes documentation advises for a
  manager that hands a field over; any other conflict is re-applied with ``force``: Meridian owns the
  spec it dispatched.
* **Status** is read back every ``status_interval_s`` (one list each of Deployments, Jobs and Pods in
  the namespace) and published on ``meridian:{cluster}:events`` when it changes: ``SCHEDULED`` with
  the nodes once every replica's pod is bound, ``RUNNING`` once ``readyReplicas`` (Deployment) or
  ``ready`` (Job) reaches the replicas, ``SUCCEEDED`` when a Job completes, ``WAITING`` with the
  scheduler's ``FailedScheduling`` message while replicas cannot be placed, and ``FAILED`` when they
  have not been placed for ``unschedulable_grace_s`` or a Job failed, so the global tier reroutes. A
  restarted worker reports every workload's current phase once again; the global tier applies a phase
  of an attempt once.
* **Release** (cancel, failover, failback) deletes the workload's objects of that attempt and older
  (``propagationPolicy: Background``: the garbage collector removes their ReplicaSets and Pods).
* **Holdings**: the summaries this cluster publishes list every workload that has an object here
  (:meth:`KubeDispatchWorker.holdings`), which is how the global reconciliation finds a stale copy
  left on a cluster that was down when its workload moved, and releases it.
* **A silent API server**: an apply, delete or list that cannot reach the API server leaves the
  stream entry (and the ones after it) unacknowledged and tried again with back-off, so nothing the
  global tier sent is lost; :meth:`KubeDispatchWorker.answering` turns false after ``api_silence_s``
  without an answer, and the summary publisher stops publishing: to the global tier the cluster goes
  silent and, after its registry timeout, its workloads fail over.

Hazards: objects in the namespace that carry Meridian's labels but were not made by it are reported
and released like its own; the worker trusts the namespace to be Meridian's.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from meridian import observability as obs
from meridian import quantity
from meridian.bus import BusError, BusUnavailableError, StreamBus, dispatch_stream, events_stream
from meridian.bus.base import StreamEntry
from meridian.bus.consumer import backoff_delay
from meridian.bus.health import GroupGauges
from meridian.bus.settings import ConsumerSettings, StreamConsumerSettings
from protos import dispatch_pb2 as dpb
from protos import telemetry_pb2 as tpb
from regional_scheduler.kube_objects import GPU_RESOURCE, GPU_SHARE_RESOURCE

log = logging.getLogger(__name__)

GROUP = "regional-dispatch"
WORKLOAD_LABEL = "meridian.io/workload"
ATTEMPT_LABEL = "meridian.io/attempt"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "meridian"
NAME_ANNOTATION = "meridian.io/workload-name"
TENANT_ANNOTATION = "meridian.io/tenant"
PRIORITY_ANNOTATION = "meridian.io/priority"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
DEPLOYMENT, JOB = "Deployment", "Job"
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


KubeDispatchBus = ConsumerSettings.tailored("KubeDispatchBus", batch=64, block_ms=500,
                                            at_least={"block_ms": 1, "claim_idle_ms": 1000})
"""The Kubernetes dispatch worker's stream settings: smaller batches than the simulated worker's (each entry is
a round trip to the API server), a longer wait (the leader polls alone), and the same lower bounds."""


class KubeDispatchSettings(StreamConsumerSettings):
    """Environment: ``MERIDIAN_KUBE_DISPATCH_*``; the stream settings ``MERIDIAN_KUBE_DISPATCH_BUS__*`` (the flat
    ``MERIDIAN_KUBE_DISPATCH_BLOCK_MS`` and so on still work)."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_KUBE_DISPATCH_")
    flat_bus_names: ClassVar[Mapping[str, str]] = {"batch": "batch", "block_ms": "block_ms", "claim_idle_ms": "claim_idle_ms",
                      "backoff_s": "backoff_s"}

    namespace: str = Field("meridian-workloads", min_length=1, description="Namespace of the Deployments and "
                           "Jobs created for dispatched workloads (the regional scheduler's Role is scoped to it).")
    field_manager: str = Field("meridian", min_length=1, description="Server-side apply field manager.")
    scheduler_name: str = Field("meridian", min_length=1, description="spec.schedulerName of the pods created.")
    default_image: str = Field("registry.k8s.io/pause:3.10", description="Image of a workload that names none.")
    termination_grace_period_s: int | None = Field(None, ge=0, description="Pods' terminationGracePeriodSeconds; "
                                                   "unset: Kubernetes' default (30 s).")
    job_backoff_limit: int = Field(3, ge=0, description="A Job's backoffLimit (pod failures before it fails).")
    status_interval_s: float = Field(1.0, gt=0, description="Seconds between reads of the objects' status.")
    unschedulable_grace_s: float = Field(60.0, gt=0, description="Replicas unplaced this long fail the attempt "
                                         "here (FAILED), and the global tier reroutes it to another cluster.")
    api_silence_s: float = Field(5.0, gt=0, description="Seconds without an answer from the API server after "
                                 "which this cluster stops publishing summaries (the global tier fails it over).")
    request_timeout_s: float = Field(10.0, gt=0, description="Timeout of one API request.")
    apply_workers: int = Field(8, ge=1, description="Workloads applied at once (one workload's entries stay in "
                               "order); each apply is a round trip to the API server.")
    bus: KubeDispatchBus = Field(default_factory=KubeDispatchBus, description="Reading the dispatch stream: "
                                 "batch, block_ms, claim_idle_ms, and backoff_s, the delays while the bus or the "
                                 "API server does not answer (meridian.bus.settings.ConsumerSettings).")
    events_maxlen: int = Field(100_000, ge=1000, description="Approximate bound of the events stream (entries).")


class ApiServerUnavailableError(Exception):
    """The member's API server did not answer (connection refused, timeout, 5xx, 429): try again later."""


def _unavailable(exc: Exception) -> bool:
    if isinstance(exc, ApiException):
        return exc.status is None or exc.status == 0 or exc.status == 429 or exc.status >= 500
    return True  # urllib3 connection errors, timeouts, TLS errors


def object_name(msg: dpb.PlaceWorkload) -> str:
    """``<name>-<id>-a<attempt>``: a DNS-1123 label short enough for a Job's ``job-name`` pod label and a
    Deployment's pod names (a 10-character ReplicaSet hash and a 5-character suffix are appended)."""
    base = _NOT_DNS.sub("-", msg.name.lower()).strip("-")[:28].rstrip("-") or "workload"
    return f"{base}-{msg.workload_id[:10].lower()}-a{msg.attempt}"


def kind_of(msg: dpb.PlaceWorkload) -> str:
    return JOB if msg.kind == dpb.WORKLOAD_KIND_BATCH else DEPLOYMENT


def manifest(msg: dpb.PlaceWorkload, settings: KubeDispatchSettings) -> dict[str, Any]:
    """The Deployment or Job of one attempt of a workload, as server-side apply receives it."""
    labels = {WORKLOAD_LABEL: msg.workload_id, ATTEMPT_LABEL: str(msg.attempt)}
    annotations = {NAME_ANNOTATION: msg.name, TENANT_ANNOTATION: msg.tenant, PRIORITY_ANNOTATION: str(msg.priority)}
    r = msg.requests
    requests: dict[str, str] = {"cpu": f"{r.milli_cpu}m", "memory": str(r.memory_bytes)}
    limits: dict[str, str] = {}
    if r.gpu:  # extended resources: the limit must equal the request
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(r.gpu)
    elif r.gpu_milli:
        requests[GPU_SHARE_RESOURCE] = limits[GPU_SHARE_RESOURCE] = str(r.gpu_milli)
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    pod_spec: dict[str, Any] = {
        "schedulerName": settings.scheduler_name,
        "containers": [{"name": "main", "image": msg.image or settings.default_image, "resources": resources}],
    }
    if settings.termination_grace_period_s is not None:
        pod_spec["terminationGracePeriodSeconds"] = settings.termination_grace_period_s
    template = {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}
    metadata = {"name": object_name(msg), "namespace": settings.namespace,
                "labels": {**labels, MANAGED_BY_LABEL: MANAGED_BY}, "annotations": annotations}
    if kind_of(msg) == JOB:
        pod_spec["restartPolicy"] = "Never"
        return {"apiVersion": "batch/v1", "kind": JOB, "metadata": metadata,
                "spec": {"parallelism": msg.replicas, "completions": msg.replicas,
                         "backoffLimit": settings.job_backoff_limit, "template": template}}
    return {"apiVersion": "apps/v1", "kind": DEPLOYMENT, "metadata": metadata,
            "spec": {"replicas": msg.replicas, "selector": {"matchLabels": labels}, "template": template}}


@dataclass
class Observed:
    """One Meridian object of the namespace and its pods, as the last status read saw them."""

    kind: str
    name: str
    workload: str
    attempt: int
    replicas: int
    ready: int
    nodes: list[str]
    unschedulable: str  # the scheduler's message for a replica it cannot place ("" if none)
    succeeded: bool
    failed: str  # a failed Job's reason ("" if not failed)
    tenant: str
    milli_cpu: int  # per replica
    memory_bytes: int
    gpu_milli: int


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions") or ():
        if c.get("type") == kind and c.get("status") == "True":
            return c
    return None


def _requests_of(obj: dict[str, Any]) -> tuple[int, int, int]:
    milli_cpu = memory = gpu_milli = 0
    for container in obj["spec"]["template"]["spec"].get("containers") or ():
        req = (container.get("resources") or {}).get("requests") or {}
        milli_cpu += quantity.to_milli(req.get("cpu", 0))
        memory += quantity.to_int(req.get("memory", 0))
        gpu_milli += 1000 * quantity.to_int(req.get(GPU_RESOURCE, 0)) + quantity.to_int(req.get(GPU_SHARE_RESOURCE, 0))
    return milli_cpu, memory, gpu_milli


def observe(objects: Sequence[tuple[str, dict[str, Any]]], pods: Sequence[dict[str, Any]]) -> list[Observed]:
    """Join the Meridian objects with their pods (by workload and attempt labels)."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in pods:
        meta = pod.get("metadata", {})
        if meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        by_key.setdefault((labels.get(WORKLOAD_LABEL, ""), labels.get(ATTEMPT_LABEL, "")), []).append(pod)
    out = []
    for kind, obj in objects:
        labels = _labels(obj)
        wid, attempt = labels.get(WORKLOAD_LABEL), labels.get(ATTEMPT_LABEL, "")
        if not wid or not attempt.isdigit() or obj.get("metadata", {}).get("deletionTimestamp"):
            continue
        spec, status = obj.get("spec", {}), obj.get("status", {})
        replicas = int(spec.get("replicas", 1) if kind == DEPLOYMENT else spec.get("parallelism", 1))
        ready = int(status.get("readyReplicas", 0) if kind == DEPLOYMENT else status.get("ready", 0))
        nodes, unschedulable = [], ""
        for pod in sorted(by_key.get((wid, attempt), ()), key=lambda p: p["metadata"]["name"]):
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            node = pod.get("spec", {}).get("nodeName")
            if node:
                nodes.append(node)
                continue
            scheduled = next((c for c in pod.get("status", {}).get("conditions") or ()
                              if c.get("type") == "PodScheduled"), None)
            if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
                unschedulable = scheduled.get("message") or "Unschedulable"
        failed = _condition(obj, "Failed") if kind == JOB else None
        milli_cpu, memory, gpu_milli = _requests_of(obj)
        out.append(Observed(kind=kind, name=obj["metadata"]["name"], workload=wid, attempt=int(attempt),
                            replicas=replicas, ready=ready, nodes=nodes, unschedulable=unschedulable,
                            succeeded=kind == JOB and _condition(obj, "Complete") is not None,
                            failed=(failed.get("message") or failed.get("reason") or "Job failed") if failed else "",
                            tenant=(obj.get("metadata", {}).get("annotations") or {}).get(TENANT_ANNOTATION, ""),
                            milli_cpu=milli_cpu, memory_bytes=memory, gpu_milli=gpu_milli))
    return out


class KubeDispatchWorker:
    """Consumes this cluster's dispatch stream into its API server and reports the objects' status."""

    def __init__(self, *, bus: StreamBus, api: client.ApiClient, cluster: str,
                 settings: KubeDispatchSettings | None = None, consumer: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.bus = bus
        self.api = api
        self.cluster = cluster
        self.settings = settings or KubeDispatchSettings()
        self.consumer = consumer or f"{cluster}-kube-{uuid.uuid4().hex[:6]}"
        self.clock = clock
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.stream = dispatch_stream(cluster)
        self.events = events_stream(cluster)
        self._gauges = GroupGauges(bus, self.stream, GROUP)
        self._pool = ThreadPoolExecutor(max_workers=self.settings.apply_workers, thread_name_prefix="kube-dispatch")
        self._retry: list[StreamEntry] = []  # entries not applied because the API server did not answer
        self._last_answer: float | None = None  # not known to answer until it has
        self._lock = threading.Lock()
        self._observed: list[Observed] = []
        self._observed_ok = False
        # (workload, attempt) → what was last reported for it, so each change is published once.
        self._reported: dict[tuple[str, int], tuple[int, int, str]] = {}
        self._unplaced_since: dict[tuple[str, int], float] = {}
        self._failed_here: set[tuple[str, int]] = set()
        self.applied_total = 0
        self.released_total = 0

    # ------------------------------------------------------------------ health and holdings
    def answering(self) -> bool:
        """Whether the API server answered within ``api_silence_s``: a cluster that cannot reach its own
        API server stops reporting, so the global tier fails its workloads over."""
        last = self._last_answer
        return last is not None and time.monotonic() - last < self.settings.api_silence_s

    def holdings(self) -> list[tpb.WorkloadHolding] | None:
        """One holding per workload with an object here (None before the first successful read)."""
        with self._lock:
            if not self._observed_ok:
                return None
            held: dict[str, tpb.WorkloadHolding] = {}
            for o in self._observed:
                h = held.setdefault(o.workload, tpb.WorkloadHolding(workload=o.workload, tenant=o.tenant))
                h.milli_cpu += o.milli_cpu * o.replicas
                h.memory_bytes += o.memory_bytes * o.replicas
                h.gpu_milli += o.gpu_milli * o.replicas
            return list(held.values())

    def _answered(self) -> None:
        self._last_answer = time.monotonic()

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            reply = fn(*args, _request_timeout=self.settings.request_timeout_s, **kwargs)
        except Exception as exc:
            if _unavailable(exc):
                raise ApiServerUnavailableError(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from exc
            self._answered()
            raise
        self._answered()
        return reply

    # ------------------------------------------------------------------ apply
    def _event(self, wid: str, attempt: int, phase: int, *, reason: str = "", nodes: Sequence[str] = (),
               ready: int = 0) -> bytes:
        return dpb.PlacementEvent(workload_id=wid, attempt=attempt, cluster=self.cluster, phase=phase,
                                  reason=reason, nodes=list(nodes), time_s=self.clock(),
                                  ready_replicas=ready).SerializeToString()

    def _apply(self, body: dict[str, Any]) -> None:
        patch = self.batch.patch_namespaced_job if body["kind"] == JOB else self.apps.patch_namespaced_deployment
        name, ns = body["metadata"]["name"], body["metadata"]["namespace"]
        kwargs = {"field_manager": self.settings.field_manager, "_content_type": APPLY_CONTENT_TYPE,
                  "_preload_content": False}
        try:
            self._call(patch, name, ns, body, **kwargs)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
            fields = _conflicting_fields(exc)
        if fields and fields <= {".spec.replicas"}:
            # Another manager (an autoscaler, through the scale subresource) owns the replica count now.
            body = json.loads(json.dumps(body))
            del body["spec"]["replicas"]
            log.info("%s/%s: spec.replicas is another manager's now; applied without it", ns, name)
            self._call(patch, name, ns, body, **kwargs)
        else:
            log.warning("%s/%s: fields %s were changed by another manager; Meridian's spec applied over them",
                        ns, name, ", ".join(sorted(fields)) or "?")
            self._call(patch, name, ns, body, force=True, **kwargs)

    def _objects_of(self, wid: str) -> list[tuple[Callable[..., Any], str, int]]:
        """The workload's objects here: (delete method, name, attempt)."""
        out = []
        for lister, deleter in ((self.apps.list_namespaced_deployment, self.apps.delete_namespaced_deployment),
                                (self.batch.list_namespaced_job, self.batch.delete_namespaced_job)):
            reply = self._call(lister, self.settings.namespace, label_selector=f"{WORKLOAD_LABEL}={wid}",
                               _preload_content=False)
            for obj in json.loads(reply.data).get("items", []):
                out.append((deleter, obj["metadata"]["name"], int(_labels(obj).get(ATTEMPT_LABEL, "0") or 0)))
        return out

    def _delete(self, objects: list[tuple[Callable[..., Any], str, int]]) -> int:
        for deleter, name, _ in objects:
            try:
                self._call(deleter, name, self.settings.namespace, propagation_policy="Background",
                           _preload_content=False)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return len(objects)

    def place(self, msg: dpb.PlaceWorkload) -> list[bytes]:
        key = (msg.workload_id, msg.attempt)
        body = manifest(msg, self.settings)
        try:
            if msg.attempt > 1 or self._seen_newer(msg):
                # Another attempt may be here: an older one routed here before (failback) goes; a newer one
                # means this place is stale (a re-published place overtaken by a reroute) and is ignored.
                objects = self._objects_of(msg.workload_id)
                if any(attempt > msg.attempt for _, _, attempt in objects):
                    log.info("%s: place of %s attempt %d ignored: a newer attempt is here", self.cluster,
                             msg.workload_id, msg.attempt)
                    return []
                if stale := self._delete([o for o in objects if o[2] < msg.attempt]):
                    log.info("%s: removed %d objects of older attempts of %s", self.cluster, stale, msg.workload_id)
            self._apply(body)
        except ApiException as exc:  # the API server refused it (invalid, forbidden, quota): another cluster may not
            reason = f"{body['kind']} {body['metadata']['name']} refused by the API server: " \
                     f"{_status_message(exc)}"
            log.warning("%s: %s", self.cluster, reason)
            obs.PLACEMENT_FAILURES.labels(component="regional-dispatch", cluster=self.cluster,
                                          reason="object refused").inc()
            with self._lock:
                self._failed_here.add(key)
            return [self._event(*key, dpb.PLACEMENT_PHASE_FAILED, reason=reason)]
        self.applied_total += 1
        with self._lock:
            self._reported.pop(key, None)  # the status read reports this attempt's phase (again)
            self._failed_here.discard(key)
        obs.PLACEMENTS.labels(component="regional-dispatch", cluster=self.cluster, policy="kubernetes").inc()
        return []

    def _seen_newer(self, msg: dpb.PlaceWorkload) -> bool:
        """Whether the last status read saw a newer attempt of this workload here (a place of attempt 1 is not
        checked against the API server otherwise: nothing older than it can exist)."""
        with self._lock:
            return any(o.workload == msg.workload_id and o.attempt > msg.attempt for o in self._observed)

    def release(self, msg: dpb.ReleaseWorkload) -> list[bytes]:
        deleted = self._delete([o for o in self._objects_of(msg.workload_id) if o[2] <= msg.attempt])
        self.released_total += 1
        with self._lock:
            for key in [k for k in self._reported if k[0] == msg.workload_id and k[1] <= msg.attempt]:
                del self._reported[key]
        log.info("%s: released %s up to attempt %d (%d objects deleted): %s", self.cluster, msg.workload_id,
                 msg.attempt, deleted, msg.reason)
        return [self._event(msg.workload_id, msg.attempt, dpb.PLACEMENT_PHASE_RELEASED, reason=msg.reason)]

    def apply(self, msg: dpb.DispatchMessage) -> list[bytes]:
        """Apply one dispatch message; its events. ValueError for a message that says nothing applicable."""
        action = msg.WhichOneof("action")
        if action == "place":
            if not msg.place.workload_id or msg.place.replicas < 1:
                raise ValueError("place without a workload id or replicas")
            return self.place(msg.place)
        if action == "release":
            if not msg.release.workload_id:
                raise ValueError("release without a workload id")
            return self.release(msg.release)
        raise ValueError("dispatch message with neither place nor release")

    def poll_once(self, *, block_ms: int | None = None) -> int:
        """Apply entries in order; on a silent API server the rest of the batch waits (unacknowledged) for the
        next poll. Returns the entries applied or dead-lettered."""
        if self._retry:
            entries, self._retry = self._retry, []
        else:
            entries = self.bus.claim_stale(self.stream, GROUP, self.consumer,
                                           min_idle_ms=self.settings.bus.claim_idle_ms, count=self.settings.bus.batch)
            entries += self.bus.read_group(self.stream, GROUP, self.consumer, count=self.settings.bus.batch,
                                           block_ms=self.settings.bus.block_ms if block_ms is None else block_ms)
        self._gauges.maybe_update()
        # One workload's entries in order; different workloads side by side (each apply is a round trip).
        # Each entry is decoded once, here; those that do not decode are dead-lettered, in a group of their own.
        by_workload: dict[str, list[tuple[StreamEntry, dpb.DispatchMessage | None]]] = {}
        for entry in entries:
            msg = _decoded(entry)
            by_workload.setdefault(_workload_of(msg), []).append((entry, msg))
        results = list(self._pool.map(self._apply_in_order, by_workload.values()))
        out = [event for events, _, _ in results for event in events]
        done = [entry_id for _, ids, _ in results for entry_id in ids]
        waiting = {e.entry_id for _, _, rest in results for e in rest}
        left = [e for e in entries if e.entry_id in waiting]  # in stream order
        if out:
            self.bus.publish_many(self.events, out, maxlen=self.settings.events_maxlen)
        if done:
            self.bus.ack(self.stream, GROUP, done)
        if left:
            self._retry = left
            raise ApiServerUnavailableError(f"{len(left)} dispatch entries wait for the API server")
        return len(done)

    def _apply_in_order(self, items: list[tuple[StreamEntry, dpb.DispatchMessage | None]]
                        ) -> tuple[list[bytes], list[str], list[StreamEntry]]:
        """Apply one workload's entries in order: (events, entries done, entries left for the API server)."""
        out: list[bytes] = []
        done: list[str] = []
        for i, (entry, msg) in enumerate(items):
            try:
                if msg is None:
                    raise ValueError("not a DispatchMessage")
                out.extend(self.apply(msg))
            except ApiServerUnavailableError as exc:
                log.debug("%s: %s", self.cluster, exc)
                return out, done, [e for e, _ in items[i:]]
            except Exception as exc:
                self.bus.dead_letter(self.stream, entry, reason=f"cannot apply: {exc}", group=GROUP,
                                     consumer=self.consumer)
                obs.STREAM_DEAD_LETTERS.labels(stream="meridian:dispatch", reason="apply").inc()
            done.append(entry.entry_id)
        return out, done, []

    # ------------------------------------------------------------------ status
    def read_status(self) -> list[bytes]:
        """List the namespace's Meridian objects and pods; the events of what changed since the last read."""
        ns = self.settings.namespace
        selector = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
        deployments = json.loads(self._call(self.apps.list_namespaced_deployment, ns, label_selector=selector,
                                            _preload_content=False).data).get("items", [])
        jobs = json.loads(self._call(self.batch.list_namespaced_job, ns, label_selector=selector,
                                     _preload_content=False).data).get("items", [])
        pods = json.loads(self._call(self.core.list_namespaced_pod, ns, label_selector=WORKLOAD_LABEL,
                                     _preload_content=False).data).get("items", [])
        observed = observe([(DEPLOYMENT, d) for d in deployments] + [(JOB, j) for j in jobs], pods)
        now = self.clock()
        out = []
        with self._lock:
            self._observed, self._observed_ok = observed, True
            present = set()
            for o in observed:
                key = (o.workload, o.attempt)
                present.add(key)
                event = self._status_event(o, key, now)
                if event is not None:
                    out.append(event)
            for key in [k for k in self._reported if k not in present]:
                del self._reported[key]
            for key in [k for k in self._unplaced_since if k not in present]:
                del self._unplaced_since[key]
            self._failed_here &= present
        return out

    def _status_event(self, o: Observed, key: tuple[str, int], now: float) -> bytes | None:
        """The event for one object if its phase, ready count or reason changed (caller holds the lock)."""
        nodes: Sequence[str] = ()
        reason = ""
        if key in self._failed_here:
            return None
        if o.failed:
            phase, reason = dpb.PLACEMENT_PHASE_FAILED, f"Job failed: {o.failed}"
        elif o.succeeded:
            phase = dpb.PLACEMENT_PHASE_SUCCEEDED
        elif o.ready >= o.replicas > 0:
            phase, nodes = dpb.PLACEMENT_PHASE_RUNNING, o.nodes
        elif len(o.nodes) >= o.replicas:
            phase, nodes = dpb.PLACEMENT_PHASE_SCHEDULED, o.nodes
        elif o.unschedulable:
            since = self._unplaced_since.setdefault(key, now)
            waited = now - since
            if waited >= self.settings.unschedulable_grace_s:
                phase = dpb.PLACEMENT_PHASE_FAILED
                reason = (f"{o.replicas - len(o.nodes)} of {o.replicas} replicas unschedulable for "
                          f"{waited:.0f} s: {o.unschedulable}")
                obs.PLACEMENT_FAILURES.labels(component="regional-dispatch", cluster=self.cluster,
                                              reason="replicas unschedulable").inc()
            else:
                phase = dpb.PLACEMENT_PHASE_WAITING
                reason = f"{len(o.nodes)}/{o.replicas} replicas placed; {o.unschedulable}"
        else:
            return None  # created, not yet looked at by the scheduler
        if phase != dpb.PLACEMENT_PHASE_WAITING:
            self._unplaced_since.pop(key, None)
        if phase == dpb.PLACEMENT_PHASE_FAILED:
            self._failed_here.add(key)  # reported once; the release that follows removes the object
        state = (phase, o.ready, reason)
        if self._reported.get(key) == state:
            return None
        self._reported[key] = state
        return self._event(o.workload, o.attempt, phase, reason=reason, nodes=nodes, ready=o.ready)

    # ------------------------------------------------------------------ loop
    def run(self, stop: threading.Event, *, leading: threading.Event | None = None) -> None:
        """Apply and report until ``stop``; with ``leading``, only while it is set (the regional scheduler's
        Lease: one replica dispatches). Status is read on a thread of its own, so a burst of applies does not
        delay the news of what is already bound."""
        status = threading.Thread(target=self._status_loop, args=(stop, leading), name=f"{self.cluster}-status",
                                  daemon=True)
        status.start()
        failures = 0
        grouped = False
        led = False
        while not stop.is_set():
            if leading is not None and not leading.is_set():
                led = False
                stop.wait(0.2)
                continue
            try:
                if not grouped:
                    self.bus.ensure_group(self.stream, GROUP, start_id="0")
                    grouped = True
                if not led:
                    # Only the leader consumes: what a dead leader read and never acknowledged is this one's
                    # at once, not after claim_idle_ms (a deposed leader still applying it is harmless:
                    # server-side apply of the same attempt writes nothing).
                    self._retry = self.bus.claim_stale(self.stream, GROUP, self.consumer, min_idle_ms=0,
                                                       count=self.settings.bus.batch) + self._retry
                    if self._retry:
                        log.info("%s: took over %d dispatch entries a previous leader left unacknowledged",
                                 self.cluster, len(self._retry))
                    led = True
                self.poll_once()
                failures = 0
            except (BusUnavailableError, BusError, ApiServerUnavailableError) as exc:
                failures = self._back_off(stop, exc, failures)
        status.join(timeout=10)
        self._pool.shutdown(wait=False)

    def _status_loop(self, stop: threading.Event, leading: threading.Event | None) -> None:
        failures = 0
        while not stop.wait(self.settings.status_interval_s):
            if leading is not None and not leading.is_set():
                continue
            try:
                events = self.read_status()
                if events:
                    self.bus.publish_many(self.events, events, maxlen=self.settings.events_maxlen)
                failures = 0
            except (BusUnavailableError, BusError, ApiServerUnavailableError) as exc:
                failures = self._back_off(stop, exc, failures)
            except ApiException as exc:  # a list refused (RBAC): say so, keep going
                log.error("dispatch into %s: the API server refused a status read: %s", self.cluster,
                          _status_message(exc))
                stop.wait(self.settings.bus.backoff_s[-1])

    def _back_off(self, stop: threading.Event, exc: Exception, failures: int) -> int:
        delay = backoff_delay(self.settings.bus.backoff_s, failures)
        what = "API server" if isinstance(exc, ApiServerUnavailableError) else "bus"
        log.warning("dispatch into %s: %s unavailable (%s); retrying in %.1f s", self.cluster, what, exc, delay)
        stop.wait(delay)
        return failures + 1


def _decoded(entry: StreamEntry) -> dpb.DispatchMessage | None:
    try:
        return dpb.DispatchMessage.FromString(entry.payload)
    except Exception:  # protobuf's DecodeError, or worse: dead-lettered by the caller
        return None


def _workload_of(msg: dpb.DispatchMessage | None) -> str:
    """The workload a message is about ("" for none: such entries are handled, and dead-lettered, together)."""
    if msg is None:
        return ""
    action = msg.WhichOneof("action")
    return msg.place.workload_id if action == "place" else msg.release.workload_id if action == "release" else ""


def _status_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError):
        return f"{exc.status} {exc.reason}"


def _conflicting_fields(exc: ApiException) -> set[str]:
    """The fields a server-side apply conflict names (``details.causes[].field``)."""
    try:
        causes = json.loads(exc.body).get("details", {}).get("causes") or []
    except (TypeError, ValueError):
        return set()
    return {c.get("field", "") for c in causes if c.get("reason") == "FieldManagerConflict"}
