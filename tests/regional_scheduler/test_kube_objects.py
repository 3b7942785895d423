"""Kubernetes Pod/Node JSON as Meridian's model: effective requests, constraints, refusals, GPUs, nodes."""

from __future__ import annotations

from typing import Any

import pytest

from meridian.model import GIB, MIB, NodeSelectorRequirement, NodeSelectorTerm, Taint, TaintEffect, Toleration
from regional_scheduler import kube_objects as ko


def _container(name: str = "main", *, restart_policy: str | None = None, ports: list[dict[str, Any]] | None = None,
               **requests: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10",
                         "resources": {"requests": {k.replace("_", "-"): v for k, v in requests.items()}}}
    if restart_policy:
        c["restartPolicy"] = restart_policy
    if ports:
        c["ports"] = ports
    return c


def _pod(spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    full_spec = {"containers": [_container()]}
    full_spec.update(spec or {})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", **meta}, "spec": full_spec}


def _node(name: str = "n1", *, allocatable: dict[str, str] | None = None, capacity: dict[str, str] | None = None,
          labels: dict[str, str] | None = None, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True"}]}
    if allocatable is not None:
        status["allocatable"] = allocatable
    if capacity is not None:
        status["capacity"] = capacity
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "spec": spec or {}, "status": status}


# ---------------------------------------------------------------------- effective requests


@pytest.mark.parametrize(
    ("spec", "milli_cpu", "memory_bytes", "scalar"),
    [
        pytest.param({"containers": [_container(cpu="500m", memory="1Gi")]}, 500, GIB, {"pods": 1},
                     id="one-container"),
        # 500m + 250m = 750m; 1Gi + 512Mi; ephemeral-storage 1Gi + 2Gi; example.com/fpga 1 + 2.
        pytest.param({"containers": [
            _container("a", cpu="500m", memory="1Gi", ephemeral_storage="1Gi", **{"example.com/fpga": "1"}),
            _container("b", cpu="250m", memory="512Mi", ephemeral_storage="2Gi", **{"example.com/fpga": "2"})]},
            750, GIB + 512 * MIB, {"pods": 1, "ephemeral-storage": 3 * GIB, "example.com/fpga": 3},
            id="containers-summed-incl-storage-and-extended"),
        pytest.param({"containers": [_container(cpu="1", memory="1G")]}, 1000, 10**9, {"pods": 1},
                     id="whole-cpu-decimal-memory"),
        pytest.param({"containers": [{"name": "empty", "image": "x"}]}, 0, 0, {"pods": 1},
                     id="no-requests-still-takes-a-pod-slot"),
        # containers 1 CPU / 1Gi; init containers 2 CPU / 256Mi and 500m / 2Gi:
        # cpu max(1000, 2000) = 2000; memory max(1Gi, 2Gi) = 2Gi (each resource's own maximum).
        pytest.param({"containers": [_container(cpu="1", memory="1Gi")],
                      "initContainers": [_container("i1", cpu="2", memory="256Mi"),
                                         _container("i2", cpu="500m", memory="2Gi")]},
                     2000, 2 * GIB, {"pods": 1}, id="init-max-per-resource"),
        # init 300m < containers 1 CPU: the containers' sum stands.
        pytest.param({"containers": [_container(cpu="1")], "initContainers": [_container("i", cpu="300m")]},
                     1000, 0, {"pods": 1}, id="small-init-ignored"),
        # sidecar 500m runs beside the containers: 1000 + 500 = 1500; no regular init container.
        pytest.param({"containers": [_container(cpu="1", memory="1Gi")],
                      "initContainers": [_container("proxy", restart_policy="Always", cpu="500m", memory="128Mi")]},
                     1500, GIB + 128 * MIB, {"pods": 1}, id="sidecar-added"),
        # sidecar 500m then init 2 CPU: the init runs beside the sidecar, 2000 + 500 = 2500 > 1000 + 500.
        pytest.param({"containers": [_container(cpu="1")],
                      "initContainers": [_container("proxy", restart_policy="Always", cpu="500m"),
                                         _container("migrate", cpu="2")]},
                     2500, 0, {"pods": 1}, id="init-after-sidecar-counts-it"),
        # init 2 CPU before the sidecar runs alone: max(2000, 1000 + 500) = 2000.
        pytest.param({"containers": [_container(cpu="1")],
                      "initContainers": [_container("migrate", cpu="2"),
                                         _container("proxy", restart_policy="Always", cpu="500m")]},
                     2000, 0, {"pods": 1}, id="init-before-sidecar-alone"),
        # restartPolicy other than Always is a regular init container: max(1000, 800) = 1000.
        pytest.param({"containers": [_container(cpu="1")],
                      "initContainers": [_container("i", restart_policy="OnFailure", cpu="800m")]},
                     1000, 0, {"pods": 1}, id="non-always-restart-policy-is-init"),
        # overhead added after the max: max(1000, 2000) + 250 = 2250; memory 0 + 64Mi.
        pytest.param({"containers": [_container(cpu="1")], "initContainers": [_container("i", cpu="2")],
                      "overhead": {"cpu": "250m", "memory": "64Mi"}},
                     2250, 64 * MIB, {"pods": 1}, id="overhead-added-after-max"),
    ],
)
def test_effective_requests(spec: dict[str, Any], milli_cpu: int, memory_bytes: int, scalar: dict[str, int]) -> None:
    pod = ko.pod_from_api(_pod(spec))
    assert pod.requests.milli_cpu == milli_cpu
    assert pod.requests.memory_bytes == memory_bytes
    assert pod.scalar_requests == scalar
    assert pod.requests.gpu == 0 and pod.requests.gpu_milli == 0


def test_pod_identity_fields() -> None:
    pod = ko.pod_from_api(_pod({"priority": 1000}, labels={"app": "web"}, creationTimestamp="2024-05-01T12:00:00Z"))
    assert pod.name == "shop/web"
    assert pod.tenant == "shop"
    assert pod.priority == 1000
    assert pod.labels == {"app": "web"}
    assert pod.creation_time_s == 1714564800.0  # 2024-05-01T12:00:00Z as a Unix timestamp


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"containers": [_container(cpu="lots")]}, "spec.containers[0].resources.requests.cpu",
                     id="container-cpu"),
        pytest.param({"containers": [_container(), _container("b", memory="-1Gi")]},
                     "spec.containers[1].resources.requests.memory", id="negative-memory"),
        pytest.param({"initContainers": [_container("i", ephemeral_storage="1 Gi")]},
                     "spec.initContainers[0].resources.requests.ephemeral-storage", id="init-storage"),
        pytest.param({"overhead": {"cpu": "x"}}, "spec.overhead.cpu", id="overhead"),
    ],
)
def test_bad_quantity_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ko.InvalidObjectError, match=field.replace("[", r"\[").replace("]", r"\]")):
        ko.pod_from_api(_pod(spec))


# ---------------------------------------------------------------------- placement constraints


def test_node_selector_tolerations_and_required_affinity_parsed() -> None:
    spec = {
        "nodeSelector": {"disktype": "ssd"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
            {"operator": "Exists"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300},
        ],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                  {"key": "gpu", "operator": "Exists"}]},
            {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["8"]}]},
        ]}}},
    }
    pod = ko.pod_from_api(_pod(spec))
    assert pod.node_selector == {"disktype": "ssd"}
    assert pod.tolerations == (
        Toleration(key="dedicated", operator="Equal", value="ml", effect=TaintEffect.NO_SCHEDULE),
        Toleration(key="", operator="Exists", value="", effect=None),
        Toleration(key="node.kubernetes.io/not-ready", operator="Exists", effect=TaintEffect.NO_EXECUTE),
    )
    assert pod.required_affinity == (
        NodeSelectorTerm(match_expressions=(NodeSelectorRequirement(key="zone", operator="In", values=("a", "b")),
                                            NodeSelectorRequirement(key="gpu", operator="Exists"))),
        NodeSelectorTerm(match_expressions=(NodeSelectorRequirement(key="cores", operator="Gt", values=("8",)),)),
    )


def test_match_fields_refused() -> None:
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}
    with pytest.raises(ko.InvalidObjectError, match="matchFields"):
        ko.pod_from_api(_pod(spec))


_TERM = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}


@pytest.mark.parametrize(
    ("spec", "feature"),
    [
        pytest.param({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_TERM]}}},
                     "pod affinity", id="pod-affinity"),
        pytest.param({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_TERM]}}},
                     "pod anti-affinity", id="pod-anti-affinity"),
        pytest.param({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                                                     "whenUnsatisfiable": "DoNotSchedule"}]},
                     "topology spread constraints", id="topology-spread"),
        pytest.param({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}},
            "preferred node affinity", id="preferred-node-affinity"),
        pytest.param({"containers": [_container(ports=[{"containerPort": 80, "hostPort": 8080}])]},
                     "host ports (container main)", id="host-port"),
        pytest.param({"initContainers": [_container("init", ports=[{"containerPort": 53, "hostPort": 53}])]},
                     "host ports (container init)", id="host-port-in-init-container"),
        pytest.param({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
                     "volume data (persistentVolumeClaim) that needs volume binding", id="pvc-volume"),
        pytest.param({"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]},
                     "volume scratch (ephemeral)", id="ephemeral-volume"),
        pytest.param({"schedulingGates": [{"name": "example.com/quota"}]}, "scheduling gates", id="scheduling-gates"),
        pytest.param({"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}]}, "dynamic resource claims",
                     id="resource-claims"),
    ],
)
def test_unsupported_feature_refused_by_name(spec: dict[str, Any], feature: str) -> None:
    with pytest.raises(ko.UnsupportedPodError) as info:
        ko.pod_from_api(_pod(spec))
    assert "shop/web" in str(info.value)
    assert feature in str(info.value)
    assert any(feature in f for f in info.value.features)
    # A pod bound already is read for what it takes, whatever it uses.
    assert ko.pod_from_api(_pod(spec), check_supported=False).name == "shop/web"


def test_every_unsupported_feature_listed_at_once() -> None:
    spec = {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_TERM]},
                         "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_TERM]}},
            "schedulingGates": [{"name": "g"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
    with pytest.raises(ko.UnsupportedPodError) as info:
        ko.pod_from_api(_pod(spec))
    assert len(info.value.features) == 4


def test_port_without_host_port_is_fine() -> None:
    spec = {"containers": [_container(ports=[{"containerPort": 80}])]}
    assert ko.unsupported_features(spec) == []


@pytest.mark.parametrize(
    "volume",
    [
        pytest.param({"name": "cfg", "configMap": {"name": "cfg"}}, id="configmap"),
        pytest.param({"name": "tls", "secret": {"secretName": "tls"}}, id="secret"),
        pytest.param({"name": "tmp", "emptyDir": {}}, id="emptydir"),
        pytest.param({"name": "token", "projected": {"sources": []}}, id="projected"),
        pytest.param({"name": "meta", "downwardAPI": {"items": []}}, id="downward-api"),
    ],
)
def test_plain_volumes_are_fine(volume: dict[str, Any]) -> None:
    assert ko.unsupported_features({"containers": [_container()], "volumes": [volume]}) == []
    assert ko.pod_from_api(_pod({"volumes": [volume]})).name == "shop/web"


def test_check_supported_false_drops_required_affinity() -> None:
    """A bound pod is read only for what it takes from its node: its constraints are not kept."""
    spec = {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_TERM]},
                         "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                             {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
            "containers": [_container(cpu="2")]}
    pod = ko.pod_from_api(_pod(spec), check_supported=False)
    assert pod.required_affinity == ()
    assert pod.requests.milli_cpu == 2000


# ---------------------------------------------------------------------- GPUs


@pytest.mark.parametrize(
    ("requests", "gpu", "gpu_milli"),
    [
        pytest.param({"nvidia.com/gpu": "2"}, 2, 0, id="whole-gpus"),
        pytest.param({"meridian.io/gpu-milli": "810"}, 0, 810, id="share"),
        pytest.param({"meridian.io/gpu-milli": "1000"}, 0, 1000, id="share-of-a-whole-device"),
    ],
)
def test_gpu_requests(requests: dict[str, str], gpu: int, gpu_milli: int) -> None:
    pod = ko.pod_from_api(_pod({"containers": [_container(cpu="1", **requests)]}))
    assert (pod.requests.gpu, pod.requests.gpu_milli) == (gpu, gpu_milli)
    # GPUs are resources of their own, not scalar columns.
    assert pod.scalar_requests == {"pods": 1}


@pytest.mark.parametrize(
    ("requests", "match"),
    [
        pytest.param({"nvidia.com/gpu": "1", "meridian.io/gpu-milli": "500"}, "both nvidia.com/gpu and", id="both"),
        pytest.param({"meridian.io/gpu-milli": "1001"}, "share of one device", id="share-over-one-device"),
    ],
)
def test_gpu_requests_rejected(requests: dict[str, str], match: str) -> None:
    with pytest.raises(ko.InvalidObjectError, match=match):
        ko.pod_from_api(_pod({"containers": [_container(**requests)]}))


def test_gpu_shares_summed_over_containers_are_rejected_past_one_device() -> None:
    # 600 + 600 = 1200 milli-GPU: more than one device, which a share cannot span.
    spec = {"containers": [_container("a", **{"meridian.io/gpu-milli": "600"}),
                           _container("b", **{"meridian.io/gpu-milli": "600"})]}
    with pytest.raises(ko.InvalidObjectError, match="got 1200"):
        ko.pod_from_api(_pod(spec))


@pytest.mark.parametrize(
    ("annotations", "devices"),
    [
        pytest.param({"meridian.io/gpu-devices": "0"}, (0,), id="one"),
        pytest.param({"meridian.io/gpu-devices": "2,3"}, (2, 3), id="two"),
        pytest.param({"meridian.io/gpu-devices": ""}, None, id="empty"),
        pytest.param({"meridian.io/gpu-devices": "0,x"}, None, id="garbage"),
        pytest.param({"other": "1"}, None, id="absent"),
        pytest.param(None, None, id="no-annotations"),
    ],
)
def test_gpu_devices_of(annotations: dict[str, str] | None, devices: tuple[int, ...] | None) -> None:
    assert ko.gpu_devices_of(_pod(annotations=annotations)) == devices


# ---------------------------------------------------------------------- nodes


def test_node_allocatable_and_scalar_resources() -> None:
    node = ko.node_from_api(_node(
        allocatable={"cpu": "7800m", "memory": "30Gi", "pods": "110", "ephemeral-storage": "100Gi",
                     "example.com/fpga": "2", "hugepages-2Mi": "0"},
        capacity={"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "120Gi",
                  "example.com/fpga": "2", "hugepages-2Mi": "0"},
        labels={"zone": "a"}))
    assert node.name == "n1"
    assert node.allocatable_resources.milli_cpu == 7800
    assert node.allocatable_resources.memory_bytes == 30 * GIB
    assert node.capacity.milli_cpu == 8000
    assert node.capacity.memory_bytes == 32 * GIB
    assert node.scalar_allocatable == {"pods": 110, "ephemeral-storage": 100 * GIB, "example.com/fpga": 2,
                                       "hugepages-2Mi": 0}
    assert node.labels == {"zone": "a"}
    assert node.taints == ()
    assert node.gpu_model == "" and node.gpus == () and node.allocatable_resources.gpu == 0


def test_node_capacity_stands_in_for_missing_allocatable() -> None:
    node = ko.node_from_api(_node(capacity={"cpu": "4", "memory": "8Gi", "pods": "10"}))
    assert node.allocatable_resources.milli_cpu == 4000
    assert node.scalar_allocatable == {"pods": 10}


@pytest.mark.parametrize(
    ("gpu_resources", "devices"),
    [
        pytest.param({"nvidia.com/gpu": "4"}, 4, id="whole-gpus"),
        pytest.param({"meridian.io/gpu-milli": "2000"}, 2, id="shares-only"),
        pytest.param({"nvidia.com/gpu": "2", "meridian.io/gpu-milli": "2000"}, 2, id="both-agree"),
        pytest.param({"nvidia.com/gpu": "1", "meridian.io/gpu-milli": "3000"}, 3, id="larger-wins"),
        pytest.param({}, 0, id="no-gpu"),
    ],
)
def test_node_gpu_devices(gpu_resources: dict[str, str], devices: int) -> None:
    resources = {"cpu": "32", "memory": "128Gi", "pods": "110", **gpu_resources}
    node = ko.node_from_api(_node(allocatable=resources, capacity=resources,
                                  labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}))
    assert node.allocatable_resources.gpu == devices
    assert node.capacity.gpu == devices
    assert [d.index for d in node.gpus] == list(range(devices))
    assert node.gpu_model == ("NVIDIA-A100-SXM4-80GB" if devices else "")
    # GPU resources are devices, not scalar columns.
    assert node.scalar_allocatable == {"pods": 110}


@pytest.mark.parametrize(
    ("spec", "taints"),
    [
        pytest.param({}, (), id="none"),
        pytest.param({"unschedulable": True},
                     (Taint(key="node.kubernetes.io/unschedulable", effect=TaintEffect.NO_SCHEDULE),),
                     id="cordoned"),
        pytest.param({"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                                 {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}],
                      "unschedulable": True},
                     (Taint(key="dedicated", value="ml", effect=TaintEffect.NO_SCHEDULE),
                      Taint(key="node.kubernetes.io/not-ready", effect=TaintEffect.NO_EXECUTE),
                      Taint(key="node.kubernetes.io/unschedulable", effect=TaintEffect.NO_SCHEDULE)),
                     id="taints-then-cordon"),
    ],
)
def test_node_taints(spec: dict[str, Any], taints: tuple[Taint, ...]) -> None:
    node = ko.node_from_api(_node(allocatable={"cpu": "1", "memory": "1Gi"}, spec=spec))
    assert node.taints == taints


def test_node_bad_quantity_names_node_and_field() -> None:
    with pytest.raises(ko.InvalidObjectError, match=r"node n1 status\.allocatable\.memory"):
        ko.node_from_api(_node(allocatable={"cpu": "1", "memory": "lots"}))
