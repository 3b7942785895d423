"""Dispatch into a real member cluster (``regional_scheduler.kube_dispatch``) on a real kube-apiserver with
kube-controller-manager (Deployments make ReplicaSets and Pods, Jobs make Pods) and Meridian's regional
scheduler binding the pods, over a real Redis. Outcomes are read back from the API server and from the
events stream, never from the worker's own state."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client

from meridian.bus import StreamBus, dispatch_stream, events_stream
from meridian.envtest import ControlPlane, free_port, wait_for
from protos import dispatch_pb2 as dpb
from regional_scheduler.kube_dispatch import (
    ATTEMPT_LABEL,
    GROUP,
    WORKLOAD_LABEL,
    ApiServerUnavailableError,
    KubeDispatchSettings,
    KubeDispatchWorker,
    object_name,
)
from regional_scheduler.kube_scheduler import KubernetesScheduler, KubeSchedulerSettings, api_client_from
from regional_scheduler.service import RegionalScheduler
from tests.kube_helpers import NodeSpec, ready_nodes

pytestmark = pytest.mark.kubernetes
CLUSTER = "member-a"


@pytest.fixture
def bus(redis_bus: StreamBus) -> StreamBus:
    return redis_bus


@pytest.fixture(autouse=True)
def nothing_left(kube_api: client.ApiClient, kube_namespace: str) -> Iterator[None]:
    """Delete what a test dispatched, and wait until its pods are gone, before the next test: a Deployment
    left to the namespace's deletion keeps making pods for a while, and other tests' schedulers see them."""
    yield
    client.AppsV1Api(kube_api).delete_collection_namespaced_deployment(kube_namespace)
    client.BatchV1Api(kube_api).delete_collection_namespaced_job(kube_namespace, propagation_policy="Background")
    core = client.CoreV1Api(kube_api)

    def gone() -> bool:
        core.delete_collection_namespaced_pod(kube_namespace, grace_period_seconds=0)
        return not core.list_namespaced_pod(kube_namespace).items

    wait_for(gone, timeout=60)


@contextmanager
def scheduling(plane: ControlPlane) -> Iterator[KubernetesScheduler]:
    """Meridian's regional scheduler binding the pods that ask for it (as the member runs it)."""
    settings = KubeSchedulerSettings(leader_elect=False, kube_api_qps=0, initial_backoff_s=0.2, max_backoff_s=0.5)
    runner = KubernetesScheduler(api=api_client_from(str(plane.admin_kubeconfig)),
                                 service=RegionalScheduler(cluster=CLUSTER, policy="best-fit"), settings=settings)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop.set()
        thread.join(timeout=20)


def node_specs(count: int, cpu: str = "4", memory: str = "8Gi") -> list[NodeSpec]:
    run = uuid.uuid4().hex[:6]
    return [{"name": f"dispatch-{run}-{i}", "capacity": {"cpu": cpu, "memory": memory}} for i in range(count)]


def place(wid: str, attempt: int = 1, *, replicas: int = 2, kind: int = dpb.WORKLOAD_KIND_SERVICE,
          cpu_milli: int = 500) -> bytes:
    return dpb.DispatchMessage(cluster=CLUSTER, place=dpb.PlaceWorkload(
        workload_id=wid, attempt=attempt, name="web", tenant="shop/team-a", replicas=replicas, kind=kind,
        requests=dpb.ReplicaRequests(milli_cpu=cpu_milli, memory_bytes=256 * 2**20))).SerializeToString()


def release(wid: str, attempt: int) -> bytes:
    return dpb.DispatchMessage(cluster=CLUSTER, release=dpb.ReleaseWorkload(
        workload_id=wid, attempt=attempt, reason="cancelled by the operator")).SerializeToString()


def events(bus: StreamBus) -> list[dpb.PlacementEvent]:
    return [dpb.PlacementEvent.FromString(e.payload) for e in bus.read_range(events_stream(CLUSTER))]


def phases(bus: StreamBus, wid: str) -> list[int]:
    return [e.phase for e in events(bus) if e.workload_id == wid]


def pump(worker: KubeDispatchWorker, bus: StreamBus) -> None:
    """One round of what ``run`` does: apply what is queued, read status back, publish its events."""
    worker.poll_once(block_ms=1)
    out = worker.read_status()
    if out:
        bus.publish_many(events_stream(CLUSTER), out)


def objects(api: client.ApiClient, ns: str, wid: str) -> list[dict[str, Any]]:
    sel = f"{WORKLOAD_LABEL}={wid}"
    deps = json.loads(client.AppsV1Api(api).list_namespaced_deployment(ns, label_selector=sel,
                                                                      _preload_content=False).data)["items"]
    jobs = json.loads(client.BatchV1Api(api).list_namespaced_job(ns, label_selector=sel,
                                                                _preload_content=False).data)["items"]
    for kind, items in (("Deployment", deps), ("Job", jobs)):
        for o in items:
            o["kind"] = kind  # a list's items do not carry it
    return [o for o in deps + jobs if not o["metadata"].get("deletionTimestamp")]


def live_pods(api: client.ApiClient, ns: str, wid: str) -> list[Any]:
    return client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"{WORKLOAD_LABEL}={wid}").items


def worker_for(bus: StreamBus, kube_api: client.ApiClient, ns: str, /, **overrides: Any) -> KubeDispatchWorker:
    settings = KubeDispatchSettings(namespace=ns, termination_grace_period_s=0, status_interval_s=0.2, **overrides)
    bus.ensure_group(dispatch_stream(CLUSTER), GROUP, start_id="0")
    return KubeDispatchWorker(bus=bus, api=kube_api, cluster=CLUSTER, settings=settings)


def test_a_service_becomes_a_deployment_whose_pods_are_bound_and_a_repeat_creates_nothing(
        kube_control_plane: ControlPlane, kube_api: client.ApiClient, kube_namespace: str, bus: StreamBus) -> None:
    worker = worker_for(bus, kube_api, kube_namespace)
    wid = "0123456789abcdef0123456789abcdef"
    with ready_nodes(kube_api, node_specs(2)), scheduling(kube_control_plane):
        bus.publish(dispatch_stream(CLUSTER), place(wid))
        pump(worker, bus)
        [dep] = objects(kube_api, kube_namespace, wid)
        assert dep["kind"] == "Deployment" and dep["metadata"]["name"] == object_name(
            dpb.DispatchMessage.FromString(place(wid)).place)
        assert dep["metadata"]["labels"][WORKLOAD_LABEL] == wid and dep["metadata"]["labels"][ATTEMPT_LABEL] == "1"
        assert {m["manager"] for m in dep["metadata"]["managedFields"] if m["operation"] == "Apply"} == {"meridian"}
        template = dep["spec"]["template"]
        assert template["spec"]["schedulerName"] == "meridian" and dep["spec"]["replicas"] == 2
        assert template["metadata"]["labels"] == {WORKLOAD_LABEL: wid, ATTEMPT_LABEL: "1"}
        assert template["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": str(256 * 2**20)}

        def scheduled() -> dpb.PlacementEvent | None:
            pump(worker, bus)
            return next((e for e in events(bus) if e.workload_id == wid
                         and e.phase == dpb.PLACEMENT_PHASE_SCHEDULED), None)

        event = wait_for(scheduled, timeout=60)
        bound = sorted(p.spec.node_name for p in live_pods(kube_api, kube_namespace, wid))
        assert len(bound) == 2 and all(bound) and sorted(event.nodes) == bound and event.attempt == 1

        # The same attempt again (a redelivery, the global reconciliation): nothing new, the spec unwritten
        # (the generation counts spec writes; the controllers' status updates do not move it).
        def applied(obj: dict[str, Any]) -> list[str]:
            return [m["time"] for m in obj["metadata"]["managedFields"] if m["manager"] == "meridian"]

        bus.publish(dispatch_stream(CLUSTER), place(wid))
        pump(worker, bus)
        [again] = objects(kube_api, kube_namespace, wid)
        assert again["metadata"]["uid"] == dep["metadata"]["uid"] and again["metadata"]["generation"] == 1
        assert applied(again) == applied(dep)
        assert len(live_pods(kube_api, kube_namespace, wid)) == 2
        assert [h.workload for h in worker.holdings() or []] == [wid]

        # Release (cancel): the Deployment goes, the garbage collector takes its ReplicaSet and Pods.
        bus.publish(dispatch_stream(CLUSTER), release(wid, 1))
        pump(worker, bus)
        assert objects(kube_api, kube_namespace, wid) == []
        wait_for(lambda: not live_pods(kube_api, kube_namespace, wid), timeout=60)
        assert phases(bus, wid)[-1] == dpb.PLACEMENT_PHASE_RELEASED
    assert bus.pending(dispatch_stream(CLUSTER), GROUP) == 0


def test_batch_work_becomes_a_job_and_a_new_attempt_replaces_the_old_one(
        kube_control_plane: ControlPlane, kube_api: client.ApiClient, kube_namespace: str, bus: StreamBus) -> None:
    worker = worker_for(bus, kube_api, kube_namespace)
    wid = "fedcba9876543210fedcba9876543210"
    with ready_nodes(kube_api, node_specs(1)), scheduling(kube_control_plane):
        bus.publish(dispatch_stream(CLUSTER), place(wid, kind=dpb.WORKLOAD_KIND_BATCH, replicas=3))
        pump(worker, bus)
        [job] = objects(kube_api, kube_namespace, wid)
        assert job["kind"] == "Job" and job["spec"]["parallelism"] == job["spec"]["completions"] == 3
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"

        def scheduled(attempt: int) -> bool:
            pump(worker, bus)
            return any(e.workload_id == wid and e.attempt == attempt and e.phase == dpb.PLACEMENT_PHASE_SCHEDULED
                       for e in events(bus))

        wait_for(lambda: scheduled(1), timeout=60)
        # Attempt 2 routed here (failback after a reroute): the attempt-1 Job is removed, one Job remains.
        bus.publish(dispatch_stream(CLUSTER), place(wid, attempt=2, kind=dpb.WORKLOAD_KIND_BATCH, replicas=3))
        pump(worker, bus)
        [job2] = objects(kube_api, kube_namespace, wid)
        assert job2["metadata"]["labels"][ATTEMPT_LABEL] == "2"
        wait_for(lambda: scheduled(2), timeout=60)
        wait_for(lambda: {p.metadata.labels[ATTEMPT_LABEL] for p in live_pods(kube_api, kube_namespace, wid)}
                 == {"2"}, timeout=60)
        # A re-published place of attempt 1 that arrives after attempt 2 (overtaken by the reroute) is stale:
        # it neither removes attempt 2 nor brings attempt 1 back.
        bus.publish(dispatch_stream(CLUSTER), place(wid, attempt=1, kind=dpb.WORKLOAD_KIND_BATCH, replicas=3))
        pump(worker, bus)
        assert [o["metadata"]["labels"][ATTEMPT_LABEL] for o in objects(kube_api, kube_namespace, wid)] == ["2"]


def test_replicas_an_autoscaler_set_survive_a_repeated_dispatch(
        kube_api: client.ApiClient, kube_namespace: str, bus: StreamBus) -> None:
    worker = worker_for(bus, kube_api, kube_namespace)
    wid = "aaaaaaaaaabbbbbbbbbbcccccccccc00"
    bus.publish(dispatch_stream(CLUSTER), place(wid, replicas=2))
    pump(worker, bus)
    [dep] = objects(kube_api, kube_namespace, wid)
    apps = client.AppsV1Api(kube_api)
    name = dep["metadata"]["name"]
    apps.replace_namespaced_deployment_scale(name, kube_namespace,
                                             {"metadata": {"name": name, "namespace": kube_namespace},
                                              "spec": {"replicas": 5}}, field_manager="meridian-autoscaler")
    bus.publish(dispatch_stream(CLUSTER), place(wid, replicas=2))
    pump(worker, bus)
    [after] = objects(kube_api, kube_namespace, wid)
    assert after["spec"]["replicas"] == 5
    assert bus.pending(dispatch_stream(CLUSTER), GROUP) == 0


def test_unplaceable_replicas_wait_with_the_schedulers_reason_then_fail_here(
        kube_control_plane: ControlPlane, kube_api: client.ApiClient, kube_namespace: str, bus: StreamBus) -> None:
    worker = worker_for(bus, kube_api, kube_namespace, unschedulable_grace_s=3.0)
    wid = "99999999998888888888777777777766"
    with ready_nodes(kube_api, node_specs(1, "1", "1Gi")), scheduling(kube_control_plane):
        bus.publish(dispatch_stream(CLUSTER), place(wid, replicas=1, cpu_milli=64_000))
        pump(worker, bus)

        def failed() -> dpb.PlacementEvent | None:
            pump(worker, bus)
            return next((e for e in events(bus) if e.workload_id == wid and e.phase == dpb.PLACEMENT_PHASE_FAILED),
                        None)

        event = wait_for(failed, timeout=60)
    waiting = [e for e in events(bus) if e.workload_id == wid and e.phase == dpb.PLACEMENT_PHASE_WAITING]
    assert waiting and "0/1 replicas placed" in waiting[0].reason
    assert "unschedulable for" in event.reason and "cpu" in event.reason.lower()
    assert phases(bus, wid).count(dpb.PLACEMENT_PHASE_FAILED) == 1  # reported once, however long it stays


def test_an_api_server_that_does_not_answer_loses_no_dispatch(
        kube_api: client.ApiClient, kube_namespace: str, bus: StreamBus) -> None:
    silent = client.ApiClient(client.Configuration(host=f"https://127.0.0.1:{free_port()}"))
    wid = "1111111111222222222233333333334a"
    dead = worker_for(bus, silent, kube_namespace, api_silence_s=0.01, request_timeout_s=2.0)
    bus.publish(dispatch_stream(CLUSTER), place(wid))
    with pytest.raises(ApiServerUnavailableError):
        dead.poll_once(block_ms=1)
    assert bus.pending(dispatch_stream(CLUSTER), GROUP) == 1  # not acknowledged
    assert not dead.answering() and dead.holdings() is None
    with pytest.raises(ApiServerUnavailableError):
        dead.poll_once(block_ms=1)  # tried again, still there
    # A worker of a restarted regional scheduler, the API server answering: it claims the entry the silent
    # one read and never acknowledged (XAUTOCLAIM), applies it, then acknowledges it.
    back = worker_for(bus, kube_api, kube_namespace, bus={"claim_idle_ms": 1000})
    wait_for(lambda: back.poll_once(block_ms=50) == 1, timeout=30)
    assert bus.pending(dispatch_stream(CLUSTER), GROUP) == 0
    assert len(objects(kube_api, kube_namespace, wid)) == 1
    assert back.answering()
