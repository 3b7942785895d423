"""The scheduler extender: the stock kube-scheduler binary, configured to call Meridian's endpoint,
places pods the way Meridian ranks nodes, and Meridian's device-by-device GPU filter applies.

The extender's state comes from the same informers as the secondary scheduler's (running under the
ServiceAccount and ClusterRole of ``deploy/regional-scheduler.yaml``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from meridian.envtest import ControlPlane, wait_for
from regional_scheduler import kube_objects as ko
from regional_scheduler.extender import ExtenderServer
from regional_scheduler.kube_scheduler import KubernetesScheduler, KubeSchedulerSettings, api_client_from
from regional_scheduler.service import RegionalScheduler
from tests.kube_helpers import ready_nodes

pytestmark = pytest.mark.kubernetes

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "regional-scheduler.yaml"
EXTENDER_MANIFEST = MANIFEST.with_name("regional-scheduler-extender.yaml")


@pytest.fixture(scope="module")
def extender(kube_control_plane: ControlPlane) -> Iterator[tuple[ExtenderServer, RegionalScheduler]]:
    kube_control_plane.apply_rbac(MANIFEST)
    kubeconfig = kube_control_plane.service_account_kubeconfig("meridian-system", "meridian-regional-scheduler")
    service = RegionalScheduler(cluster="test", policy="best-fit")
    runner = KubernetesScheduler(api=api_client_from(str(kubeconfig)), service=service,
                                 settings=KubeSchedulerSettings(leader_elect=False, kube_api_qps=0))
    runner.start_informers()
    assert runner.wait_synced(30)
    server = ExtenderServer(("127.0.0.1", 0), service).start()
    yield server, service
    server.stop()
    runner.stop.set()
    runner.shutdown()


def _config(url: str, profiles: list[str]) -> dict[str, Any]:
    """deploy/'s KubeSchedulerConfiguration, pointed at this test's extender, API server and profiles."""
    (cm,) = [d for d in yaml.safe_load_all(EXTENDER_MANIFEST.read_text()) if d and d["kind"] == "ConfigMap"]
    config = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    (ext,) = config["extenders"]
    ext["urlPrefix"] = url
    ext["httpTimeout"] = "5s"  # this machine is shared and slow; the deployed 2 s is for a real cluster
    config["profiles"] = [{"schedulerName": name} for name in profiles]
    config.pop("clientConnection", None)
    config.pop("leaderElection", None)
    return config


def _pod(name: str, scheduler: str, *, cpu: str = "1", selector: dict[str, str] | None = None,
         extra: dict[str, str] | None = None, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": cpu, "memory": "256Mi", **(extra or {})},
                                      **({"limits": dict(extra)} if extra else {})}}]}
    if selector:
        spec["nodeSelector"] = selector
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _node(name: str, pair: str, **capacity: str) -> dict[str, Any]:
    return {"name": name, "labels": {"meridian.test/pair": pair}, "capacity": {"cpu": "8", "memory": "16Gi",
                                                                               **capacity}}


def test_kube_scheduler_with_the_extender_follows_meridians_ranking(
        kube_control_plane: ControlPlane, kube_api: client.ApiClient, kube_namespace: str,
        extender: tuple[ExtenderServer, RegionalScheduler]) -> None:
    server, service = extender
    core = client.CoreV1Api(kube_api)
    ns = kube_namespace
    tag = ns[-6:]
    # Two identical pairs: in each, one node is mostly allocated and one is empty. kube-scheduler's
    # default scoring (LeastAllocated + BalancedAllocation) prefers the empty node; Meridian's
    # best-fit prefers the busy one, where the pod fits tightest.
    specs = [_node(f"busy1-{tag}", "1"), _node(f"idle1-{tag}", "1"), _node(f"busy2-{tag}", "2"),
             _node(f"idle2-{tag}", "2")]
    plain = kube_control_plane.start_kube_scheduler({"profiles": [{"schedulerName": "plain"}]})
    with_meridian = kube_control_plane.start_kube_scheduler(_config(server.url, ["with-meridian"]))
    try:
        with ready_nodes(kube_api, specs) as (names, _):
            busy1, idle1, busy2, idle2 = names
            core.create_namespaced_pod(ns, _pod("load1", "nobody", cpu="6", node=busy1))
            core.create_namespaced_pod(ns, _pod("load2", "nobody", cpu="6", node=busy2))
            wait_for(lambda: service.counts()["pods"] >= 2 and service.counts()["nodes"] >= 4, timeout=20,
                     message="the extender's informers to see the loaded nodes")
            ranking = service.evaluate(ko.pod_from_api(_pod("probe", "x")), [busy2, idle2]).scores
            assert ranking[busy2] > ranking[idle2], "best-fit ranks the busy node first"

            core.create_namespaced_pod(ns, _pod("default-choice", "plain", selector={"meridian.test/pair": "1"}))
            core.create_namespaced_pod(ns, _pod("meridian-choice", "with-meridian",
                                                selector={"meridian.test/pair": "2"}))
            where = {name: wait_for(lambda n=name: core.read_namespaced_pod(n, ns).spec.node_name, timeout=30,
                                    message=f"{name} bound") for name in ("default-choice", "meridian-choice")}
            assert where["default-choice"] == idle1  # kube-scheduler alone spreads
            assert where["meridian-choice"] == busy2  # with the extender, Meridian's pick
    finally:
        kube_control_plane.stop_process(plain)
        kube_control_plane.stop_process(with_meridian)


def test_the_extender_filters_gpu_shares_device_by_device(
        kube_control_plane: ControlPlane, kube_api: client.ApiClient, kube_namespace: str,
        extender: tuple[ExtenderServer, RegionalScheduler]) -> None:
    server, service = extender
    core = client.CoreV1Api(kube_api)
    ns = kube_namespace
    gpu = _node(f"gpu-{ns[-6:]}", "gpu", **{ko.GPU_RESOURCE: "2", ko.GPU_SHARE_RESOURCE: "2000"})
    sched = kube_control_plane.start_kube_scheduler(_config(server.url, ["with-meridian"]))
    try:
        with ready_nodes(kube_api, [gpu]):
            wait_for(lambda: service.counts()["nodes"] >= 1 and gpu["name"] in service.state.index, timeout=20,
                     message="the GPU node in the extender's state")
            # Three 600-milli shares: the node's pool (2000) holds all three, its two devices only two.
            for i in range(3):
                core.create_namespaced_pod(ns, _pod(f"share{i}", "with-meridian", cpu="100m",
                                                    selector={"meridian.test/pair": "gpu"},
                                                    extra={ko.GPU_SHARE_RESOURCE: "600"}))
                wait_for(lambda i=i: core.read_namespaced_pod(f"share{i}", ns).spec.node_name or
                         any(c.type == "PodScheduled" and c.status == "False"
                             for c in core.read_namespaced_pod(f"share{i}", ns).status.conditions or []),
                         timeout=30, message=f"share{i} decided")
                # the extender must see the binding before the next pod's decision
                wait_for(lambda i=i: service.counts()["pods"] >= min(i + 1, 2) or i == 2, timeout=20,
                         message="binding seen")
            pods = core.list_namespaced_pod(ns).items
            assert sum(1 for p in pods if p.spec.node_name) == 2
            stuck = next(p for p in pods if not p.spec.node_name)
            condition = next(c for c in stuck.status.conditions if c.type == "PodScheduled")
            assert f"Insufficient {ko.GPU_SHARE_RESOURCE}" in condition.message
    finally:
        kube_control_plane.stop_process(sched)


def test_the_extender_answers_both_node_list_shapes(
        kube_api: client.ApiClient, extender: tuple[ExtenderServer, RegionalScheduler]) -> None:
    server, service = extender
    with ready_nodes(kube_api, [_node("shape-a", "shape"), _node("shape-b", "shape", cpu="1")]) as (names, _):
        wait_for(lambda: all(n in service.state.index for n in names), timeout=20, message="nodes seen")
        pod = _pod("p", "x", cpu="2")

        def post(verb: str, body: dict[str, Any]) -> Any:
            request = urllib.request.Request(f"{server.url}/{verb}", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as reply:
                return json.loads(reply.read())

        by_name = post("filter", {"pod": pod, "nodenames": names})
        assert by_name["nodenames"] == ["shape-a"] and "Insufficient cpu" in by_name["failedNodes"]["shape-b"]
        nodes = client.CoreV1Api(kube_api).list_node(label_selector="meridian.test/pair=shape")
        items = [kube_api.sanitize_for_serialization(n) for n in nodes.items]
        full = post("filter", {"pod": pod, "nodes": {"items": items}})
        assert [n["metadata"]["name"] for n in full["nodes"]["items"]] == ["shape-a"]
        priorities = post("prioritize", {"pod": pod, "nodenames": names})
        assert {p["host"] for p in priorities} == set(names)
        assert all(0 <= p["score"] <= 10 for p in priorities)


def test_bad_extender_requests_get_a_clear_error(extender: tuple[ExtenderServer, RegionalScheduler]) -> None:
    server, _ = extender
    request = urllib.request.Request(f"{server.url}/filter", data=b"not json")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 400 and "ExtenderArgs" in json.loads(err.value.read())["error"]
