"""Meridian as a secondary scheduler on a real kube-apiserver (RBAC on), running under its own
ServiceAccount and the ClusterRole of ``deploy/regional-scheduler.yaml``.

Each test makes its own Nodes (labelled with a run id, deleted afterwards) and namespace, runs the
scheduler in a thread (or, for leader election, as ``meridian regional-scheduler`` processes), and
checks the outcome by reading Pods, Nodes and Events back from the API server, never from the
scheduler's own state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from meridian import quantity
from meridian.envtest import ControlPlane, wait_for
from regional_scheduler import kube_objects as ko
from regional_scheduler.binders.base import BindConflictError, BindRequest, PodGoneError
from regional_scheduler.binders.kubernetes import KubernetesBinder
from regional_scheduler.kube_scheduler import KubernetesScheduler, KubeSchedulerSettings, api_client_from
from regional_scheduler.service import RegionalScheduler
from tests.kube_helpers import ready_nodes

pytestmark = pytest.mark.kubernetes

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "regional-scheduler.yaml"
SA_NAMESPACE, SA_NAME = "meridian-system", "meridian-regional-scheduler"


@pytest.fixture(scope="module")
def scheduler_kubeconfig(kube_control_plane: ControlPlane) -> Path:
    """Credentials of the regional scheduler's own ServiceAccount, bound to its ClusterRole from deploy/."""
    kube_control_plane.apply_rbac(MANIFEST)
    return kube_control_plane.service_account_kubeconfig(SA_NAMESPACE, SA_NAME)


@contextmanager
def running_scheduler(kubeconfig: Path, **overrides: Any) -> Iterator[KubernetesScheduler]:
    settings = KubeSchedulerSettings(**{"leader_elect": False, "kube_api_qps": 0, "initial_backoff_s": 0.2,
                                        "max_backoff_s": 1.0, **overrides})
    service = RegionalScheduler(cluster=settings.cluster, policy=settings.policy)
    runner = KubernetesScheduler(api=api_client_from(str(kubeconfig)), service=service, settings=settings)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop.set()
        thread.join(timeout=20)
        assert not thread.is_alive(), "the scheduler did not stop"


def pod_body(name: str, *, cpu: str = "1", memory: str = "1Gi", extra: dict[str, str] | None = None,
             spec: dict[str, Any] | None = None, scheduler: str = "meridian") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": cpu, "memory": memory, **(extra or {})},
                                                   # extended resources cannot be over-committed: limit = request
                                                   **({"limits": dict(extra)} if extra else {})}}],
                     **(spec or {})}}


def pods_of(core: client.CoreV1Api, namespace: str) -> list[Any]:
    return core.list_namespaced_pod(namespace).items


def failed_scheduling(core: client.CoreV1Api, namespace: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for event in core.list_namespaced_event(namespace).items:
        if event.reason == "FailedScheduling":
            out.setdefault(event.involved_object.name, []).append(event.message)
    return out


def settled(core: client.CoreV1Api, namespace: str) -> bool:
    """Every pod is bound or has a FailedScheduling event."""
    events = failed_scheduling(core, namespace)
    return all(p.spec.node_name or p.metadata.name in events for p in pods_of(core, namespace))


def assert_no_overcommit(core: client.CoreV1Api, node_names: list[str]) -> None:
    """Independent read-back: per node, the requests of every bound pod fit its allocatable."""
    pods = core.list_pod_for_all_namespaces().items
    for name in node_names:
        node = core.read_node(name)
        alloc = node.status.allocatable
        used_cpu = used_mem = 0
        count = 0
        for p in pods:
            if p.spec.node_name != name:
                continue
            count += 1
            for c in p.spec.containers:
                req = (c.resources.requests or {}) if c.resources else {}
                used_cpu += quantity.to_milli(req.get("cpu", 0))
                used_mem += quantity.to_int(req.get("memory", 0))
        assert used_cpu <= quantity.to_milli(alloc["cpu"]), f"node {name}: cpu over-committed"
        assert used_mem <= quantity.to_int(alloc["memory"]), f"node {name}: memory over-committed"
        assert count <= int(alloc["pods"]), f"node {name}: too many pods"


def test_pending_pods_end_bound_or_with_a_failed_scheduling_event(
        kube_api: client.ApiClient, kube_namespace: str, scheduler_kubeconfig: Path) -> None:
    core = client.CoreV1Api(kube_api)
    specs = [{"name": f"ok-{kube_namespace[-6:]}", "capacity": {"cpu": "4", "memory": "8Gi"}},
             {"name": f"tainted-{kube_namespace[-6:]}", "capacity": {"cpu": "4", "memory": "8Gi"},
              "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}]
    with ready_nodes(kube_api, specs) as (names, _):
        cordoned = f"cordoned-{kube_namespace[-6:]}"
        with ready_nodes(kube_api, [{"name": cordoned, "capacity": {"cpu": "4", "memory": "8Gi"}}]) as (more, _):
            core.patch_node(cordoned, {"spec": {"unschedulable": True}})
            for i in range(6):  # 6 × 1.5 CPU: two fit on the one usable node (4 CPU)
                core.create_namespaced_pod(kube_namespace, pod_body(f"p{i}", cpu="1500m"))
            with running_scheduler(scheduler_kubeconfig):
                wait_for(lambda: settled(core, kube_namespace), timeout=30, message="every pod bound or failed")
            pods = pods_of(core, kube_namespace)
            bound = [p for p in pods if p.spec.node_name]
            assert len(bound) == 2 and {p.spec.node_name for p in bound} == {names[0]}
            for p in bound:  # kube-scheduler's PodScheduled condition is set by the API server on binding
                assert any(c.type == "PodScheduled" and c.status == "True" for c in p.status.conditions)
            events = failed_scheduling(core, kube_namespace)
            assert set(events) == {p.metadata.name for p in pods if not p.spec.node_name}
            message = next(iter(events.values()))[0]
            # Other tests' nodes may exist on this API server; ours are charged one reason each.
            assert "1 node(s) had untolerated taint {dedicated: gpu}" in message
            assert "1 node(s) were unschedulable" in message
            assert "1 Insufficient cpu" in message
            assert message.startswith("0/") and message.endswith(".")
            unbound = next(p for p in pods if not p.spec.node_name)
            condition = next(c for c in unbound.status.conditions if c.type == "PodScheduled")
            assert (condition.status, condition.reason) == ("False", "Unschedulable")
            assert "Insufficient cpu" in condition.message
            assert_no_overcommit(core, names + more)


def test_pods_bound_by_another_scheduler_count_in_allocation(
        kube_api: client.ApiClient, kube_namespace: str, scheduler_kubeconfig: Path) -> None:
    core = client.CoreV1Api(kube_api)
    specs = [{"name": f"a-{kube_namespace[-6:]}", "capacity": {"cpu": "4", "memory": "8Gi"}},
             {"name": f"b-{kube_namespace[-6:]}", "capacity": {"cpu": "4", "memory": "8Gi"}}]
    with ready_nodes(kube_api, specs) as (names, _):
        # Another scheduler (here: the pod's own nodeName) already took 3 of node a's 4 CPUs.
        other = pod_body("other", cpu="3", scheduler="default-scheduler")
        other["spec"]["nodeName"] = names[0]
        core.create_namespaced_pod(kube_namespace, other)
        for i in range(3):  # 3 × 2 CPU: node b takes two, node a has 1 CPU left, the third fits nowhere
            core.create_namespaced_pod(kube_namespace, pod_body(f"m{i}", cpu="2"))
        with running_scheduler(scheduler_kubeconfig):
            wait_for(lambda: settled(core, kube_namespace), timeout=30, message="pods settled")
        mine = [p for p in pods_of(core, kube_namespace) if p.metadata.name.startswith("m")]
        assert sorted(p.spec.node_name or "" for p in mine) == ["", names[1], names[1]]
        assert_no_overcommit(core, names)


def test_an_unschedulable_pod_is_retried_when_a_node_is_added_not_in_a_loop(
        kube_api: client.ApiClient, kube_namespace: str, scheduler_kubeconfig: Path) -> None:
    core = client.CoreV1Api(kube_api)
    small = [{"name": f"small-{kube_namespace[-6:]}", "capacity": {"cpu": "2", "memory": "4Gi"}}]
    with ready_nodes(kube_api, small), running_scheduler(scheduler_kubeconfig):
        core.create_namespaced_pod(kube_namespace, pod_body("big", cpu="6"))
        wait_for(lambda: failed_scheduling(core, kube_namespace).get("big"), timeout=20, message="FailedScheduling")
        time.sleep(3.0)  # the window itself is tested: a busy loop would post an event per attempt in it
        assert len(failed_scheduling(core, kube_namespace)["big"]) <= 2
        big = [{"name": f"big-{kube_namespace[-6:]}", "capacity": {"cpu": "8", "memory": "16Gi"}}]
        with ready_nodes(kube_api, big) as (names, _):
            node = wait_for(lambda: core.read_namespaced_pod("big", kube_namespace).spec.node_name, timeout=20,
                            message="the pod bound once a node that fits exists")
            assert node == names[0]


def test_a_pod_using_a_feature_meridian_does_not_implement_gets_an_event_naming_it(
        kube_api: client.ApiClient, kube_namespace: str, scheduler_kubeconfig: Path) -> None:
    core = client.CoreV1Api(kube_api)
    anti = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}}
    with ready_nodes(kube_api, [{"name": f"n-{kube_namespace[-6:]}", "capacity": {"cpu": "4", "memory": "8Gi"}}]), \
            running_scheduler(scheduler_kubeconfig):
        core.create_namespaced_pod(kube_namespace, pod_body("anti", spec=anti))
        messages = wait_for(lambda: failed_scheduling(core, kube_namespace).get("anti"), timeout=20,
                            message="an event for the refused pod")
        assert "pod anti-affinity" in messages[0]
        assert core.read_namespaced_pod("anti", kube_namespace).spec.node_name is None


def test_gpu_shares_are_placed_device_by_device_and_recorded_on_the_pod(
        kube_api: client.ApiClient, kube_namespace: str, scheduler_kubeconfig: Path) -> None:
    core = client.CoreV1Api(kube_api)
    gpu_node = {"name": f"gpu-{kube_namespace[-6:]}", "labels": {ko.GPU_MODEL_LABEL: "A100"},
                "capacity": {"cpu": "16", "memory": "64Gi", ko.GPU_RESOURCE: "1", ko.GPU_SHARE_RESOURCE: "1000"}}
    with ready_nodes(kube_api, [gpu_node]) as (names, _), running_scheduler(scheduler_kubeconfig):
        # Two 600-milli shares: the node's pool (1000) could count both, its one device cannot.
        for i in range(2):
            core.create_namespaced_pod(kube_namespace, pod_body(f"share{i}", extra={ko.GPU_SHARE_RESOURCE: "600"}))
        wait_for(lambda: settled(core, kube_namespace), timeout=30, message="shares settled")
        pods = pods_of(core, kube_namespace)
        bound = [p for p in pods if p.spec.node_name]
        assert len(bound) == 1 and bound[0].spec.node_name == names[0]
        assert bound[0].metadata.annotations[ko.GPU_DEVICES_ANNOTATION] == "0"
        (messages,) = failed_scheduling(core, kube_namespace).values()
        assert f"Insufficient {ko.GPU_SHARE_RESOURCE}" in messages[0]


def test_binding_subresource_quirk_of_the_official_client_is_pinned(
        kube_api: client.ApiClient, kube_namespace: str, scheduler_kubeconfig: Path) -> None:
    """``create_namespaced_pod_binding`` binds, then raises decoding the server's Status reply; the
    binder recognises success by the HTTP status and still reports real errors."""
    core = client.CoreV1Api(kube_api)
    with ready_nodes(kube_api, [{"name": f"q-{kube_namespace[-6:]}", "capacity": {"cpu": "4", "memory": "8Gi"}}]
                     ) as (names, _):
        for name in ("plain", "binder"):
            core.create_namespaced_pod(kube_namespace, pod_body(name, scheduler="nobody"))
        body = client.V1Binding(metadata=client.V1ObjectMeta(name="plain"),
                                target=client.V1ObjectReference(api_version="v1", kind="Node", name=names[0]))
        with pytest.raises(ValueError):
            core.create_namespaced_pod_binding("plain", kube_namespace, body)
        assert core.read_namespaced_pod("plain", kube_namespace).spec.node_name == names[0]  # yet it was applied

        binder = KubernetesBinder(api_client_from(str(scheduler_kubeconfig)))
        uid = core.read_namespaced_pod("binder", kube_namespace).metadata.uid
        request = BindRequest(namespace=kube_namespace, name="binder", uid=uid, node=names[0])
        binder.bind(request)  # no exception: success recognised
        assert core.read_namespaced_pod("binder", kube_namespace).spec.node_name == names[0]
        with pytest.raises(BindConflictError):  # bound already: 409, reconciled by the caller, not retried
            binder.bind(request)
        with pytest.raises(PodGoneError):
            binder.bind(BindRequest(namespace=kube_namespace, name="missing", uid="x", node=names[0]))


def _lease_holder(core_api: client.ApiClient, lease_name: str) -> str:
    try:
        lease = client.CoordinationV1Api(core_api).read_namespaced_lease(lease_name, SA_NAMESPACE)
    except ApiException:
        return ""
    return lease.spec.holder_identity or ""


def _start_replica(kubeconfig: Path, identity: str, log: Path, lease_name: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MERIDIAN_METRICS_PORT": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "regional_scheduler.kube_cli", "--kubeconfig", str(kubeconfig),
         "--identity", identity, "--lease-name", lease_name, "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5",
         "--kube-api-qps", "40", "--kube-api-burst", "20", "--policy", "best-fit"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


@pytest.mark.slow
def test_killing_the_leader_under_a_backlog_hands_over_within_the_lease(
        kube_api: client.ApiClient, kube_namespace: str, scheduler_kubeconfig: Path, tmp_path: Path) -> None:
    core = client.CoreV1Api(kube_api)
    lease = f"meridian-test-{kube_namespace[-10:]}"  # its own Lease: never a real deployment's
    n_pods = 300
    specs = [{"name": f"le{i}-{kube_namespace[-6:]}", "capacity": {"cpu": "32", "memory": "64Gi"}} for i in range(4)]
    with ready_nodes(kube_api, specs) as (names, _):
        for i in range(n_pods):
            core.create_namespaced_pod(kube_namespace, pod_body(f"w{i}", cpu="300m", memory="128Mi"))
        replicas = {ident: _start_replica(scheduler_kubeconfig, ident, tmp_path / f"{ident}.log", lease)
                    for ident in ("replica-a", "replica-b")}
        try:
            leader = wait_for(lambda: _lease_holder(kube_api, lease), timeout=30, message="a leader")
            wait_for(lambda: sum(1 for p in pods_of(core, kube_namespace) if p.spec.node_name) >= 40, timeout=60,
                     message="the leader binding part of the backlog")
            replicas[leader].send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            standby = next(i for i in replicas if i != leader)
            wait_for(lambda: _lease_holder(kube_api, lease) == standby, timeout=20,
                     message="the standby taking the lease")
            takeover_s = time.monotonic() - killed_at
            wait_for(lambda: all(p.spec.node_name for p in pods_of(core, kube_namespace)), timeout=120,
                     message="the whole backlog bound")
            # Within the lease duration (4 s) plus one retry period of the standby and the poll above.
            assert takeover_s < 4 + 0.5 + 2.0, f"takeover took {takeover_s:.1f} s"
            pods = pods_of(core, kube_namespace)
            assert len(pods) == n_pods and all(p.spec.node_name for p in pods)
            assert_no_overcommit(core, names)
            # A clean stop (SIGTERM) releases the Lease at once.
            replicas[standby].send_signal(signal.SIGTERM)
            assert replicas[standby].wait(timeout=30) == 0
            assert _lease_holder(kube_api, lease) == ""
        finally:
            for proc in replicas.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
        log = (tmp_path / f"{standby}.log").read_text()
        assert "Traceback" not in log, log[-2000:]


def test_node_telemetry_joins_the_api_servers_allocation_in_one_state_and_summary(
        kube_api: client.ApiClient, kube_namespace: str, scheduler_kubeconfig: Path, redis_url: str,
        key_prefix: str) -> None:
    """One cluster state: allocation from the informers (a pod bound by anyone), power and carbon from
    the node agents' reports on Redis, and the summary the global tier routes on built from both."""
    from meridian.bus import SUMMARY_STREAM, RedisStreamBus, telemetry_stream
    from protos import telemetry_pb2 as tpb
    from regional_scheduler.summary_publisher import RegionalTelemetry, SummarySettings
    from regional_scheduler.telemetry_state import TelemetryConsumerSettings

    core = client.CoreV1Api(kube_api)
    name = f"tel-{kube_namespace[-6:]}"
    with ready_nodes(kube_api, [{"name": name, "capacity": {"cpu": "8", "memory": "16Gi"}}]), \
            running_scheduler(scheduler_kubeconfig, cluster="east") as runner:
        bus = RedisStreamBus(redis_url, key_prefix=key_prefix)
        telemetry = RegionalTelemetry(
            settings=TelemetryConsumerSettings(cluster="east", bus_url=redis_url, key_prefix=key_prefix,
                                               bus={"block_ms": 100}),
            summary=SummarySettings(region="eu-north", interval_s=0.1), bus=bus, scheduler=runner.service).start()
        try:
            core.create_namespaced_pod(kube_namespace, pod_body("web", cpu="3"))
            wait_for(lambda: core.read_namespaced_pod("web", kube_namespace).spec.node_name, timeout=20,
                     message="the pod bound")
            report = tpb.NodeTelemetry(cluster="east", node=name, sequence=1, allocatable_milli_cpu=8000,
                                       allocatable_memory_bytes=16 * 2**30, used_milli_cpu=1200,
                                       power_watts=250.0, carbon_g_per_kwh=40.0, pue=1.2)
            bus.publish(telemetry_stream("east"), report.SerializeToString())

            def summary() -> Any:
                latest = bus.read_latest(SUMMARY_STREAM)
                s = tpb.ClusterSummary.FromString(latest.payload) if latest else None
                return s if s is not None and s.reports_applied >= 1 else None

            s = wait_for(summary, timeout=20, message="a summary with the report applied")
            state = runner.service.state
            i = state.index[name]
            assert state.power_watts[i] == 250.0 and state.req_milli_cpu[i] == 3000
            assert (s.cluster, s.region) == ("east", "eu-north")
            assert s.power_watts == 250.0 and s.carbon_g_per_kwh == pytest.approx(40.0)
            assert s.requested.milli_cpu >= 3000  # from the API server, not from the report
        finally:
            telemetry.close()


def test_an_api_server_that_stops_answering_loses_no_pod_and_overcommits_nothing(
        kube_control_plane: ControlPlane, kube_api: client.ApiClient, kube_namespace: str,
        scheduler_kubeconfig: Path) -> None:
    """The API server is frozen (SIGSTOP) for longer than a request timeout while bindings are in
    flight: those bindings fail, their assumptions roll back, and once it answers again every pod
    ends bound exactly once within capacity."""
    if kube_control_plane.external:
        pytest.skip("freezing the API server needs the local control plane")
    core = client.CoreV1Api(kube_api)
    specs = [{"name": f"fz{i}-{kube_namespace[-6:]}", "capacity": {"cpu": "8", "memory": "16Gi"}} for i in range(3)]
    with ready_nodes(kube_api, specs) as (names, _):
        for i in range(60):  # 60 × 400m = 24 CPU: exactly the three nodes' 24
            core.create_namespaced_pod(kube_namespace, pod_body(f"f{i}", cpu="400m", memory="256Mi"))
        apiserver = kube_control_plane.processes["kube-apiserver"]
        with running_scheduler(scheduler_kubeconfig, kube_api_qps=20, kube_api_burst=5,
                               request_timeout_s=2.0) as runner:
            wait_for(lambda: sum(1 for p in pods_of(core, kube_namespace) if p.spec.node_name) >= 10, timeout=30,
                     message="part of the backlog bound")
            os.kill(apiserver.pid, signal.SIGSTOP)
            try:  # frozen until bindings in flight have failed (their 2 s request timeout), however long that takes
                wait_for(lambda: runner.errors_total >= 1, timeout=60, interval=0.1,
                         message="a binding to fail against the frozen API server")
            finally:
                os.kill(apiserver.pid, signal.SIGCONT)
            wait_for(lambda: all(p.spec.node_name for p in pods_of(core, kube_namespace)), timeout=90,
                     message="the whole backlog bound after the API server came back")
            assert runner.errors_total >= 1  # bindings did fail while it was frozen
        assert_no_overcommit(core, names)
        per_node = {n: 0 for n in names}
        for p in pods_of(core, kube_namespace):
            per_node[p.spec.node_name] += 1
        assert per_node == {n: 20 for n in names}  # full, and not one pod more


class _RacedBinder:
    """Another scheduler binds the pod a moment before Meridian's binding reaches the API server."""

    name = "raced"

    def __init__(self, admin: client.ApiClient, inner: KubernetesBinder, elsewhere: str) -> None:
        self.admin, self.inner, self.elsewhere = admin, inner, elsewhere
        self.racer_errors: list[Exception] = []

    def bind(self, request: BindRequest) -> None:
        from tests.kube_helpers import bind_pod

        try:  # the race itself is the test's, not Meridian's: whatever its client says, go on
            bind_pod(self.admin, request.namespace, request.name, self.elsewhere)
        except Exception as exc:
            self.racer_errors.append(exc)
        self.inner.bind(request)


def test_a_409_conflict_is_reconciled_from_the_informer_not_retried(
        kube_control_plane: ControlPlane, kube_api: client.ApiClient, kube_namespace: str,
        scheduler_kubeconfig: Path) -> None:
    from prometheus_client import REGISTRY

    core = client.CoreV1Api(kube_api)
    specs = [{"name": f"mine-{kube_namespace[-6:]}", "capacity": {"cpu": "4", "memory": "8Gi"}},
             {"name": f"theirs-{kube_namespace[-6:]}", "capacity": {"cpu": "4", "memory": "8Gi"},
              "taints": [{"key": "other-scheduler", "value": "only", "effect": "NoSchedule"}]}]
    with ready_nodes(kube_api, specs) as (names, _):
        settings = KubeSchedulerSettings(leader_elect=False, kube_api_qps=0, cluster="race")
        api = api_client_from(str(scheduler_kubeconfig))
        service = RegionalScheduler(cluster="race", policy="fgd")
        runner = KubernetesScheduler(api=api, service=service, settings=settings,
                                     binder=_RacedBinder(kube_control_plane.api_client(), KubernetesBinder(api),
                                                         names[1]))
        conflicts = REGISTRY.get_sample_value("meridian_regional_bind_conflicts_total", {"cluster": "race"}) or 0.0
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        try:
            core.create_namespaced_pod(kube_namespace, pod_body("raced", cpu="3"))
            wait_for(lambda: core.read_namespaced_pod("raced", kube_namespace).spec.node_name, timeout=20,
                     message="the pod bound")
            # Meridian's state follows where the pod really is: the other node, 3 CPU taken there.
            wait_for(lambda: service.state.req_milli_cpu[service.state.index[names[1]]] == 3000, timeout=10,
                     message="the informer's view of the winning binding")
            wait_for(lambda: service.state.req_milli_cpu[service.state.index[names[0]]] == 0, timeout=10,
                     message="the assumption rolled back")
            # the informer may report the winning binding before Meridian's binding thread reads its 409
            after = wait_for(lambda: REGISTRY.get_sample_value("meridian_regional_bind_conflicts_total",
                                                               {"cluster": "race"}), timeout=20,
                             message="Meridian's binding answered 409")
            assert after == conflicts + 1, f"the racer's client said {runner.binder.racer_errors}"
            assert runner.errors_total == 0 and runner.bound_total == 0  # reconciled, never retried
            assert core.read_namespaced_pod("raced", kube_namespace).spec.node_name == names[1]
        finally:
            runner.stop.set()
            thread.join(timeout=20)


def test_kube_scheduler_named_metrics_count_attempts(
        kube_api: client.ApiClient, kube_namespace: str, scheduler_kubeconfig: Path) -> None:
    from prometheus_client import REGISTRY

    def value(result: str) -> float:
        return REGISTRY.get_sample_value("scheduler_schedule_attempts_total",
                                         {"result": result, "profile": "meridian"}) or 0.0

    core = client.CoreV1Api(kube_api)
    before = {r: value(r) for r in ("scheduled", "unschedulable")}
    with ready_nodes(kube_api, [{"name": f"m-{kube_namespace[-6:]}", "capacity": {"cpu": "2", "memory": "4Gi"}}]), \
            running_scheduler(scheduler_kubeconfig):
        core.create_namespaced_pod(kube_namespace, pod_body("fits", cpu="1"))
        core.create_namespaced_pod(kube_namespace, pod_body("too-big", cpu="16"))
        wait_for(lambda: settled(core, kube_namespace), timeout=20, message="both decided")
        wait_for(lambda: value("scheduled") >= before["scheduled"] + 1, timeout=10, message="scheduled counted")
    assert value("unschedulable") >= before["unschedulable"] + 1
    assert REGISTRY.get_sample_value("scheduler_e2e_scheduling_duration_seconds_count",
                                     {"result": "scheduled", "profile": "meridian"}) >= 1
